"""Synthetic sparse-SWA batches (inputs only) for tests, the probe's self check and the benchmark.

A case is a padded verify batch as vLLM would hand it to the backend under adaptive
verification: device `query_start_loc` with the real (trimmed) per-request lengths, zero-length
padding requests at the end, a padded token tail with slot_mapping = -1, `seq_lens` = cached +
query tokens, and block tables with shuffled, non-contiguous pages (unused entries point at
valid but unrelated pages, so a kernel that reads past a window gets wrong values, not zeros).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch

from rocm_dspark.attention.cache_formats import HEAD_DIM, pack_kv_cache
from rocm_dspark.errors import UsageError


@dataclass
class SwaCase:
    q: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    kv_cache: torch.Tensor
    kv_format: str
    window: int
    block_size: int
    scale: float
    causal: bool = True
    fnuz: bool = False
    kv_scale: torch.Tensor | None = None
    sink: torch.Tensor | None = None
    replay_start: torch.Tensor | None = None
    topk: dict = field(default_factory=dict)  # topk_cache/indices/lens/format/kv_scale

    @property
    def num_tokens(self) -> int:
        return self.q.shape[0]

    def metadata_args(self) -> dict:
        return dict(window=self.window, block_size=self.block_size, causal=self.causal, replay_start=self.replay_start)

    def attention_args(self) -> dict:
        return dict(
            kv_format=self.kv_format,
            scale=self.scale,
            fnuz=self.fnuz,
            kv_scale=self.kv_scale,
            sink=self.sink,
            **self.topk,
        )

    def reference_args(self) -> dict:
        return {**self.metadata_args(), **self.attention_args()}

    def to(self, device) -> SwaCase:
        """A copy of the case on `device`; fp8_ds_mla caches keep their padded page stride."""
        moved = {k: _to(v, device) for k, v in vars(self).items()}
        if self.kv_format == "fp8_ds_mla":
            moved["kv_cache"] = _strided_to(self.kv_cache, device)
        if self.topk.get("topk_format") == "fp8_ds_mla":
            moved["topk"]["topk_cache"] = _strided_to(self.topk["topk_cache"], device)
        return SwaCase(**moved)


def make_layout(
    query_lens,
    context_lens,
    *,
    num_reqs_padded,
    num_tokens_padded,
    block_size,
    num_blocks=None,
    table_width=None,
    invalid_tokens=(),
    seed=0,
    device="cpu",
) -> dict:
    """Device metadata tensors for one layout: qsl, seq_lens, block_table, slot_mapping."""
    if len(query_lens) != len(context_lens) or len(query_lens) > num_reqs_padded:
        raise UsageError("query_lens and context_lens need one entry per real request, at most num_reqs_padded")
    total = sum(query_lens)
    if total > num_tokens_padded:
        raise UsageError(f"{total} tokens do not fit in {num_tokens_padded} padded tokens")
    gen = torch.Generator().manual_seed(seed)
    seq = [c + q for c, q in zip(context_lens, query_lens)]
    pages = [math.ceil(s / block_size) for s in seq]
    width = table_width or max([1] + pages)
    need = sum(pages)
    num_blocks = num_blocks or need + 3
    if need > num_blocks or max([0] + pages) > width:
        raise UsageError(f"layout needs {need} pages (widest {max(pages)}), cache has {num_blocks} x width {width}")
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.randint(0, num_blocks, (num_reqs_padded, width), generator=gen, dtype=torch.int32)
    for r, n in enumerate(pages):
        table[r, :n] = torch.tensor(perm[:n], dtype=torch.int32)
        perm = perm[n:]
    qsl = [0, *itertools.accumulate(list(query_lens) + [0] * (num_reqs_padded - len(query_lens)))]
    slots = torch.full((num_tokens_padded,), -1, dtype=torch.int64)
    for r, qlen in enumerate(query_lens):
        for i in range(qlen):
            p = context_lens[r] + i
            slots[qsl[r] + i] = int(table[r, p // block_size]) * block_size + p % block_size
    for t in invalid_tokens:
        slots[t] = -1
    seq_lens = torch.tensor(seq + [0] * (num_reqs_padded - len(seq)), dtype=torch.int32)
    return dict(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=seq_lens.to(device),
        block_table=table.to(device),
        slot_mapping=slots.to(device),
    )


def make_case(
    query_lens,
    context_lens,
    *,
    heads=16,
    window=128,
    block_size=32,
    kv_format="bf16",
    fnuz=False,
    num_reqs_padded=None,
    num_tokens_padded=None,
    sink=False,
    replay_start=None,
    causal=True,
    topk=0,
    topk_format="fp8_ds_mla",
    invalid_tokens=(),
    extra_blocks=3,
    seed=0,
    device="cpu",
) -> SwaCase:
    """A random padded verify batch as vLLM hands it over: zero-length padding requests, a padded tail with
    slot_mapping -1, shuffled pages. Rows of q and of every cache are N(0,1) (bf16 / quantized as the format
    says). SwaCase.metadata_args() / attention_args() / reference_args() give the keyword arguments of
    compute_swa_metadata, sparse_swa_attention and reference_sparse_swa."""
    num_reqs_padded = num_reqs_padded or len(query_lens)
    num_tokens_padded = num_tokens_padded or max(1, sum(query_lens))
    num_blocks = sum(math.ceil((c + q) / block_size) for c, q in zip(context_lens, query_lens)) + extra_blocks
    layout = make_layout(
        query_lens,
        context_lens,
        num_reqs_padded=num_reqs_padded,
        num_tokens_padded=num_tokens_padded,
        block_size=block_size,
        num_blocks=num_blocks,
        invalid_tokens=invalid_tokens,
        seed=seed,
    )
    gen = torch.Generator().manual_seed(seed + 1)
    rows = torch.randn(num_blocks * block_size, HEAD_DIM, generator=gen)
    kv_cache, kv_scale = pack_kv_cache(rows, kv_format, block_size, fnuz=fnuz)
    q = torch.randn(num_tokens_padded, heads, HEAD_DIM, generator=gen).to(torch.bfloat16)
    case = SwaCase(
        q=q,
        kv_cache=kv_cache,
        kv_scale=kv_scale,
        kv_format=kv_format,
        fnuz=fnuz,
        window=window,
        block_size=block_size,
        scale=HEAD_DIM**-0.5,
        causal=causal,
        **layout,
    )
    if sink:
        logits = torch.randn(heads, generator=gen)
        logits[0] = float("-inf")  # vLLM initialises sinks to -inf: that must act as no sink
        case.sink = logits.float()
    if replay_start is not None:
        case.replay_start = torch.tensor(
            list(replay_start) + [0] * (num_reqs_padded - len(replay_start)), dtype=torch.int32
        )
    if topk:
        x_rows = 4 * block_size
        # OCP fp8, as the compressed cache is everywhere (docs/kernels.md, "KV cache layouts").
        x_cache, x_scale = pack_kv_cache(torch.randn(x_rows, HEAD_DIM, generator=gen), topk_format, block_size)
        idx = torch.randint(0, x_rows, (num_tokens_padded, topk), generator=gen, dtype=torch.int32)
        idx[torch.rand(idx.shape, generator=gen) < 0.2] = -1  # holes, as the indexer pads with -1
        lens = torch.randint(0, topk + 1, (num_tokens_padded,), generator=gen, dtype=torch.int32)
        case.topk = dict(
            topk_cache=x_cache, topk_indices=idx, topk_lens=lens, topk_format=topk_format, topk_kv_scale=x_scale
        )
    return case.to(device) if device != "cpu" else case


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _strided_to(cache: torch.Tensor, device) -> torch.Tensor:
    flat = torch.as_strided(cache, (cache.shape[0] * cache.stride(0),), (1,)).to(device)
    return flat.as_strided(cache.shape, cache.stride())
