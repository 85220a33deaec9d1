"""PyTorch references for sparse-SWA attention, written from the definition (docs/kernels.md, "Reference
semantics"), not from the kernel. They read the device tensors' values on the host, which is exactly what the
Triton path must never do.
"""

from __future__ import annotations

import torch

from rocm_dspark.attention.cache_formats import HEAD_DIM, gather_dequantized
from rocm_dspark.errors import UsageError


def _key_positions(pos: int, seq_len: int, query_len: int, window: int, causal: bool, replay: int) -> range:
    """Positions a token attends to in its own request (docs/kernels.md, "Per-token key set")."""
    if causal:
        return range(max(pos - window + 1, 0, replay), pos + 1)
    prefix = seq_len - query_len
    return range(max(prefix - window, 0), seq_len)  # trailing context window + the whole block


def _host_rows(cache: torch.Tensor, slots: list[int], kv_format: str, fnuz: bool, kv_scale) -> torch.Tensor:
    """Exact float32 rows of `cache` at `slots`, on the host."""
    index = torch.tensor(slots, dtype=torch.int64, device=cache.device)
    return gather_dequantized(cache, index, kv_format, fnuz=fnuz, kv_scale=kv_scale).cpu()


def reference_sparse_swa(
    q,
    kv_cache,
    query_start_loc,
    seq_lens,
    block_table,
    slot_mapping,
    *,
    window,
    block_size,
    kv_format,
    scale,
    causal=True,
    fnuz=False,
    kv_scale=None,
    sink=None,
    replay_start=None,
    topk_cache=None,
    topk_indices=None,
    topk_lens=None,
    topk_format=None,
    topk_fnuz=False,
    topk_kv_scale=None,
) -> torch.Tensor:
    """The test oracle, float32 [T, H, 512]: row t is attention for token t, zero for padding / invalid tokens.

    Plain per-request, per-token Python loops, exact dequantisation, float64 softmax. Arguments as for
    compute_swa_metadata + sparse_swa_attention, with the layout tensors given directly.
    """
    num_tokens, num_heads, _ = q.shape
    qsl = [int(x) for x in query_start_loc.cpu()]
    lens = [int(x) for x in seq_lens.cpu()]
    table = block_table.cpu().tolist()
    slots_of = slot_mapping.cpu().tolist()
    replay = replay_start.cpu().tolist() if replay_start is not None else [0] * len(lens)
    top_idx = topk_indices.cpu().tolist() if topk_indices is not None else None
    top_len = topk_lens.cpu().tolist() if topk_lens is not None else None
    out = torch.zeros(num_tokens, num_heads, HEAD_DIM, dtype=torch.float64)

    for r in range(len(lens)):
        q0, q1 = qsl[r], qsl[r + 1]
        for t in range(q0, min(q1, num_tokens)):
            if slots_of[t] < 0:
                continue  # trimmed or padded token: its row stays zero
            pos = lens[r] - (q1 - q0) + (t - q0)
            if pos < 0:
                raise UsageError(f"request {r}: seq_len {lens[r]} is shorter than its {q1 - q0} query tokens")
            positions = _key_positions(pos, lens[r], q1 - q0, window, causal, replay[r])
            pages = [(table[r][p // block_size], p % block_size) for p in positions]
            slots = [blk * block_size + offset for blk, offset in pages if blk >= 0]
            keys = [_host_rows(kv_cache, slots, kv_format, fnuz, kv_scale)]
            if top_idx is not None:
                n = len(top_idx[t]) if top_len is None else max(0, min(top_len[t], len(top_idx[t])))
                extra = [s for s in top_idx[t][:n] if s >= 0]
                keys.append(_host_rows(topk_cache, extra, topk_format or kv_format, topk_fnuz, topk_kv_scale))
            k = torch.nan_to_num(torch.cat(keys).double(), nan=0.0)  # never-written pages read as zero
            if k.shape[0] == 0:
                continue
            logits = q[t].cpu().double() @ k.T * scale  # [H, n]
            if sink is not None:
                logits = torch.cat([logits, sink[:num_heads].cpu().double()[:, None]], dim=1)
            probs = torch.softmax(logits, dim=1)[:, : k.shape[0]]  # the sink's value is zero
            out[t] = probs @ k
    return out.float()


def torch_sparse_swa(
    q,
    kv_cache,
    query_start_loc,
    seq_lens,
    block_table,
    slot_mapping,
    *,
    window,
    block_size,
    kv_format,
    scale,
    causal=True,
    fnuz=False,
    kv_scale=None,
    sink=None,
    replay_start=None,
    topk_cache=None,
    topk_indices=None,
    topk_lens=None,
    topk_format=None,
    topk_fnuz=False,
    topk_kv_scale=None,
) -> torch.Tensor:
    """The same definition vectorised (gather + masked softmax), float32 [T, H, 512]: the speed baseline of
    benchmarks/sparse_swa.py, itself checked against the loop reference."""
    device = q.device
    num_tokens = q.shape[0]
    t = torch.arange(num_tokens, device=device)
    qsl = query_start_loc.long()
    req = (torch.searchsorted(qsl, t, right=True) - 1).clamp(0, seq_lens.numel() - 1)
    q0, qlen = qsl[req], qsl[req + 1] - qsl[req]
    seq = seq_lens.long()[req]
    pos = seq - qlen + (t - q0)
    live = (t < qsl[-1]) & (slot_mapping[:num_tokens] >= 0)
    if causal:
        start = (pos - window + 1).clamp_min(0)
        if replay_start is not None:
            start = torch.maximum(start, replay_start.long()[req])
        end, width = pos + 1, window
    else:
        start, end = (seq - qlen - window).clamp_min(0), seq
        width = window + int((qsl[1:] - qsl[:-1]).max())  # host bound on the block length
    p = start[:, None] + torch.arange(width, device=device)[None, :]
    valid = live[:, None] & (p < end[:, None])
    page = torch.where(valid, p // block_size, 0)
    blk = block_table.long()[req[:, None], page]
    valid &= blk >= 0
    slots = torch.where(valid, blk * block_size + p % block_size, 0)
    keys = gather_dequantized(kv_cache, slots, kv_format, fnuz=fnuz, kv_scale=kv_scale)
    if topk_indices is not None:
        idx = topk_indices[:num_tokens].long()
        j = torch.arange(idx.shape[1], device=device)[None, :]
        x_valid = live[:, None] & (idx >= 0)
        if topk_lens is not None:
            x_valid &= j < topk_lens[:num_tokens].long()[:, None]
        x_keys = gather_dequantized(
            topk_cache, torch.where(x_valid, idx, 0), topk_format or kv_format, fnuz=topk_fnuz, kv_scale=topk_kv_scale
        )
        keys, valid = torch.cat([keys, x_keys], dim=1), torch.cat([valid, x_valid], dim=1)
    keys = torch.nan_to_num(keys, nan=0.0)
    logits = torch.einsum("thd,tnd->thn", q.float(), keys) * scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    if sink is not None:
        sink_col = sink[: q.shape[1]].float()[None, :, None].expand(num_tokens, -1, 1)
    else:
        sink_col = torch.full((num_tokens, q.shape[1], 1), float("-inf"), device=device)
    logits = torch.cat([logits, sink_col], dim=2)
    m = logits.amax(dim=2, keepdim=True).clamp_min(-3.0e38)  # rows with no key and no sink stay finite
    probs = torch.exp(logits - m)
    denom = probs.sum(dim=2, keepdim=True)
    probs = probs[..., :-1] / denom.clamp_min(1e-30)
    return torch.einsum("thn,tnd->thd", probs, keys)
