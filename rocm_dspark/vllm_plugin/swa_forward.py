"""Run rocm-dspark's Triton sparse-SWA attention in vLLM's forward, where that is settled from source.

vLLM 0.30-0.32 runs SWA attention inside the layer, not through the backend:
`DeepseekV41ROCMAiterMLAAttention.forward_mqa` -> `_forward_decode` -> `rocm_sparse_attn_decode`.
We wrap `_forward_decode` (the narrowest method that receives q, the SWA cache and the metadata)
and run `rocm_dspark.attention.sparse_swa_attention` on the `SwaMetadata` our builder attached
(`rocm_dspark_swa`) only in the case every input is settled from vLLM 0.32.0's source:

* The cache: on ROCm `kv_mxfp8` is False (`_use_v41_mxfp8_kv_record` = SM100 only), so the SWA
  cache is the 584-byte V4 `fp8_ds_mla` record: per page `bs` data rows of 576 bytes (448 e4m3
  + 64 bf16) then `bs` scale rows of 8 bytes (7 UE8M0), page stride = stride(0). vLLM's reader
  (`_sparse_attn_decode_*_kernel`) indexes exactly those bytes; so does ours.
* FNUZ vs OCP: vLLM decodes the SWA cache with `current_platform.is_fp8_fnuz()` ("C++ encoder
  writes FNUZ on gfx942, OCP on gfx950"); we pass the same value. Whatever the writer does, we
  read the bytes as vLLM's own reader does.
* The sink: `attn_sink` is an fp32 [padded_heads] parameter; vLLM passes `attn_sink[:H]`.
* The return value: "how many leading rows the decode epilogue inverse-RoPE'd". Our kernel does
  not rotate, so we return 0 and `forward_mqa` applies `rocm_inverse_rope_rows_` to every row,
  exactly as it does after vLLM's aiter kernel (which also returns 0).

Everything else keeps vLLM's kernel (the original method), with the reason recorded:
compressed (top-k) layers (the indexer/compressed path is not replaced), the gfx950 MXFP8
epilogue (`output_mxfp8`: wo_a's quantized input; not checkable on CPU), vLLM's aiter sparse-MLA
kernel when selected, a batch without our metadata, or a cache/shape outside the record above.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

logger = logging.getLogger("rocm_dspark.vllm_plugin")

#: Attribute on our wrapper holding vLLM's method (idempotence and undo).
ORIGINAL = "rocm_dspark_original_forward_decode"
METHOD = "_forward_decode"

DS_MLA_RECORD, NOPE, ROPE, HEAD_DIM = 584, 448, 64, 512

OURS = "rocm-dspark's Triton sparse-SWA attention"
VLLMS = "vLLM's rocm_sparse_attn_decode"


@dataclass(frozen=True)
class ForwardChoice:
    ours: bool
    reason: str  # one line


# What runs, per case, as `plugin status` prints it (the rules of `choose`, in words).
FORWARD_CASES = (
    ("SWA-only layers, bf16 output (gfx942: MI300X/MI325X)", True,
     "584-byte fp8_ds_mla SWA record, FNUZ/OCP as vLLM's reader decides, attn_sink fp32, returns 0 rotated "
     "rows so forward_mqa inverse-RoPEs them: all read from vLLM 0.32.0's source; numerically checked on CPU "
     "against the PyTorch reference and vLLM's own reader kernel (interpreted); not yet run on MI300-class "
     "hardware"),
    ("SWA-only layers, MXFP8 output (gfx950: MI350X/MI355X)", False,
     "vLLM's reduce epilogue fuses inverse RoPE + MXFP8 quantisation for wo_a; not reproduced or checkable on "
     "CPU, so vLLM's kernel stays"),
    ("compressed (top-k) layers", False,
     "the indexer and compressed sparse-MLA path are not replaced; vLLM's kernel stays"),
    ("VLLM_ROCM_USE_AITER_TRITON_SPARSE_MLA on", False, "vLLM's aiter sparse-MLA kernel stays"),
)


def choose(*, swa_only: bool, output, output_mxfp8, use_aiter_sparse_mla: bool, swa_cache, swa, q,
           nope_head_dim: int, rope_head_dim: int) -> ForwardChoice:
    """First match wins; anything not settled from source keeps vLLM's kernel."""
    if not swa_only:
        return ForwardChoice(False, "compressed (top-k) layer: indexer/compressed path not replaced")
    if output_mxfp8 is not None:
        return ForwardChoice(False, "MXFP8 output epilogue (gfx950): not checkable on CPU")
    if use_aiter_sparse_mla:
        return ForwardChoice(False, "vLLM's aiter sparse-MLA kernel is selected")
    if swa is None:
        return ForwardChoice(False, "no rocm-dspark SwaMetadata on this batch (not built by our builder)")
    if (getattr(swa_cache, "dtype", None) is None or str(swa_cache.dtype) != "torch.uint8"
            or swa_cache.dim() != 3 or swa_cache.shape[2] != DS_MLA_RECORD):
        shape = tuple(getattr(swa_cache, "shape", ()))
        return ForwardChoice(False, f"SWA cache is not the 584-byte fp8_ds_mla record ({getattr(swa_cache, 'dtype', None)} {shape})")
    if (nope_head_dim, rope_head_dim) != (NOPE, ROPE) or q.dim() != 3 or q.shape[2] != HEAD_DIM:
        return ForwardChoice(False, f"head dims {nope_head_dim}+{rope_head_dim} / q {tuple(q.shape)} are not 448+64")
    if q.shape[0] != swa.num_tokens:
        return ForwardChoice(False, f"{q.shape[0]} decode rows but our metadata has {swa.num_tokens}")
    if output is None or output.shape != q.shape or str(output.dtype) != "torch.bfloat16":
        return ForwardChoice(False, "output is not a bf16 tensor shaped like q")
    return ForwardChoice(True, "SWA-only layer, 584-byte fp8_ds_mla cache, bf16 output")


def run_ours(layer, q, swa, output, *, fnuz: bool) -> int:
    """Our kernel into vLLM's output rows; returns 0 rotated rows (the caller inverse-RoPEs them)."""
    from rocm_dspark.attention import sparse_swa_attention

    sink = layer.attn_sink
    sparse_swa_attention(q, layer.swa_cache_layer.kv_cache, swa, kv_format="fp8_ds_mla", scale=float(layer.scale),
                         fnuz=fnuz, sink=None if sink is None else sink.data, out=output)
    return 0


class _Seen:
    """Which attention ran, by reason, in this process (logged once per reason; read by tests)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counts: dict[tuple[bool, str], int] = {}

    def record(self, choice: ForwardChoice) -> None:
        key = (choice.ours, choice.reason)
        with self._lock:
            first = key not in self.counts
            self.counts[key] = self.counts.get(key, 0) + 1
        if first:
            logger.info("rocm-dspark: decode attention: %s (%s)", OURS if choice.ours else VLLMS, choice.reason)


SEEN = _Seen()


def make_forward_decode(original, *, fnuz: bool):
    """`_forward_decode` for the layer class: ours where `choose` says so, else vLLM's `original`."""

    def _forward_decode(self, q, positions, kv_cache, swa_metadata, attn_metadata, swa_only, output,
                        output_mxfp8=None):
        swa = getattr(swa_metadata, "rocm_dspark_swa", None)
        choice = choose(swa_only=swa_only, output=output, output_mxfp8=output_mxfp8,
                        use_aiter_sparse_mla=bool(getattr(self, "_use_aiter_sparse_mla", False)),
                        swa_cache=self.swa_cache_layer.kv_cache, swa=swa, q=q,
                        nope_head_dim=self.nope_head_dim, rope_head_dim=self.rope_head_dim)
        SEEN.record(choice)
        if not choice.ours:
            return original(self, q=q, positions=positions, kv_cache=kv_cache, swa_metadata=swa_metadata,
                            attn_metadata=attn_metadata, swa_only=swa_only, output=output,
                            output_mxfp8=output_mxfp8)
        return run_ours(self, q, swa, output, fnuz=fnuz)

    _forward_decode.__doc__ = original.__doc__
    _forward_decode.__qualname__ = getattr(original, "__qualname__", METHOD)
    setattr(_forward_decode, ORIGINAL, original)
    return _forward_decode


def attention_plan(*, installed: bool, why_not: str | None = None, fnuz: bool | None = None) -> list[dict]:
    """Which decode attention runs per case ({case, runs: 'rocm-dspark'|'vLLM', reason}) for `plugin status`."""
    plan = []
    for case, ours, reason in FORWARD_CASES:
        if not installed:
            plan.append({"case": case, "runs": "vLLM", "reason": f"decode wrapper not installed: {why_not or 'not patched'}"})
            continue
        if ours and fnuz is not None:
            reason = f"{'FNUZ' if fnuz else 'OCP'} e4m3 on this platform; {reason}"
        plan.append({"case": case, "runs": "rocm-dspark" if ours else "vLLM", "reason": reason})
    return plan
