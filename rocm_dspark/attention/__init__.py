"""Sparse sliding-window (SWA) attention for DeepSeek-V4.1 with device-determined query lengths.

Why this exists: adaptive verification trims each request's DSpark draft on the GPU, so the
per-request query lengths live only in the device ``query_start_loc``; the host still believes
every request verifies 1+K tokens. A HIP/CUDA graph captured once is replayed with different
device layouts. So every per-request quantity is derived on the device into persistent buffers,
and the attention kernel works per token over a grid sized by the padded token count.

Importing this package is cheap (no torch, no triton); names load their submodule on first use.
One Triton source serves ROCm gfx942/gfx950 and CUDA. On CPU tensors the kernels run through the
Triton interpreter automatically, also in a process that imported triton in compile mode first
(vLLM does), without touching the environment; dot operands are then fp32, because the
interpreter's bf16 ``tl.dot`` is broken (triton-lang/triton#11584). The interpreter also stores
fp32 -> bf16 by truncation, so interpreted outputs are within 1 bf16 ulp of the fp32 result.

Public API (tensors are torch tensors on one device; "graph-constant" = fixed at capture time)
------------------------------------------------------------------------------------------------

Metadata (``rocm_dspark.attention.metadata``)::

    SwaMetadataBuffers.allocate(max_tokens: int, device) -> SwaMetadataBuffers
        Persistent int32 buffers of length max_tokens: req, pos, start, end, live.
        Allocate once per builder; addresses never change, so graphs can capture them.

    compute_swa_metadata(query_start_loc, seq_lens, block_table, slot_mapping, buffers, *,
                         window: int, block_size: int, causal: bool = True,
                         replay_start=None, num_tokens: int | None = None) -> SwaMetadata
        One Triton launch, no host synchronisation. query_start_loc [R_pad+1] int32,
        seq_lens [R_pad] int32, block_table [R_pad, nblk] int32, slot_mapping [>=T_pad] int
        (int32 or int64), replay_start [R_pad] int32 or None. Only graph-constant scalars are
        passed (T_pad = num_tokens, default slot_mapping.numel(); R_pad = seq_lens.numel()).
        Per token t < T_pad it writes the owning request (binary search on the device qsl;
        zero-length requests are skipped), its position, the key window [start, end) and
        liveness. Dead tokens (t >= qsl[R_pad], slot_mapping[t] < 0, or inconsistent lengths)
        get req=pos=-1, start=end=0, live=0. Window: causal [max(pos-W+1, 0, replay_start[r]),
        pos+1); non-causal (DSpark draft block) [max(L-qlen-W, 0), L).

    SwaMetadata: frozen dataclass (buffers, block_table, block_size, window, causal, num_tokens);
        .req/.pos/.start/.end/.live are views of the buffers cut to num_tokens.

Attention (``rocm_dspark.attention.kernel``)::

    sparse_swa_attention(q, kv_cache, metadata, *, kv_format: str, scale: float,
                         fnuz: bool = False, kv_scale=None, sink=None,
                         topk_cache=None, topk_indices=None, topk_lens=None,
                         topk_format: str | None = None, topk_fnuz: bool = False,
                         topk_kv_scale=None, out=None, block_h: int = 16,
                         block_k: int = 16, num_warps: int = 4) -> Tensor
        q [T_pad, H, 512] bf16 (448 NoPE + 64 RoPE), one row per token, T_pad = metadata.num_tokens.
        K == V == the cached 512-d latent row. One fp32 online softmax over the token's window,
        the optional top-k segment and the optional per-head sink (fp32 [>=H], a key with zero
        value). kv_format / topk_format: "bf16" ([nb, bs, 512] bfloat16), "fp8" ([nb, bs, 512]
        float8_e4m3fn or float8_e4m3fnuz, times the per-tensor kv_scale [1] fp32), "fp8_ds_mla"
        (uint8 [nb, bs, 584] V4 records, page stride = stride(0); fnuz selects FNUZ e4m3, else OCP).
        topk_indices [T_pad, TOPK] int32 are global slots in topk_cache (-1 = hole); topk_lens
        [T_pad] int32 (optional) limits each row to its first topk_lens[t] entries.
        out [T_pad, H, 512] bf16 (persistent if given): every row is written, dead rows are zero.
        Grid (T_pad, cdiv(H, block_h)); every load masked with clamped addresses.
        The inverse RoPE on dims 448..511 is NOT applied (the caller does it, as vLLM does).
        Defaults block_h=16, block_k=16, num_warps=4: the tile that compiles without register
        spills for gfx942, gfx950 and sm90 (compile statistics; not yet timed on MI300-class
        hardware). Compile every variant before capturing a graph (one eager call does it).

Reference and negative control::

    reference_sparse_swa(q, kv_cache, query_start_loc, seq_lens, block_table, slot_mapping, *,
                         window, block_size, kv_format, scale, causal=True, fnuz=False,
                         kv_scale=None, sink=None, replay_start=None, topk_cache=None,
                         topk_indices=None, topk_lens=None, topk_format=None, topk_fnuz=False,
                         topk_kv_scale=None) -> Tensor [T, H, 512] float32      (reference.py)
        Plain per-request/per-token Python loops over the definition (research/kernels.md
        section 3.4), exact dequantisation, float64 math; written without looking at the kernel.

    torch_sparse_swa(...)  same arguments, vectorised PyTorch (gather + masked softmax):
        the speed baseline of benchmarks/sparse_swa.py, itself checked against the loop reference.

    uniform_query_start_loc(num_reqs: int, query_len: int, num_reqs_padded: int | None = None)
        -> CPU int32 tensor: the layout the host believes (every request verifies 1+K tokens).

    host_planned_metadata(query_start_loc_cpu, seq_lens_cpu, block_table, buffers, *,
                          window, block_size, causal=True, num_tokens) -> SwaMetadata
        (host_plan.py) The negative control: plans request/position/window per token in Python
        from host lengths, as the refused upstream UNIFORM_BATCH builders do, and copies the
        plan into the same buffers. Correct only when device and host layouts agree.

KV-cache formats (``rocm_dspark.attention.cache_formats``)::

    KV_FORMATS = ("bf16", "fp8", "fp8_ds_mla")
    pack_kv_cache(rows [num_blocks*block_size, 512] float, kv_format, block_size, *, fnuz=False)
        -> (cache, kv_scale or None)   builds a cache holding `rows` at slot = row index
    dequantize_kv_cache(cache, kv_format, *, fnuz=False, kv_scale=None)
        -> float32 [num_blocks*block_size, 512], exact (UE8M0 scales are powers of two)

Traffic model (``rocm_dspark.attention.traffic``, pure Python)::

    traffic_bytes(query_lens, context_lens, *, heads, window, kv_format, topk=0, causal=True,
                  block_h=16, block_size=256) -> TrafficBytes(unique, issued)   (bytes per call)

Test and benchmark inputs (``rocm_dspark.attention.cases``)::

    make_case(query_lens, context_lens, *, heads=16, window=128, block_size=32, kv_format="bf16",
              fnuz=False, num_reqs_padded=None, num_tokens_padded=None, sink=False,
              replay_start=None, causal=True, topk=0, topk_format="fp8_ds_mla", ...) -> SwaCase
        A random padded verify batch as vLLM hands it over (zero-length padding requests,
        padded tail with slot_mapping -1, shuffled pages). SwaCase.metadata_args() /
        attention_args() / reference_args() give the keyword arguments of the calls above.

Compiler statistics without a GPU (``rocm_dspark.attention.aot``)::

    compile_report(arch, *, kv_format="fp8_ds_mla", fnuz=False, topk=True, sink=True,
                   block_h=16, block_k=16, num_warps=4) -> dict   (needs TRITON_INTERPRET=0)
        arch "gfx942" / "gfx950" / "sm_90": VGPRs, spills, LDS bytes, dot instructions.

Startup-probe self check (``rocm_dspark.attention.selfcheck``)::

    run_kernel_check(device="cpu", *, interpret_ok: bool) -> dict
        Runs our path on several device-trimmed layouts with one set of persistent buffers,
        compares with the reference, runs the host-planned negative control and reports whether
        it was caught (disagreed), and on a GPU captures one graph and replays it per layout.
        Keys: passed, reason, device, interpreted, layouts_checked, max_abs_err, tolerance
        ({rtol, atol}), negative_control_caught, negative_control_agrees_on_uniform,
        negative_control_err (its smallest error over the trimmed layouts), graph_replay,
        seconds; on a GPU also device_name and arch. Never raises: failures are in reason.
        interpreted=True results are not valid for gating (CPU interpreter, not the GPU code).
"""

from __future__ import annotations

import importlib

# name -> submodule that defines it; loaded on first attribute access (keeps import cheap).
_EXPORTS = {
    "SwaMetadataBuffers": "metadata",
    "SwaMetadata": "metadata",
    "compute_swa_metadata": "metadata",
    "sparse_swa_attention": "kernel",
    "reference_sparse_swa": "reference",
    "torch_sparse_swa": "reference",
    "host_planned_metadata": "host_plan",
    "uniform_query_start_loc": "host_plan",
    "KV_FORMATS": "cache_formats",
    "pack_kv_cache": "cache_formats",
    "dequantize_kv_cache": "cache_formats",
    "traffic_bytes": "traffic",
    "TrafficBytes": "traffic",
    "run_kernel_check": "selfcheck",
    "make_case": "cases",
    "compile_report": "aot",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
