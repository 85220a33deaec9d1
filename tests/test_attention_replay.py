"""Same-buffers replay and the host-planned negative control.

A captured graph holds fixed addresses and a fixed grid; only the contents of the device
tensors change between replays. On CPU we reproduce exactly that: one set of persistent
inputs, metadata buffers and output, one padded token count, successive device layouts written
in place, stale garbage left in every buffer. Each replay must match the reference, and rows of
dead tokens must be exactly zero. (Real graph capture needs a GPU: see selfcheck / benchmark.)

The negative control plans from what the host believes (every request verifies 1+K tokens, or
vLLM's even spread of the draft budget). It must agree with the reference when the device
layout equals the host's (so the control itself is sound) and disagree on trimmed layouts.

Tolerance: as in test_attention_kernel.py (interpreter: fp32 dots then a truncating bf16
store, < 1 bf16 ulp: rtol 2**-7, atol 1e-5; compiled GPU kernel: bf16 P/K operands, 2e-2).
"""

from __future__ import annotations

import torch

from rocm_dspark.attention._triton import interpreted
from rocm_dspark.attention.cases import make_case, make_layout
from rocm_dspark.attention.host_plan import host_planned_metadata, uniform_query_start_loc
from rocm_dspark.attention.kernel import sparse_swa_attention
from rocm_dspark.attention.metadata import SwaMetadataBuffers, compute_swa_metadata
from rocm_dspark.attention.reference import reference_sparse_swa

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(rtol=2.0**-7, atol=1e-5) if interpreted(DEVICE) else dict(rtol=2e-2, atol=2e-2)
K = 5  # DSpark draft tokens: the host believes every verify request has 1+K = 6 tokens
CONTEXTS = [7, 40, 100, 0]
NUM_TOKENS = 4 * (1 + K)


def excess(out, ref):
    """Largest |out - ref| beyond the tolerance band (<= 0 means within tolerance)."""
    return float(((out.float().cpu() - ref).abs() - TOL["atol"] - TOL["rtol"] * ref.abs()).max())


def persistent_setup():
    base = make_case([1 + K] * 4, CONTEXTS, heads=16, window=32, block_size=16, kv_format="fp8_ds_mla", sink=True,
                     topk=24, topk_format="fp8_ds_mla", extra_blocks=6, seed=7, device=DEVICE)
    static = {k: getattr(base, k).clone() for k in ("query_start_loc", "seq_lens", "block_table", "slot_mapping")}
    return base, static, SwaMetadataBuffers.allocate(NUM_TOKENS, DEVICE), torch.empty_like(base.q)


def write_layout(base, static, qlens, seed):
    layout = make_layout(qlens, CONTEXTS[: len(qlens)], num_reqs_padded=4, num_tokens_padded=NUM_TOKENS,
                         block_size=base.block_size, num_blocks=base.kv_cache.shape[0],
                         table_width=static["block_table"].shape[1], seed=seed, device=DEVICE)
    for key, dst in static.items():
        dst.copy_(layout[key])


def replay(base, static, buffers, out):
    md = compute_swa_metadata(static["query_start_loc"], static["seq_lens"], static["block_table"],
                              static["slot_mapping"], buffers, num_tokens=NUM_TOKENS, **base.metadata_args())
    sparse_swa_attention(base.q, base.kv_cache, md, out=out, **base.attention_args())
    return md


def reference(base, static):
    return reference_sparse_swa(base.q, base.kv_cache, static["query_start_loc"], static["seq_lens"],
                                static["block_table"], static["slot_mapping"], **base.reference_args())


def test_same_buffers_replay_over_changing_device_layouts():
    base, static, buffers, out = persistent_setup()
    layouts = [
        [6, 6, 6, 6],  # what the host believes
        [3, 1, 6, 2],  # trimmed on device
        [1, 6, 2, 5],
        [2, 1, 1, 0],  # fewer live tokens: the last request became padding, long padded tail
        [1],  # one live token; three padding requests
        [],  # nothing live at all
    ]
    out_addr, buffer_addr = out.data_ptr(), buffers.req.data_ptr()
    for i, qlens in enumerate(layouts):
        write_layout(base, static, qlens, seed=50 + i)
        out.fill_(float("nan"))  # garbage a previous replay could have left
        for b in (buffers.req, buffers.pos, buffers.start, buffers.end, buffers.live):
            b.copy_(torch.randint(-9, 300, b.shape, dtype=torch.int32))
        md = replay(base, static, buffers, out)
        ref = reference(base, static)
        live = md.buffers.live[:NUM_TOKENS].bool().cpu()
        assert int(live.sum()) == sum(qlens), f"layout {qlens}: live tokens"
        assert torch.isfinite(out.float()).all(), f"layout {qlens}: a row kept its garbage"
        assert (out.float().cpu()[~live] == 0).all(), f"layout {qlens}: dead rows must be zero"
        assert excess(out, ref) <= 0, f"layout {qlens}: differs from the reference"
    assert (out.data_ptr(), buffers.req.data_ptr()) == (out_addr, buffer_addr)  # nothing reallocated


def host_control(base, static, host_qsl, host_seq_lens):
    buffers = SwaMetadataBuffers.allocate(NUM_TOKENS, DEVICE)
    md = host_planned_metadata(host_qsl, host_seq_lens, static["block_table"], buffers, window=base.window,
                               block_size=base.block_size, num_tokens=NUM_TOKENS)
    return sparse_swa_attention(base.q, base.kv_cache, md, **base.attention_args())


def host_beliefs(total_tokens):
    """(qsl, seq_lens) the host holds: uniform 1+K, and vLLM's even spread of the exact total."""
    uniform = (uniform_query_start_loc(4, 1 + K), torch.tensor([c + 1 + K for c in CONTEXTS], dtype=torch.int32))
    per, extra = divmod(total_tokens, 4)
    spread = [per + (r < extra) for r in range(4)]
    qsl = torch.tensor([sum(spread[:r]) for r in range(5)], dtype=torch.int32)
    even = (qsl, torch.tensor([c + n for c, n in zip(CONTEXTS, spread)], dtype=torch.int32))
    return {"uniform 1+K": uniform, "even spread": even}


def test_negative_control_agrees_when_host_and_device_layouts_agree():
    base, static, buffers, out = persistent_setup()
    write_layout(base, static, [6, 6, 6, 6], seed=1)
    ref = reference(base, static)
    host_qsl, host_lens = host_beliefs(24)["uniform 1+K"]
    assert excess(host_control(base, static, host_qsl, host_lens), ref) <= 0
    replay(base, static, buffers, out)
    assert excess(out, ref) <= 0


def test_negative_control_is_wrong_on_trimmed_layouts_and_ours_is_right():
    base, static, buffers, out = persistent_setup()
    # Each differs from both host beliefs (an even spread equal to the device layout would be right).
    for i, qlens in enumerate([[3, 1, 6, 2], [5, 6, 1, 6], [1, 2, 1, 1]]):
        write_layout(base, static, qlens, seed=80 + i)
        ref = reference(base, static)
        replay(base, static, buffers, out)
        assert excess(out, ref) <= 0, f"device-planned path wrong on {qlens}"
        for belief, (host_qsl, host_lens) in host_beliefs(sum(qlens)).items():
            control = host_control(base, static, host_qsl, host_lens)
            assert excess(control, ref) > 0.05, f"host plan ({belief}) should be wrong on device layout {qlens}"
