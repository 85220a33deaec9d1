"""A/B records and the payoff half of the gate (tests/test_gate_payoff.py): signed by the real code."""

from __future__ import annotations

from rocm_dspark.probe import ab_record, payoff
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.resolve import Selection, Verdict

SELECTION = Selection(model="V4.1-Flash", gpu="mi300x", vllm_version="0.33.0")


def plan_of(selection=SELECTION):
    from rocm_dspark.recipe.resolve import resolve_plan

    return resolve_plan(load_catalog(), selection)


PROVEN = Verdict(True, "record P matches this host and plan: static, GPU kernel and live passed", "p.json")


NOT_PROVEN = Verdict(False, "no probe record in /x/probe")


def arm(tok_s, failed=0, al=None):
    stats = {"mean": 1.0, "p50": 1.0, "p99": 2.0}
    return {"argv": ["vllm", "serve"], "description": "arm", "output_throughput_tok_s": tok_s,
            "acceptance_length": al, "ttft_ms": {**stats, "p90": 1.5}, "tpot_ms": stats, "itl_ms": stats,
            "requests": 64, "failed": failed}


_SEQ = iter(range(10, 60))


def write_ab(state, fp, *, block=1000.0, adaptive=1100.0, concurrency=64, override=None, failed=0,
             finished_at="2026-12-01T01:10:00Z", rid=None):
    rid = rid or f"20261201T01{next(_SEQ):02d}00Z-{'%08x' % next(_SEQ)}"
    data = ab_record.build(record_id=rid, created_at="2026-12-01T01:00:00Z", finished_at=finished_at,
                           toolkit_version="0.1.0", host={"hostname": "h", "platform": "Linux"},
                           selection=SELECTION._asdict(), fingerprint=fp, concurrency=concurrency,
                           workload={"requests": 64, "max_tokens": 256, "prompts": "x"},
                           arms={"block": arm(block, failed), "adaptive": arm(adaptive, al=3.2)}, override=override)
    return rid, ab_record.write(state, data)


def decide(state, fp, concurrency=64):
    return payoff.payoff_verdict(load_catalog(), plan_of(), concurrency, state_dir=state, current=fp)
