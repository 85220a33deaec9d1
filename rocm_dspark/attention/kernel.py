"""Ragged sparse-SWA attention in Triton: one query row per token, device-determined windows.

Each program takes one token and up to BLOCK_H heads (MQA: the heads share every key tile),
reads the token's request and window [start, end) from the metadata buffers, gathers key rows
through the block table BLOCK_K at a time, then the optional top-k compressed segment, with one
fp32 online softmax (log2 domain) over both plus an optional per-head sink. K == V == the
512-d latent row (448 NoPE + 64 RoPE), kept as two dot operands because 448 is no power of two.
The grid is (padded tokens, head blocks); loop bounds are device values, so one compiled kernel
and one captured graph serve every layout. Dead tokens run zero iterations and store zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rocm_dspark.attention import _triton
from rocm_dspark.attention.cache_formats import DS_MLA_RECORD, HEAD_DIM, KV_FORMATS, check_format
from rocm_dspark.attention.metadata import SwaMetadata
from rocm_dspark.errors import UsageError

_FORMAT_CODE = {name: code for code, name in enumerate(KV_FORMATS)}  # bf16=0, fp8=1, fp8_ds_mla=2
_LOG2E = 1.4426950408889634


@triton.jit
def _load_key_tile(
    cache_ptr,
    stride_blk,
    stride_off,
    num_blocks,
    block_size,
    scale_ptr,
    blk,
    off,
    valid,
    FMT: tl.constexpr,
    FNUZ: tl.constexpr,
    DOT_F32: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Dequantized key rows for one tile: (NoPE [BLOCK_K, 512] with lanes >= 448 zero, RoPE [BLOCK_K, 64])."""
    dn = tl.arange(0, 512)
    dr = tl.arange(0, 64)
    valid = valid & (blk >= 0) & (blk < num_blocks)
    # Clamp masked lanes to slot 0 so no address is ever computed out of bounds.
    blk = tl.where(valid, blk, 0).to(tl.int64)
    off = tl.where(valid, off, 0).to(tl.int64)
    nope_mask = valid[:, None] & (dn < 448)[None, :]
    # Dequantize in the dot dtype: bf16 on a GPU (exact for fp8 x power of two), fp32 in the interpreter.
    if DOT_F32:
        cdt = tl.float32
    else:
        cdt = tl.bfloat16
    if FMT == 2:
        # fp8_ds_mla V4 record: data row of 576 bytes at blk*page + off*576, scale row of 8 bytes
        # after the page's block_size data rows.
        row = blk * stride_blk + off * 576
        raw = tl.load(cache_ptr + row[:, None] + dn[None, :], mask=nope_mask, other=0)
        if FNUZ:
            nope = raw.to(tl.float8e4b8, bitcast=True).to(cdt)
        else:
            nope = raw.to(tl.float8e4nv, bitcast=True).to(cdt)
        srow = blk * stride_blk + block_size * 576 + off * 8
        # One UE8M0 byte per 64 NoPE dims; byte e means 2**(e-127): put it in the fp32 exponent (exact).
        ue8m0 = tl.load(cache_ptr + srow[:, None] + (dn // 64)[None, :], mask=nope_mask, other=127)
        nope = nope * (ue8m0.to(tl.int32) << 23).to(tl.float32, bitcast=True).to(cdt)
        rope_ptr = (cache_ptr + row + 448).to(tl.pointer_type(tl.bfloat16))
        rope = tl.load(rope_ptr[:, None] + dr[None, :], mask=valid[:, None], other=0.0).to(cdt)
    else:
        row = blk * stride_blk + off * stride_off
        nope = tl.load(cache_ptr + row[:, None] + dn[None, :], mask=nope_mask, other=0.0)
        rope = tl.load(cache_ptr + row[:, None] + 448 + dr[None, :], mask=valid[:, None], other=0.0)
        if FMT == 1:
            kv_scale = tl.load(scale_ptr)
            nope = (nope.to(tl.float32) * kv_scale).to(cdt)
            rope = (rope.to(tl.float32) * kv_scale).to(cdt)
        else:
            nope = nope.to(cdt)
            rope = rope.to(cdt)
    # Pages allocated but never written can hold NaN; vLLM reads them as zero.
    nope = tl.where(nope == nope, nope, 0.0)
    rope = tl.where(rope == rope, rope, 0.0)
    return nope, rope, valid


@triton.jit
def _online_softmax_step(
    q_nope, q_rope, k_nope, k_rope, valid, m_i, l_i, acc_nope, acc_rope, qk_scale_log2, DOT_F32: tl.constexpr
):
    """Fold one key tile into the running (max, sum, accumulators), all fp32, log2 domain."""
    s = tl.dot(q_nope, tl.trans(k_nope)) + tl.dot(q_rope, tl.trans(k_rope))
    s = tl.where(valid[None, :], s * qk_scale_log2, -3.0e38)  # finite: no inf - inf
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.where(valid[None, :], tl.exp2(s - m_new[:, None]), 0.0)
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_F32:
        p_dot = p
    else:
        p_dot = p.to(tl.bfloat16)  # as vLLM and aiter do; the source of the bf16 tolerance
    acc_nope = acc_nope * alpha[:, None] + tl.dot(p_dot, k_nope)
    acc_rope = acc_rope * alpha[:, None] + tl.dot(p_dot, k_rope)
    return m_new, l_i, acc_nope, acc_rope


@triton.jit
def _sparse_swa_kernel(
    q_ptr,
    stride_qt,
    stride_qh,
    out_ptr,
    stride_ot,
    stride_oh,
    kv_ptr,
    kv_stride_blk,
    kv_stride_off,
    kv_num_blocks,
    kv_scale_ptr,
    req_ptr,
    start_ptr,
    end_ptr,
    live_ptr,
    bt_ptr,
    bt_stride,
    bt_width,
    block_size,
    x_ptr,
    x_stride_blk,
    x_stride_off,
    x_num_blocks,
    x_block_size,
    x_scale_ptr,
    xidx_ptr,
    xidx_stride,
    xlens_ptr,
    topk_width,
    sink_ptr,
    num_heads,
    qk_scale_log2,
    KV_FMT: tl.constexpr,
    KV_FNUZ: tl.constexpr,
    X_FMT: tl.constexpr,
    X_FNUZ: tl.constexpr,
    HAS_TOPK: tl.constexpr,
    HAS_TOPK_LENS: tl.constexpr,
    HAS_SINK: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_mask = heads < num_heads
    dn = tl.arange(0, 512)
    dr = tl.arange(0, 64)
    kk = tl.arange(0, BLOCK_K)

    live = tl.load(live_ptr + t) != 0
    req = tl.maximum(tl.load(req_ptr + t), 0).to(tl.int64)
    start = tl.load(start_ptr + t)
    end = tl.load(end_ptr + t)  # == start for dead tokens: the window loop runs zero times

    q_rows = q_ptr + t * stride_qt + heads[:, None].to(tl.int64) * stride_qh
    # Dead tokens read nothing (a scalar bool & block trips the interpreter).
    q_mask = heads < tl.where(live, num_heads, 0)
    q_nope = tl.load(q_rows + dn[None, :], mask=q_mask[:, None] & (dn < 448)[None, :], other=0.0)
    q_rope = tl.load(q_rows + 448 + dr[None, :], mask=q_mask[:, None], other=0.0)
    if DOT_F32:
        q_nope = q_nope.to(tl.float32)
        q_rope = q_rope.to(tl.float32)

    m_i = tl.full([BLOCK_H], -3.0e38, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc_nope = tl.zeros([BLOCK_H, 512], tl.float32)
    acc_rope = tl.zeros([BLOCK_H, 64], tl.float32)

    # Segment 1: the sliding window, positions mapped through the request's block table.
    for k0 in range(start, end, BLOCK_K):
        p = k0 + kk
        page = p // block_size
        valid = (p < end) & (page < bt_width)
        page = tl.where(valid, page, 0)
        blk = tl.load(bt_ptr + req * bt_stride + page, mask=valid, other=-1)
        k_nope, k_rope, valid = _load_key_tile(
            kv_ptr,
            kv_stride_blk,
            kv_stride_off,
            kv_num_blocks,
            block_size,
            kv_scale_ptr,
            blk,
            p % block_size,
            valid,
            KV_FMT,
            KV_FNUZ,
            DOT_F32,
            BLOCK_K,
        )
        m_i, l_i, acc_nope, acc_rope = _online_softmax_step(
            q_nope, q_rope, k_nope, k_rope, valid, m_i, l_i, acc_nope, acc_rope, qk_scale_log2, DOT_F32
        )

    # Segment 2: top-k compressed rows (global slots, -1 = hole), same softmax.
    if HAS_TOPK:
        if HAS_TOPK_LENS:
            n_topk = tl.minimum(tl.maximum(tl.load(xlens_ptr + t), 0), topk_width)
        else:
            n_topk = topk_width
        n_topk = tl.where(live, n_topk, 0)
        for j0 in range(0, n_topk, BLOCK_K):
            j = j0 + kk
            valid = j < n_topk
            slot = tl.load(xidx_ptr + t * xidx_stride + tl.where(valid, j, 0), mask=valid, other=-1)
            valid = valid & (slot >= 0)
            slot = tl.where(valid, slot, 0)
            k_nope, k_rope, valid = _load_key_tile(
                x_ptr,
                x_stride_blk,
                x_stride_off,
                x_num_blocks,
                x_block_size,
                x_scale_ptr,
                slot // x_block_size,
                slot % x_block_size,
                valid,
                X_FMT,
                X_FNUZ,
                DOT_F32,
                BLOCK_K,
            )
            m_i, l_i, acc_nope, acc_rope = _online_softmax_step(
                q_nope, q_rope, k_nope, k_rope, valid, m_i, l_i, acc_nope, acc_rope, qk_scale_log2, DOT_F32
            )

    # Epilogue: the sink is a key with zero value, so it only adds to the denominator.
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads, mask=head_mask, other=float("-inf")) * 1.4426950408889634
        m_f = tl.maximum(m_i, sink)
        l_f = l_i * tl.exp2(m_i - m_f) + tl.exp2(sink - m_f)
        corr = tl.exp2(m_i - m_f) / tl.maximum(l_f, 1e-30)
    else:
        corr = 1.0 / tl.maximum(l_i, 1e-30)  # l == 0 only with acc == 0: a zero row
    out_rows = out_ptr + t * stride_ot + heads[:, None].to(tl.int64) * stride_oh
    out_ty = out_ptr.dtype.element_ty
    tl.store(
        out_rows + dn[None, :], (acc_nope * corr[:, None]).to(out_ty), mask=head_mask[:, None] & (dn < 448)[None, :]
    )
    tl.store(out_rows + 448 + dr[None, :], (acc_rope * corr[:, None]).to(out_ty), mask=head_mask[:, None])


def _check_cache(name: str, cache, fmt: str, fnuz: bool, kv_scale, device) -> None:
    check_format(fmt)
    if not isinstance(cache, torch.Tensor) or cache.device != device:
        raise UsageError(f"{name} must be a tensor on {device}")
    if fmt == "fp8_ds_mla":
        if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != DS_MLA_RECORD:
            raise UsageError(
                f"{name} in fp8_ds_mla must be uint8 [num_blocks, block_size, {DS_MLA_RECORD}], got {cache.dtype} {tuple(cache.shape)}"
            )
        if cache.stride(0) < cache.shape[1] * DS_MLA_RECORD or cache.stride(0) % 2:
            raise UsageError(
                f"{name} page stride {cache.stride(0)} is too small or odd for block_size {cache.shape[1]}: build it with pack_kv_cache"
            )
        return
    want = {"bf16": (torch.bfloat16,), "fp8": (torch.float8_e4m3fn, torch.float8_e4m3fnuz)}[fmt]
    if cache.dtype not in want or cache.dim() != 3 or cache.shape[2] != HEAD_DIM or cache.stride(2) != 1:
        raise UsageError(
            f"{name} in {fmt} must be {want[0]} [num_blocks, block_size, {HEAD_DIM}] with unit last stride, got {cache.dtype} {tuple(cache.shape)}"
        )
    if fmt == "fp8":
        if (cache.dtype == torch.float8_e4m3fnuz) != bool(fnuz):
            raise UsageError(
                f"{name} dtype {cache.dtype} disagrees with fnuz={fnuz}: pass fnuz=True exactly for float8_e4m3fnuz"
            )
        scale_ok = isinstance(kv_scale, torch.Tensor) and kv_scale.numel() == 1 and kv_scale.dtype == torch.float32
        if not scale_ok or kv_scale.device != device:
            raise UsageError(f"{name} in fp8 needs its per-tensor scale as a one-element float32 tensor on {device}")


def sparse_swa_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: SwaMetadata,
    *,
    kv_format: str,
    scale: float,
    fnuz: bool = False,
    kv_scale: torch.Tensor | None = None,
    sink: torch.Tensor | None = None,
    topk_cache: torch.Tensor | None = None,
    topk_indices: torch.Tensor | None = None,
    topk_lens: torch.Tensor | None = None,
    topk_format: str | None = None,
    topk_fnuz: bool = False,
    topk_kv_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    block_h: int = 16,
    block_k: int = 16,
    num_warps: int = 4,
) -> torch.Tensor:
    """Attention output [T_pad, H, 512] (bf16), one row per token, T_pad = metadata.num_tokens.

    q [T_pad, H, 512] bf16 (448 NoPE + 64 RoPE); sink fp32 [>= H]. kv_format / topk_format: the layouts of
    cache_formats.py ("fp8" with its per-tensor kv_scale [1] fp32; `fnuz` selects FNUZ e4m3, else OCP).
    topk_indices [T_pad, TOPK] int32 are global slots in topk_cache (-1 = hole); topk_lens [T_pad] int32, if
    given, limits row t to its first topk_lens[t] entries. `out` [T_pad, H, 512] bf16 (persistent if given):
    every row is written, dead rows are zero. The inverse RoPE on dims 448..511 is NOT applied (the caller
    does it, as vLLM does).

    Defaults block_h = 16, block_k = 16, num_warps = 4: the tile that compiles without register spills for
    gfx942, gfx950 and sm90 (aot.compile_report; not yet timed on MI300-class hardware). Compile every
    variant before capturing a graph (one eager call does it).
    """
    if not isinstance(metadata, SwaMetadata):
        raise UsageError("metadata must come from compute_swa_metadata or host_planned_metadata")
    device = metadata.buffers.req.device
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.shape[2] != HEAD_DIM or q.dtype != torch.bfloat16:
        raise UsageError(
            f"q must be bfloat16 [tokens, heads, {HEAD_DIM}], got {getattr(q, 'dtype', type(q))} {tuple(getattr(q, 'shape', ()))}"
        )
    if q.device != device or q.stride(2) != 1:
        raise UsageError(f"q must be on {device} (the metadata's device) with a unit last stride")
    num_tokens, num_heads = q.shape[0], q.shape[1]
    if num_tokens != metadata.num_tokens:
        raise UsageError(
            f"q has {num_tokens} rows but the metadata was built for {metadata.num_tokens} padded tokens: build both for the same padded batch"
        )
    _check_cache("kv_cache", kv_cache, kv_format, fnuz, kv_scale, device)
    if kv_cache.shape[1] != metadata.block_size:
        raise UsageError(f"kv_cache block size {kv_cache.shape[1]} != metadata block_size {metadata.block_size}")
    if block_h < 1 or block_h & (block_h - 1) or block_k < 16 or block_k & (block_k - 1):
        raise UsageError(f"block_h ({block_h}) must be a power of two and block_k ({block_k}) a power of two >= 16")
    if sink is not None and (
        sink.dtype != torch.float32 or sink.dim() != 1 or sink.numel() < num_heads or sink.device != device
    ):
        raise UsageError(f"sink must be float32 [>= {num_heads}] on {device} (one logit per head)")

    has_topk = topk_indices is not None
    if has_topk:
        topk_format = topk_format or kv_format
        if topk_cache is None:
            raise UsageError("topk_indices given without topk_cache: pass the compressed cache the indices point into")
        _check_cache("topk_cache", topk_cache, topk_format, topk_fnuz, topk_kv_scale, device)
        if (
            topk_indices.dtype != torch.int32
            or topk_indices.dim() != 2
            or topk_indices.shape[0] < num_tokens
            or topk_indices.stride(1) != 1
        ):
            raise UsageError(
                f"topk_indices must be int32 [>= {num_tokens}, TOPK] with unit last stride (global slots, -1 = none)"
            )
        if topk_lens is not None and (topk_lens.dtype != torch.int32 or topk_lens.numel() < num_tokens):
            raise UsageError(f"topk_lens must be int32 [>= {num_tokens}]")
    elif topk_cache is not None or topk_lens is not None:
        raise UsageError("topk_cache/topk_lens given without topk_indices: pass all three or none")

    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != torch.bfloat16 or out.device != device or out.stride(2) != 1:
        raise UsageError(f"out must be bfloat16 {tuple(q.shape)} on {device} with a unit last stride")

    bt = metadata.block_table
    dummy = metadata.buffers.live  # a valid pointer for arguments a constexpr switches off
    x_cache = topk_cache if has_topk else kv_cache
    grid = (num_tokens, triton.cdiv(num_heads, block_h))
    _triton.launch(
        _sparse_swa_kernel,
        grid,
        device,
        q,
        q.stride(0),
        q.stride(1),
        out,
        out.stride(0),
        out.stride(1),
        kv_cache,
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.shape[0],
        kv_scale if kv_scale is not None else dummy,
        metadata.buffers.req,
        metadata.buffers.start,
        metadata.buffers.end,
        metadata.buffers.live,
        bt,
        bt.stride(0),
        bt.shape[1],
        metadata.block_size,
        x_cache,
        x_cache.stride(0),
        x_cache.stride(1),
        x_cache.shape[0],
        x_cache.shape[1],
        topk_kv_scale if topk_kv_scale is not None else dummy,
        topk_indices if has_topk else dummy,
        topk_indices.stride(0) if has_topk else 0,
        topk_lens if topk_lens is not None else dummy,
        topk_indices.shape[1] if has_topk else 0,
        sink if sink is not None else dummy,
        num_heads,
        float(scale) * _LOG2E,
        KV_FMT=_FORMAT_CODE[kv_format],
        KV_FNUZ=bool(fnuz),
        X_FMT=_FORMAT_CODE[topk_format] if has_topk else 0,
        X_FNUZ=bool(topk_fnuz),
        HAS_TOPK=has_topk,
        HAS_TOPK_LENS=topk_lens is not None,
        HAS_SINK=sink is not None,
        BLOCK_H=block_h,
        BLOCK_K=block_k,
        DOT_F32=_triton.interpreted(device),
        num_warps=num_warps,
    )
    return out
