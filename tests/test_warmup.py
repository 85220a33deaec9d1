"""The warm-up before ready (rocm_dspark/launch/warmup.py): which batches a plan's launcher sends, and what its
log line says they exercised. The launcher's side (sent before ready, a failure is one line) is in
tests/test_launchers.py; a real vLLM's in tests/slow/test_compile_cache_real.py."""

from __future__ import annotations

import json

import pytest

from rocm_dspark.launch import warmup
from rocm_dspark.launch.launchers import render_launcher
from tests.helpers.launcher_rig import make_plan

SPEC5 = json.dumps({"method": "dspark", "num_speculative_tokens": 5})


@pytest.mark.parametrize("seqs, want", [(None, (1,)), (0, (1,)), (1, (1,)), (4, (1, 2, 4)), (6, (1, 2, 4, 6)),
                                        (128, (1, 2, 4, 8, 16, 32, 64, 128))])
def test_batches_double_up_to_max_num_seqs_and_end_on_it(seqs, want):
    assert warmup.batches(seqs) == want


def test_a_dspark_plan_covers_max_num_seqs_times_1_plus_k():
    # The MI300X default shape (recipe/capture.py): 128 x (1+5) = 768 tokens, captured up to 1024.
    w = warmup.plan_warmup(("vllm", "serve", "m", "--max-num-seqs", "128", "--max-cudagraph-capture-size", "1024",
                            "--speculative-config", SPEC5))
    assert w.step == 6 and w.step_sizes == (6, 12, 24, 48, 96, 192, 384, 768) and w.capture == 1024
    assert w.max_tokens == 12 and sum(w.batches) == 255
    assert w.says() == ("255 requests in batches of 1, 2, 4, 8, 16, 32, 64, 128: capture sizes exercised 6, 12, 24, "
                        "48, 96, 192, 384, 768 (a decode step of batch x (1+K=6) tokens); max_num_seqs 128, the "
                        "plan's capture size 1024")


def test_without_speculation_eager_or_unset_it_says_so_and_stays_small():
    w = warmup.plan_warmup(("vllm", "serve", "m", "--enforce-eager"))
    assert w.batches == (1,) and w.step == 1 and w.max_tokens == warmup.MIN_TOKENS and w.capture == 0
    assert w.says().endswith("max_num_seqs not set by the plan, no graphs (--enforce-eager)")
    assert warmup.plan_warmup(("vllm", "serve", "m"), capture_size=64).says().endswith("the plan's capture size 64")
    assert warmup.plan_warmup(("vllm", "serve", "m")).says().endswith("vLLM's default capture sizes")


def test_the_body_is_json_for_any_served_name():
    name = "tiny $(id) 'q' %n ü \"x\""
    assert json.loads(warmup.body(name, 8)) == {"model": name, "prompt": warmup.PROMPT, "max_tokens": 8,
                                                "temperature": 0, "ignore_eos": True}


def test_each_command_of_a_launcher_warms_its_own_k_and_a_worker_sends_none():
    plan = make_plan(8000, extra=("--max-num-seqs", "2"))
    k3 = tuple(a.replace('"num_speculative_tokens":5', '"num_speculative_tokens":3') for a in plan.block_argv)
    text = render_launcher(plan._replace(block_argv=k3))
    assert "PRIMARY_WARM=(1 2)" in text and "FALLBACK_WARM=(1 2)" in text
    assert "exercised 6, 12 (a decode step of batch x (1+K=6)" in text.split("FALLBACK_WARM=")[0]
    assert "exercised 4, 8 (a decode step of batch x (1+K=4)" in text.split("FALLBACK_WARM=")[1]
    worker = render_launcher(plan, group_role="worker", ready_host="10.0.0.1", join_host="10.0.0.1", join_port=29500)
    assert "WARM_BODY" not in worker and "warm_up" not in worker and "/v1/completions" not in worker
