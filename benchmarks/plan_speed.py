"""How long one adaptive-verification step takes to plan, against a plain reference, in the same run.

One step = budget from the history confidences (full search over every budget) + allocation of that
budget over the current confidences (global ranking, ties by position then request). The reference
does the same with Python lists: sort tuples, running sums, a loop over budgets, a loop to count.
Both must return the same lengths; the script prints the vectorised planner's time and the ratio.

    python benchmarks/plan_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from rocm_dspark.capture import vllm_capture_grid
from rocm_dspark.planner.cost_table import MeasuredCost
from rocm_dspark.planner.scheduler import plan_step


def reference_plan(history, current, verify_ms, draft_ms):
    """The same algorithm with plain Python: the readable version of scheduler.plan_step."""
    requests, gamma = len(history), len(history[0])
    scores = []
    for row in history:
        s = 1.0
        for c in row:
            s *= c
            scores.append(s)
    scores.sort(reverse=True)
    best_b, best, expected = 0, -1.0, float(requests)
    for b in range(len(scores) + 1):
        if b:
            expected += scores[b - 1]
        rate = expected / (draft_ms + verify_ms[requests + b])
        if rate > best:
            best_b, best = b, rate
    slots = []
    for r, row in enumerate(current):
        s = 1.0
        for j, c in enumerate(row):
            s *= c
            slots.append((-s, j, r))
    slots.sort()
    lengths = [0] * requests
    for _, _, r in slots[:best_b]:
        lengths[r] += 1
    return lengths


def time_it(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'shape':>12} {'planner ms':>11} {'reference ms':>13} {'speed-up':>9}")
    for requests, gamma in ((512, 5), (4096, 7)):
        limit = 8192
        grid = vllm_capture_grid(limit)
        # A staircase like a profiled curve: 12 ms + 4 us per token, padded to the capture grid.
        cost = MeasuredCost.from_samples(verify=[(s, 12.0 + 0.004 * s) for s in grid] + [(40000, 200.0)],
                                         draft=[(1, 1.0), (8192, 3.0)], capture_sizes=grid)
        tokens = np.arange(requests * (gamma + 1) + 1)
        verify_ms = (cost.verify_seconds(tokens) * 1000).tolist()
        draft_ms = cost.draft_seconds(requests, gamma) * 1000
        history = rng.uniform(0.3, 1.0, (requests, gamma))
        current = rng.uniform(0.3, 1.0, (requests, gamma))
        hist_list, cur_list = history.tolist(), current.tolist()
        ours = plan_step(history, current, cost).lengths.tolist()
        assert ours == reference_plan(hist_list, cur_list, verify_ms, draft_ms), "planner and reference disagree"
        t_ours = time_it(lambda: plan_step(history, current, cost), args.repeats)
        t_ref = time_it(lambda: reference_plan(hist_list, cur_list, verify_ms, draft_ms), args.repeats)
        print(f"{f'{requests}x{gamma}':>12} {t_ours * 1e3:>11.3f} {t_ref * 1e3:>13.3f} {t_ref / t_ours:>8.1f}x")


if __name__ == "__main__":
    main()
