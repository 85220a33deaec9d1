"""Sparse-SWA Triton kernel against the independent PyTorch loop reference (docs/kernels.md, "Reference semantics").

Runs in the Triton interpreter on CPU (compiled kernels on a GPU, if the suite runs on one).

Tolerance, per element |out - ref| <= atol + rtol * |ref|, against a float64 reference:
- Interpreter: the kernel upcasts dot operands to fp32 (the interpreter's bf16 tl.dot is broken,
  triton-lang/triton#11584), so the only real rounding is the final fp32 -> bf16 store, which the
  triton 3.9 interpreter does by truncation (measured: it ignores round-to-nearest). That is
  < 1 bf16 ulp <= 2**-7 |x|, plus fp32 accumulation error (~1e-6): rtol = 2**-7, atol = 1e-5.
- Compiled GPU kernel: K and P are bf16 dot operands (P rounding, section 3.3): 2e-2 / 2e-2.
Dead rows must be exactly zero in both cases.
"""

from __future__ import annotations

import pytest
import torch

from rocm_dspark.attention.kernel import sparse_swa_attention
from rocm_dspark.attention.metadata import SwaMetadataBuffers, compute_swa_metadata
from rocm_dspark.attention.reference import reference_sparse_swa, torch_sparse_swa
from rocm_dspark.attention._triton import interpreted
from rocm_dspark.attention.cases import make_case
from rocm_dspark.errors import UsageError

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(rtol=2.0**-7, atol=1e-5) if interpreted(DEVICE) else dict(rtol=2e-2, atol=2e-2)


def run_kernel(case, **kwargs):
    buffers = SwaMetadataBuffers.allocate(case.num_tokens + 3, case.q.device)
    md = compute_swa_metadata(case.query_start_loc, case.seq_lens, case.block_table, case.slot_mapping, buffers,
                              num_tokens=case.num_tokens, **case.metadata_args())
    out = torch.full_like(case.q, float("nan"))  # garbage: every row must be written
    return sparse_swa_attention(case.q, case.kv_cache, md, out=out, **case.attention_args(), **kwargs), md


def reference(case):
    return reference_sparse_swa(case.q, case.kv_cache, case.query_start_loc, case.seq_lens, case.block_table,
                                case.slot_mapping, **case.reference_args())


def assert_matches(out, ref, md):
    live = md.buffers.live[: md.num_tokens]
    out = out.float().cpu()
    assert torch.isfinite(out).all(), "a row was left unwritten (NaN garbage survived)"
    excess = (out - ref).abs() - (TOL["atol"] + TOL["rtol"] * ref.abs())
    assert excess.max() <= 0, f"max |err| {(out - ref).abs().max():.3g} beyond tolerance"
    dead = ~live.bool().cpu()
    assert (out[dead] == 0).all(), "dead (padded / invalid) rows must be exactly zero"
    assert ref[live.bool().cpu()].abs().amax() > 0.05, "degenerate case: live rows are ~0"


# (id, make_case kwargs). Contexts are chosen around the window: below, equal (ctx + qlen == W),
# above, and long enough to cross several pages; qlens cover 0..6 with zero-length requests.
CASES = [
    ("h8-bf16-short-equal-long", dict(query_lens=[1, 0, 6, 3, 0], context_lens=[0, 0, 26, 100, 0], heads=8,
                                      num_reqs_padded=7, num_tokens_padded=14)),
    ("h16-fp8-ocp-sink", dict(query_lens=[2, 4, 5], context_lens=[30, 200, 7], heads=16, kv_format="fp8", sink=True)),
    ("h20-fp8-fnuz-topk-bf16-replay", dict(query_lens=[6, 1], context_lens=[90, 40], heads=20, kv_format="fp8",
                                           fnuz=True, topk=24, topk_format="bf16", sink=True, replay_start=[70, 12],
                                           num_tokens_padded=9)),
    ("h16-dsmla-ocp-topk-pad", dict(query_lens=[0, 3, 6, 1, 0], context_lens=[0, 33, 64, 300, 0], heads=16,
                                    kv_format="fp8_ds_mla", topk=40, sink=True, num_reqs_padded=6, num_tokens_padded=12)),
    ("h16-dsmla-fnuz-swa-ocp-topk-replay", dict(query_lens=[4, 2], context_lens=[150, 20], heads=16,
                                                kv_format="fp8_ds_mla", fnuz=True, topk=32, topk_format="fp8_ds_mla",
                                                sink=True, replay_start=[130, 5])),
    ("h8-dsmla-noncausal-draft-block", dict(query_lens=[6, 6, 6], context_lens=[3, 32, 90], heads=8,
                                            kv_format="fp8_ds_mla", causal=False, sink=True)),
    ("h20-bf16-noncausal-topk-ignores-replay", dict(query_lens=[5, 0, 2], context_lens=[40, 0, 0], heads=20,
                                                    causal=False, topk=16, topk_format="fp8_ds_mla",
                                                    replay_start=[30, 0, 0], num_tokens_padded=10)),
    ("h16-qlens-0-to-6", dict(query_lens=[0, 1, 2, 3, 4, 5, 6], context_lens=[0, 31, 32, 29, 28, 100, 1], heads=16,
                              kv_format="fp8_ds_mla", num_tokens_padded=24, num_reqs_padded=8)),
    ("h8-invalid-tokens-inside-requests", dict(query_lens=[3, 4], context_lens=[10, 50], heads=8,
                                               invalid_tokens=(1, 5), sink=True)),
    ("h16-all-padding", dict(query_lens=[], context_lens=[], heads=16, num_reqs_padded=3, num_tokens_padded=4,
                             sink=True, topk=16)),
]


@pytest.mark.parametrize("case_id, spec", CASES, ids=[c[0] for c in CASES])
def test_kernel_matches_reference(case_id, spec):
    spec = dict(spec)
    case = make_case(spec.pop("query_lens"), spec.pop("context_lens"), window=32, block_size=16, seed=len(case_id),
                     device=DEVICE, **spec)
    out, md = run_kernel(case)
    ref = reference(case)
    if case_id == "h16-all-padding":
        assert (out == 0).all() and (ref == 0).all()
        return
    assert_matches(out, ref, md)


def test_production_geometry_window_128_block_32():
    # DeepSeek-V4.1-Flash: W=128, SWA block 32, TP4 -> 16 heads, fp8_ds_mla FNUZ SWA cache (gfx942)
    # + OCP top-k segment + sink; contexts below, at and beyond the window.
    case = make_case([6, 3, 1, 5], [300, 125, 127, 10], heads=16, window=128, block_size=32,
                     kv_format="fp8_ds_mla", fnuz=True, topk=48, topk_format="fp8_ds_mla", sink=True,
                     num_reqs_padded=5, num_tokens_padded=18, seed=3, device=DEVICE)
    out, md = run_kernel(case, block_k=32)
    assert_matches(out, reference(case), md)


def test_topk_without_lens_uses_every_column_and_skips_holes():
    case = make_case([2, 3], [40, 9], heads=8, window=32, block_size=16, topk=20, topk_format="bf16", seed=5,
                     device=DEVICE)
    case.topk["topk_lens"] = None
    out, md = run_kernel(case)
    assert_matches(out, reference(case), md)


def test_missing_pages_and_nan_rows_read_as_zero():
    # A window page freed (-1 in the block table) is skipped; a NaN in a gathered row counts as 0,
    # as vLLM does for pages allocated but never written.
    case = make_case([2, 2], [60, 20], heads=8, window=32, block_size=16, seed=9, device=DEVICE)
    case.block_table[0, 2] = -1  # positions 32..47 of request 0: inside its window
    slot = int(case.block_table[1, 1]) * 16 + 3  # position 19 of request 1: inside its window
    case.kv_cache.view(-1, 512)[slot, 5] = float("nan")
    out, md = run_kernel(case)
    ref = reference(case)
    assert torch.isfinite(ref).all()
    assert_matches(out, ref, md)


@pytest.mark.parametrize("block_h, block_k", [(16, 32), (32, 64), (16, 128)])
def test_tile_sizes_agree(block_h, block_k):
    case = make_case([5, 1], [70, 3], heads=20, window=32, block_size=16, kv_format="fp8_ds_mla", topk=40,
                     sink=True, seed=13, device=DEVICE)
    out, md = run_kernel(case, block_h=block_h, block_k=block_k)
    assert_matches(out, reference(case), md)


def test_vectorised_torch_baseline_matches_loop_reference():
    # The benchmark's speed baseline must compute the same thing as the test oracle.
    for causal in (True, False):
        case = make_case([6, 0, 2, 4], [100, 0, 5, 31], heads=16, window=32, block_size=16, kv_format="fp8_ds_mla",
                         fnuz=True, topk=24, sink=True, causal=causal, replay_start=[80, 0, 2, 9],
                         num_reqs_padded=5, num_tokens_padded=15, seed=21)
        vec = torch_sparse_swa(case.q, case.kv_cache, case.query_start_loc, case.seq_lens, case.block_table,
                               case.slot_mapping, **case.reference_args())
        torch.testing.assert_close(vec, reference(case), rtol=1e-5, atol=1e-5)


def test_reference_is_not_trivially_the_kernel():
    # Sanity of the oracle: a different window changes the answer, so agreement above means something.
    case = make_case([3], [100], heads=8, window=32, block_size=16, seed=2)
    ref = reference(case)
    case.window = 16
    assert (reference(case) - ref).abs().max() > 0.05


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c, kw: kw.update(q=c.q.float()), "q must be bfloat16"),
        (lambda c, kw: kw.update(q=c.q[:-1]), "padded tokens"),
        (lambda c, kw: kw.update(kv_format="int4"), "unknown kv_format"),
        (lambda c, kw: kw.update(kv_format="fp8_ds_mla"), "fp8_ds_mla must be uint8"),
        (lambda c, kw: kw.update(sink=torch.zeros(2)), "sink must be float32"),
        (lambda c, kw: kw.update(topk_indices=torch.zeros(c.num_tokens, 4, dtype=torch.int32)), "without topk_cache"),
        (lambda c, kw: kw.update(topk_lens=torch.zeros(c.num_tokens, dtype=torch.int32)), "without topk_indices"),
        (lambda c, kw: kw.update(block_k=8), "block_k"),
        (lambda c, kw: kw.update(out=torch.zeros(1, 1, 512, dtype=torch.bfloat16)), "out must be bfloat16"),
    ],
)
def test_bad_input_is_a_usage_error(change, message):
    case = make_case([2], [5], heads=4, window=8, block_size=16)
    md = compute_swa_metadata(case.query_start_loc, case.seq_lens, case.block_table, case.slot_mapping,
                              SwaMetadataBuffers.allocate(4, "cpu"), **case.metadata_args())
    kwargs = dict(q=case.q, kv_format="bf16", scale=case.scale)
    change(case, kwargs)
    with pytest.raises(UsageError, match=message):
        sparse_swa_attention(kwargs.pop("q"), case.kv_cache, md, **kwargs)


def test_fp8_needs_its_scale():
    case = make_case([2], [5], heads=4, window=8, block_size=16, kv_format="fp8")
    md = compute_swa_metadata(case.query_start_loc, case.seq_lens, case.block_table, case.slot_mapping,
                              SwaMetadataBuffers.allocate(4, "cpu"), **case.metadata_args())
    with pytest.raises(UsageError, match="per-tensor scale"):
        sparse_swa_attention(case.q, case.kv_cache, md, kv_format="fp8", scale=case.scale)
    with pytest.raises(UsageError, match="fnuz"):
        sparse_swa_attention(case.q, case.kv_cache, md, kv_format="fp8", fnuz=True, kv_scale=case.kv_scale,
                             scale=case.scale)
