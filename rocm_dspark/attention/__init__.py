"""Sparse sliding-window (SWA) attention for DeepSeek-V4.1 with device-determined query lengths.

Why this exists: adaptive verification trims each request's DSpark draft on the GPU, so the
per-request query lengths live only in the device ``query_start_loc``; the host still believes
every request verifies 1+K tokens. A HIP/CUDA graph captured once is replayed with different
device layouts. So every per-request quantity is derived on the device into persistent buffers,
and the attention kernel works per token over a grid sized by the padded token count.

Importing this package is cheap (no torch, no triton): import the submodule you need.
One Triton source serves ROCm gfx942/gfx950 and CUDA. On CPU tensors the kernels run through the
Triton interpreter automatically (_triton.py); dot operands are then fp32, because the
interpreter's bf16 ``tl.dot`` is broken (triton-lang/triton#11584). The interpreter also stores
fp32 -> bf16 by truncation, so interpreted outputs are within 1 bf16 ulp of the fp32 result.

Modules (each public function documents its own contract; tensors are torch tensors on one device,
"graph-constant" means fixed at capture time; the definition is docs/kernels.md):

  metadata.py       compute_swa_metadata: per-token request/position/window from the device query_start_loc
  kernel.py         sparse_swa_attention: the Triton attention over a token's window (+ top-k, + sink)
  reference.py      reference_sparse_swa (loops, float64) and torch_sparse_swa (vectorised): the oracles
  host_plan.py      host_planned_metadata: the negative control, planned from host lengths
  cache_formats.py  bf16 / fp8 / fp8_ds_mla caches: pack_kv_cache, gather_dequantized
  traffic.py        traffic_bytes: bytes one call must move (pure Python)
  cases.py          make_case: random padded verify batches for tests and benchmarks
  aot.py            compile_report: register/spill/LDS statistics for gfx942/gfx950/sm_90 without a GPU
  selfcheck.py      run_kernel_check: the startup probe's kernel level
"""
