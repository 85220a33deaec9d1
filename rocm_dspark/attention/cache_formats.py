"""KV-cache formats of the sparse-SWA path (docs/kernels.md, "KV cache layouts"): build caches for tests,
read rows back exactly.

"bf16" and "fp8" (OCP or FNUZ e4m3, times one per-tensor fp32 scale) are [num_blocks, bs, 512]. The V4
"fp8_ds_mla" record is seen as uint8 [num_blocks, bs, 584] whose stride(0) is the padded page size; readers
index bytes by hand from stride(0), as vLLM does. The decoding here is the reference side: it uses torch's
own fp8 dtypes, independent of the Triton kernel's bitcast path.
"""

from __future__ import annotations

import math

import torch

from rocm_dspark.errors import UsageError

KV_FORMATS = ("bf16", "fp8", "fp8_ds_mla")
HEAD_DIM, NOPE, ROPE = 512, 448, 64
DS_MLA_DATA_BYTES = NOPE + 2 * ROPE  # 576
DS_MLA_SCALE_BYTES = 8  # 7 UE8M0 exponents + 1 pad
DS_MLA_RECORD = DS_MLA_DATA_BYTES + DS_MLA_SCALE_BYTES  # 584
DS_MLA_GROUP = 64  # NoPE dims per UE8M0 scale
FP8_MAX = {False: 448.0, True: 240.0}  # OCP e4m3fn, FNUZ e4m3fnuz


def fp8_dtype(fnuz: bool) -> torch.dtype:
    return torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn


def check_format(kv_format: str) -> None:
    if kv_format not in KV_FORMATS:
        raise UsageError(f"unknown kv_format {kv_format!r}: use one of {', '.join(KV_FORMATS)}")


def pack_kv_cache(rows: torch.Tensor, kv_format: str, block_size: int, *, fnuz: bool = False):
    """A cache whose slot `i` holds `rows[i]` in `kv_format`; returns (cache, kv_scale or None)."""
    check_format(kv_format)
    if rows.dim() != 2 or rows.shape[1] != HEAD_DIM or rows.shape[0] % block_size:
        raise UsageError(f"rows must be [num_blocks*{block_size}, {HEAD_DIM}], got {tuple(rows.shape)}")
    num_blocks = rows.shape[0] // block_size
    rows = rows.float()
    if kv_format == "bf16":
        return rows.to(torch.bfloat16).view(num_blocks, block_size, HEAD_DIM).contiguous(), None
    if kv_format == "fp8":
        # Per-tensor scale: the largest magnitude maps to the fp8 maximum.
        scale = rows.abs().amax().clamp_min(1e-4) / FP8_MAX[fnuz]
        data = (rows / scale).clamp(-FP8_MAX[fnuz], FP8_MAX[fnuz]).to(fp8_dtype(fnuz))
        return data.view(num_blocks, block_size, HEAD_DIM).contiguous(), scale.reshape(1).float()
    return _pack_ds_mla(rows, num_blocks, block_size, fnuz)


def _pack_ds_mla(rows: torch.Tensor, num_blocks: int, block_size: int, fnuz: bool):
    # A page holds the data rows then the scale rows, padded to a multiple of the 576-byte data row.
    page = math.ceil(block_size * DS_MLA_RECORD / DS_MLA_DATA_BYTES) * DS_MLA_DATA_BYTES
    pages = torch.zeros(num_blocks, page, dtype=torch.uint8, device=rows.device)
    nope = rows[:, :NOPE].reshape(-1, NOPE // DS_MLA_GROUP, DS_MLA_GROUP)
    amax = nope.abs().amax(dim=2).clamp_min(1e-4)
    # UE8M0: the smallest power of two that brings the group's amax within the fp8 range.
    exponent = torch.ceil(torch.log2(amax / FP8_MAX[fnuz])).clamp(-127, 128)
    q = (nope / torch.exp2(exponent)[..., None]).clamp(-FP8_MAX[fnuz], FP8_MAX[fnuz])
    q_bytes = q.reshape(-1, NOPE).to(fp8_dtype(fnuz)).view(torch.uint8)
    rope_bytes = rows[:, NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)  # [n, 128]
    scale_bytes = torch.zeros(rows.shape[0], DS_MLA_SCALE_BYTES, dtype=torch.uint8, device=rows.device)
    scale_bytes[:, : NOPE // DS_MLA_GROUP] = (exponent + 127).to(torch.uint8)
    data_end = block_size * DS_MLA_DATA_BYTES
    pages[:, :data_end] = torch.cat([q_bytes, rope_bytes], dim=1).view(num_blocks, data_end)
    pages[:, data_end : block_size * DS_MLA_RECORD] = scale_bytes.view(num_blocks, -1)
    return pages.as_strided((num_blocks, block_size, DS_MLA_RECORD), (page, DS_MLA_RECORD, 1)), None


def gather_dequantized(
    cache: torch.Tensor, slots: torch.Tensor, kv_format: str, *, fnuz: bool = False, kv_scale=None
) -> torch.Tensor:
    """Exact float32 rows for the given slots (any shape S -> S + [512]); slot = blk*bs + offset.

    Only the gathered records are decoded, so a large cache is never expanded whole.
    """
    check_format(kv_format)
    block_size = cache.shape[1]
    slots = slots.to(torch.int64)
    blk, off = slots // block_size, slots % block_size
    if kv_format == "bf16":
        return cache[blk, off].float()
    if kv_format == "fp8":
        if kv_scale is None:
            raise UsageError("kv_format 'fp8' needs kv_scale (a one-element fp32 tensor)")
        return cache[blk, off].float() * kv_scale.float().reshape(())
    page = cache.stride(0)
    flat = torch.as_strided(cache, (cache.shape[0] * page,), (1,))
    data_at = (blk * page + off * DS_MLA_DATA_BYTES).unsqueeze(-1)
    data = flat[data_at + torch.arange(DS_MLA_DATA_BYTES, device=cache.device)]
    scale_at = (blk * page + block_size * DS_MLA_DATA_BYTES + off * DS_MLA_SCALE_BYTES).unsqueeze(-1)
    exponents = flat[scale_at + torch.arange(NOPE // DS_MLA_GROUP, device=cache.device)].float()
    nope = data[..., :NOPE].contiguous().view(fp8_dtype(fnuz)).float()
    nope = nope.unflatten(-1, (NOPE // DS_MLA_GROUP, DS_MLA_GROUP)) * torch.exp2(exponents - 127.0).unsqueeze(-1)
    rope = data[..., NOPE:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope.flatten(-2), rope], dim=-1)
