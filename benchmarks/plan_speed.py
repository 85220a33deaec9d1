"""How long one adaptive-verification step takes to plan, against vLLM 0.33's own algorithm, in the same run.

One step = budget from the history confidences (full search over every budget) + allocation of that
budget over the current confidences (global ranking). The reference is a straightforward vectorised
numpy transcription of vLLM 0.33.0's `AdaptiveVerifier.get_num_tokens` (host budget: float64 cumprod,
sort, cumsum, argmax over prebuilt cost tables) and `_assign_draft_token_budget` (survival, mask the
slots past each request's drafts with -inf, global top-k, count per row), from
vllm/v1/worker/gpu/spec_decode/adaptive_verification.py in the vllm==0.33.0 wheel. Its cost tables
are built once before timing, as vLLM builds them once after profiling. Both must return the same
lengths (no ties in these draws); the script prints both times and the ratio planner / vLLM.

    python benchmarks/plan_speed.py [--repeats 200]   (best of N runs each: this machine is shared)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from rocm_dspark.recipe.capture import vllm_capture_grid
from rocm_dspark.planner.cost_table import MeasuredCost
from rocm_dspark.planner.scheduler import plan_step


def vllm_tables(cost: MeasuredCost, max_reqs: int, max_tokens: int):
    """vLLM's two cost tables (ms), indexed by request count and by token count."""
    draft = np.array([cost.draft_seconds(r, 1) * 1e3 for r in range(max_reqs + 1)])
    verify = np.asarray(cost.verify_seconds(np.arange(max_tokens + 1))) * 1e3
    return draft, verify


def vllm_plan(stale, live, draft_ms, verify_ms):
    """vLLM 0.33's budget (get_num_tokens) then allocation (_assign_draft_token_budget), in numpy."""
    num_reqs, steps = stale.shape
    scheduled = np.full(num_reqs, steps)
    survival = np.cumprod(stale.astype(np.float64), axis=1)
    valid = np.arange(steps)[None, :] < scheduled[:, None]
    scores = np.sort(survival[valid])[::-1]
    max_budget = int(scheduled.sum())
    scores = scores[:max_budget]
    expected = np.concatenate(([num_reqs], num_reqs + np.cumsum(scores)))
    costs = draft_ms[num_reqs] + verify_ms[num_reqs: num_reqs + max_budget + 1]
    budget = int(np.argmax(expected / costs))
    if budget == 0:
        return np.zeros(num_reqs, dtype=np.int64)
    if budget >= max_budget:
        return scheduled.astype(np.int64)
    live_surv = np.cumprod(live, axis=1)
    live_surv = np.where(~valid, -np.inf, live_surv).ravel()
    winners = np.argpartition(-live_surv, budget - 1)[:budget]       # torch.topk(budget)
    admitted = np.zeros(live_surv.size, dtype=bool)
    admitted[winners] = True
    return admitted.reshape(num_reqs, steps).sum(axis=1)


def time_it(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'shape':>10} {'planner ms':>11} {'vLLM-0.33 numpy ms':>19} {'planner / vLLM':>15}")
    for requests, gamma in ((512, 5), (128, 5), (4096, 7)):
        limit = 8192
        grid = vllm_capture_grid(limit)
        # A staircase like a profiled curve: 12 ms + 4 us per token, padded to the capture grid.
        cost = MeasuredCost.from_samples(verify=[(s, 12.0 + 0.004 * s) for s in grid] + [(40000, 200.0)],
                                         draft=[(1, 1.0), (8192, 3.0)], capture_sizes=grid)
        draft_ms, verify_ms = vllm_tables(cost, requests, requests * (gamma + 1))
        history = rng.uniform(0.3, 1.0, (requests, gamma))
        current = rng.uniform(0.3, 1.0, (requests, gamma))
        ours = plan_step(history, current, cost).lengths
        theirs = vllm_plan(history, current, draft_ms, verify_ms)
        assert ours.tolist() == theirs.tolist(), "planner and vLLM's algorithm disagree"
        t_ours = time_it(lambda: plan_step(history, current, cost), args.repeats)
        t_ref = time_it(lambda: vllm_plan(history, current, draft_ms, verify_ms), args.repeats)
        print(f"{f'{requests}x{gamma}':>10} {t_ours * 1e3:>11.3f} {t_ref * 1e3:>19.3f} {t_ours / t_ref:>14.2f}x")


if __name__ == "__main__":
    main()
