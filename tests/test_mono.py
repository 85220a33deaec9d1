"""The mono decode layer (--monokernel) in plans: a table of GPU x TP x concurrency x K x build x DP/EP through
the real resolver, the row bound exactly and one request over, and the CLI's done-when commands.

The rows are vLLM 0.33.0's: its mono_decode.py says that with 5 drafts "vLLM captures FULL CUDA graphs of 6,
12, 18, 24, 36 and 42 rows, so a step of 5 requests runs padded to 36 rows" (the reference for step_rows).
Not shown here: that the kernels run on MI300-class GPUs (not yet run on such hardware)."""

from __future__ import annotations

import json

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.mono import step_rows
from rocm_dspark.recipe.resolve import Selection, resolve
from tests.conftest import cli_env
from tests.helpers import run_cli

CAT = load_catalog()


def _plan(gpu, **kw):
    return resolve(CAT, Selection(model="V4.1-Flash", gpu=gpu, **kw))


def _mono_notes(plan):
    return [n for n in plan.notes if n.topic == "mono decode"]


# gpu, selection, mono on?, a fragment of the one note
CASES = [
    ("mi355x", dict(concurrency=4), True, "ON (--monokernel): steps of <= 8 requests at K=5"),
    ("mi355x", dict(concurrency=8, tp=2), True, "(48 rows <= 48"),                 # the row bound exactly
    ("mi355x", dict(concurrency=9), False, "9 requests x (1+K=6) = 54 tokens, padded to 60 rows > 48"),  # one request over
    ("mi355x", dict(concurrency=1), True, "(6 rows <= 48"),
    ("mi355x", dict(concurrency=64), False, "64 requests x (1+K=6) = 384 rows > 48"),
    ("mi355x", dict(concurrency=4, tp=8), False, "TP 8 (the gfx950 kernels take TP 2/4): --strategy replicas --replicas 2"),
    ("mi355x", dict(concurrency=4, dp=2), False, "data parallel 2 (the kernels take tensor parallelism only"),
    ("mi355x", dict(concurrency=4, ep=4), False, "expert parallel (the kernels take tensor parallelism only"),
    ("mi355x", dict(concurrency=4, vllm_version="0.32.0"), False, "v0.32.0 lacks vllm#60397"),
    ("mi355x", dict(concurrency=4, build="nightly-rocm100-ac9126e5"), False, "is not shown to contain vllm#60397"),
    ("mi355x", dict(), False, "no --concurrency (up to 8 requests at K=5 fit 48 rows"),
    ("mi355x", dict(concurrency=12, num_speculative_tokens=3), True, "(48 rows <= 48"),    # K=3: 12 x 4
    ("mi355x", dict(concurrency=13, num_speculative_tokens=3), False, "13 requests x (1+K=4) = 52 tokens, padded to 56 rows > 48"),
    ("mi355x", dict(concurrency=16, num_speculative_tokens=2), True, "(48 rows <= 48"),
    ("mi355x", dict(concurrency=17, num_speculative_tokens=2), False, "= 51 tokens, padded to 57 rows > 48"),
    # K=4: 9 requests are 45 tokens, under 48, but the step runs padded to the captured 50
    ("mi355x", dict(concurrency=9, num_speculative_tokens=4), False, "= 45 tokens, padded to 50 rows > 48"),
    ("mi355x", dict(concurrency=48, no_speculation=True), True, "(48 rows <= 48"),
    ("mi355x", dict(concurrency=49, no_speculation=True), False, "49 requests x (1+K=1) = 49 tokens, padded to 56 rows > 48"),
    ("mi355x", dict(concurrency=4, k_schedule=((1, 8, 5), (9, 128, 3))), False, "--k-per-batch-size"),
    ("mi355x", dict(concurrency=4, extra_env=(("VLLM_ROCM_USE_AITER_MOE_A4W4_DSV4", "1"),)), False,
     "--env VLLM_ROCM_USE_AITER_MOE_A4W4_DSV4 (the kernels need it unset)"),
    ("mi350x", dict(concurrency=2), True, "ON (--monokernel)"),
    ("mi300x", dict(concurrency=4, tp=4), True, "ON (--monokernel): steps of <= 7 requests at K=5"),
    ("mi300x", dict(concurrency=7, tp=4), True, "(42 rows <= 42"),                  # the gfx942 bound exactly
    ("mi300x", dict(concurrency=8, tp=4), False, "8 requests x (1+K=6) = 48 rows > 42"),
    ("mi300x", dict(concurrency=4), False, "TP 8 (the gfx942 kernels take TP 4): --strategy replicas --replicas 2"),
    ("mi300x", dict(concurrency=4, tp=2, memory_override=True), False, "TP 2 (the gfx942 kernels take TP 4)"),
    ("mi300x", dict(concurrency=4, tp=4, dp=2), False, "data parallel 2"),
    ("mi300x", dict(concurrency=4, tp=4, max_num_batched_tokens=8192), False,
     "gfx942 weight copies (56.1 GiB per rank) leave KV -21.5 GiB"),
    ("mi325x", dict(concurrency=7, tp=4), True, "ON (--monokernel)"),
    ("mi325x", dict(concurrency=4, tp=4, vllm_version="0.32.0"), False, "v0.32.0 lacks vllm#60397"),
]


@pytest.mark.parametrize("gpu,kw,on,fragment", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_mono_on_or_off_with_exactly_one_note(gpu, kw, on, fragment):
    plan = _plan(gpu, **kw)
    notes = _mono_notes(plan)
    assert len(notes) == 1, [n.topic for n in plan.notes]
    shown = notes[0].short
    assert fragment in notes[0].text or fragment in shown, notes[0]
    assert shown.startswith("ON" if on else "off: ") and "\n" not in notes[0].text
    assert plan.block_argv is not None
    flags = plan.block_argv.flags
    assert flags.has("monokernel") is on
    if on:  # the graph mode the kernels run under and the KV record the whole layer needs
        assert flags.get("kv_cache_dtype") == "fp8_ds_mla"
        assert json.loads(flags.get("compilation_config"))["cudagraph_mode"] == "FULL_DECODE_ONLY"
        assert plan.env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"
        assert plan.adaptive_argv is None or plan.adaptive_argv.flags.has("monokernel")
    else:
        assert not flags.has("kv_cache_dtype")


def test_rows_match_the_graph_sizes_the_wheel_names():
    """5 drafts: captured FULL graphs of 6, 12, 18, 24, 36, 42 (and 48) rows; 5 requests pad to 36."""
    assert [step_rows(n, 5, 1024) for n in range(1, 9)] == [6, 12, 18, 24, 36, 36, 42, 48]


def test_off_plans_keep_the_profile_graphs_and_v4_flash_has_no_mono_note():
    plan = _plan("mi355x", concurrency=64)
    assert plan.env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "1" and not plan.block_argv.flags.has("compilation_config")
    v4 = resolve(CAT, Selection(model="V4-Flash", gpu="mi355x", concurrency=4))
    assert not _mono_notes(v4) and not v4.block_argv.flags.has("monokernel")


def test_tp8_note_names_the_layout_that_would_take_it():
    (note,) = _mono_notes(_plan("mi300x", concurrency=4))
    assert "--strategy replicas --replicas 2 would take it on all 8 GPUs (2 independent TP-4 servers" in note.text
    assert "--tp 4 on 4 of them" in note.text


def test_gfx942_counts_the_weight_copies_and_lowers_batch_tokens_to_make_room():
    """MI300X TP4: the kernels' copies (routed experts x 576/640 + dense linears) are 56.1 GiB per rank; at
    8192 batched tokens KV is 34.6 - 56.1 = -21.5 GiB; 2048 frees 6 x 1024 x 4.561 MiB = 27.4 GiB -> 5.9 GiB."""
    plain = _plan("mi300x", concurrency=4, tp=4, max_num_batched_tokens=8192)
    mono = _plan("mi300x", concurrency=4, tp=4)
    assert plain.memory.kv_gib == pytest.approx(34.6, abs=0.05)
    assert mono.max_num_batched_tokens == 2048 and mono.memory.kv_gib == pytest.approx(5.9, abs=0.05)
    freed = (8192 - 2048) * CAT.models["DeepSeek-V4.1-Flash"].memory["indexer_mib_per_batched_token"] / 1024
    assert mono.memory.kv_gib == pytest.approx(plain.memory.kv_gib + freed - 56.1, abs=0.1)
    assert any(n.topic == "mono batch tokens" for n in mono.notes)
    assert any(n.topic == "workaround engram-profiling" for n in mono.notes)  # below 6144 batched tokens


def _recipe(*args):
    proc = run_cli(["recipe", "--model", "V4.1-Flash", *args], capture_output=True, text=True,
                          env=cli_env())
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("args", [("--gpu", "mi355x", "--concurrency", "4"),
                                  ("--gpu", "mi300x", "--tp", "4", "--concurrency", "4")])
def test_done_when_low_concurrency_plans_carry_monokernel(args):
    out = _recipe(*args)
    assert "  --monokernel \\" in out and "--compilation-config '{\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}'" in out
    assert "VLLM_USE_BREAKABLE_CUDAGRAPH=0" in out and "--kv-cache-dtype fp8_ds_mla" in out
    assert sum(ln.startswith("# mono decode: ON (--monokernel)") for ln in out.splitlines()) == 1


@pytest.mark.parametrize("args,why", [
    (("--gpu", "mi355x", "--concurrency", "64"), "64 requests x (1+K=6) = 384 rows > 48"),
    (("--gpu", "mi355x", "--concurrency", "4", "--dp", "2"), "data parallel 2"),
    (("--gpu", "mi355x", "--concurrency", "4", "--vllm-version", "0.32.0"), "v0.32.0 lacks vllm#60397"),
    (("--gpu", "mi300x", "--concurrency", "4"), "TP 8 (the gfx942 kernels take TP 4)"),
])
def test_done_when_other_plans_say_why_in_one_line(args, why):
    out = _recipe(*args)
    assert "--monokernel \\" not in out
    lines = [ln for ln in out.splitlines() if ln.startswith("# mono decode:")]
    assert len(lines) == 1 and lines[0].startswith("# mono decode: off: ") and why in lines[0], lines
