"""Our per-token SWA windows -> the layout vLLM's ROCm SWA decode reads (dense rows + CSR).

vLLM's ROCm sparse-attention decode (`rocm_sparse_attn_decode`) reads, for each decode token, a dense
row of global KV slot ids (`decode_swa_indices [Nd, width]`, -1 padded), its length
(`decode_swa_lens`), and the same ids packed as CSR (`decode_swa_ragged_indices`,
`decode_swa_ragged_indptr`). vLLM builds those from its own kernels; here they are derived from
`rocm_dspark.attention.SwaMetadata` (per-token request/position/window from the *device*
`query_start_loc`), written into the builder's persistent buffers so FULL graphs keep stable
addresses. No host synchronisation: two Triton launches and one `torch.cumsum`.

Semantics copied from vLLM 0.32.0 (`_compute_swa_indices_and_lens_kernel`,
`build_ragged_indices_from_dense`): a live token's row holds `block_table[req, p // bs] * bs + p % bs`
for p in [start, end), then -1; its length is end - start; the CSR keeps only the entries >= 0.
Dead tokens (padding, slot_mapping < 0) get length 0 and a row of -1.
"""

from __future__ import annotations

import torch

import triton
import triton.language as tl

# launch() runs compiled Triton on a GPU and the interpreter for CPU tensors (tests, CPU hosts).
from rocm_dspark.attention import _triton


@triton.jit
def _dense_rows_kernel(
    req_ptr, start_ptr, end_ptr, live_ptr,
    block_table_ptr, block_table_stride, block_size,
    dense_ptr, dense_stride, lens_ptr, counts_ptr, indptr_ptr,
    WIDTH: tl.constexpr, BLOCK_W: tl.constexpr,
):
    t = tl.program_id(0)
    if t == 0:
        tl.store(indptr_ptr, 0)  # the cumsum fills indptr[1:]
    live = tl.load(live_ptr + t) != 0
    req = tl.where(live, tl.load(req_ptr + t), 0)  # a safe row address for dead tokens
    start = tl.load(start_ptr + t)
    length = tl.where(live, tl.load(end_ptr + t) - start, 0)

    j = tl.arange(0, BLOCK_W)
    p = start + j
    in_window = (j < length) & (j < WIDTH)
    block = tl.load(block_table_ptr + req * block_table_stride + p // block_size, mask=in_window, other=0)
    slot = block * block_size + p % block_size
    tl.store(dense_ptr + t * dense_stride + j, tl.where(in_window, slot, -1), mask=j < WIDTH)
    tl.store(lens_ptr + t, length)
    # The CSR drops negative slots, as vLLM's compaction does (a freed block reads as < 0).
    tl.store(counts_ptr + t, tl.sum((in_window & (slot >= 0)).to(tl.int32), axis=0))


@triton.jit
def _ragged_kernel(
    dense_ptr, dense_stride, lens_ptr, indptr_ptr, ragged_ptr,
    WIDTH: tl.constexpr, BLOCK_W: tl.constexpr,
):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_W)
    length = tl.load(lens_ptr + t)
    vals = tl.load(dense_ptr + t * dense_stride + j, mask=j < WIDTH, other=-1)
    keep = (j < WIDTH) & (j < length) & (vals >= 0)
    rank = tl.cumsum(keep.to(tl.int32), axis=0) - 1
    tl.store(ragged_ptr + tl.load(indptr_ptr + t) + rank, vals, mask=keep)


def write_vllm_swa_rows(
    swa,
    *,
    num_rows: int,
    width: int,
    dense: torch.Tensor,
    lens: torch.Tensor,
    counts: torch.Tensor,
    indptr: torch.Tensor,
    ragged: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill vLLM's decode SWA layout for the first `num_rows` tokens of `swa` (a SwaMetadata).

    dense [>=num_rows, width] int32 (row stride may exceed width), lens/counts [>=num_rows] int32,
    indptr [>=num_rows+1] int32, ragged [>=num_rows*width] int32: persistent buffers, written in
    place. Returns the (ragged, indptr) views vLLM's metadata carries: ragged cut to
    max(num_rows*width, 1) entries (its capacity; indptr bounds the reads), indptr to num_rows+1.
    """
    if num_rows < 1 or num_rows > swa.num_tokens:
        raise ValueError(f"num_rows={num_rows} must be in 1..{swa.num_tokens} (the metadata's token count)")
    if dense.dim() != 2 or dense.shape[1] < width or dense.stride(1) != 1:
        raise ValueError(f"dense must be [rows, >= {width}] with unit column stride, got {tuple(dense.shape)}")
    if ragged.numel() < num_rows * width or indptr.numel() < num_rows + 1:
        raise ValueError("ragged/indptr buffers are too small for num_rows * width entries")
    block_w = triton.next_power_of_2(width)
    bt = swa.block_table
    _triton.launch(
        _dense_rows_kernel, (num_rows,), dense.device,
        swa.req, swa.start, swa.end, swa.live,
        bt, bt.stride(0), swa.block_size,
        dense, dense.stride(0), lens, counts, indptr,
        WIDTH=width, BLOCK_W=block_w,
    )
    torch.cumsum(counts[:num_rows], dim=0, out=indptr[1 : num_rows + 1])
    _triton.launch(
        _ragged_kernel, (num_rows,), dense.device,
        dense, dense.stride(0), lens, indptr, ragged,
        WIDTH=width, BLOCK_W=block_w,
    )
    return ragged[: max(num_rows * width, 1)], indptr[: num_rows + 1]
