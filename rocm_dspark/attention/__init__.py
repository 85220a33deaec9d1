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

Modules (each public function documents its own contract; tensors are torch tensors on one device,
"graph-constant" means fixed at capture time; the definition is docs/kernels.md):

  metadata.py       compute_swa_metadata: per-token request/position/window from the device query_start_loc
  kernel.py         sparse_swa_attention: the Triton attention over a token's window (+ top-k, + sink)
  reference.py      reference_sparse_swa (loops, float64) and torch_sparse_swa (vectorised): the oracles
  host_plan.py      host_planned_metadata: the negative control, planned from host lengths
  cache_formats.py  bf16 / fp8 / fp8_ds_mla caches: pack_kv_cache, dequantize_kv_cache
  traffic.py        traffic_bytes: bytes one call must move (pure Python)
  cases.py          make_case: random padded verify batches for tests and benchmarks
  aot.py            compile_report: register/spill/LDS statistics for gfx942/gfx950/sm_90 without a GPU
  selfcheck.py      run_kernel_check: the startup probe's kernel level
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
