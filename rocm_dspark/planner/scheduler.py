"""Adaptive verification: which drafted positions the target verifies in one step.

Vocabulary: docs/scheduler.md, "Notation" (R requests, gamma positions, confidences c, survivals a, one anchor
row per request), so a step that admits `budget` draft slots runs R + budget target tokens.

The production scheme (DSpark paper §5.2, DeepInfer, vLLM 0.33) splits the decision in two:
  1. the budget (how many draft slots in total) comes from HISTORY: the confidences of the drafts
     verified in the previous step (conf(N-2) when step N verifies drafts made with conf(N-1)).
     It is the argmax over every budget of expected tokens / step cost: a full search, because real
     costs are steps (graph padding) and an early stop can end on a local maximum.
  2. inside that budget, slots are admitted by their CURRENT survival, in one global ranking.
Ranking ties go by value (high first), then position (early first), then request (low index first).
Position before request matters: with the budget fixed, slot (r, j) is outranked only by other
requests' slots and by (r, i<j), never by (r, i>j), so whether x[r, j] is verified depends only on
x[r, <j]: a stopping rule, and rejection sampling stays exact. Choosing the budget from the current
draft instead leaks x[r, j] through c[r, j+1] and biases the output (paper Appendix A; the
Monte-Carlo test shows 0.85 instead of 0.7).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass


def survival(conf):
    """Running product of the confidences along positions, in float64 (as vLLM's host-side budget).
    A missing history (NaN) counts as fully confident, 1.0, as vLLM does for a new request."""
    import numpy as np

    arr = np.asarray(conf, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"confidences must be a 2-D array [requests, positions], got shape {arr.shape}")
    if arr.size:
        lo, hi = arr.min(), arr.max()
        if lo != lo or hi != hi:  # a NaN somewhere: a missing history
            arr = np.where(np.isnan(arr), 1.0, arr)
            lo, hi = arr.min(), arr.max()
        if lo < 0.0 or hi > 1.0:
            raise ValueError("confidences must lie in [0, 1]")
    return np.cumprod(arr, axis=1)


def _cache(step_cost) -> dict:
    """What the scheduler derives from a cost object, built once per object and reused (vLLM builds its cost
    tables once after profiling too). The cost objects are immutable, so the cache stays valid; an object that
    takes no new attribute (__slots__) gets a fresh dict each call: no cache, still correct."""
    cache = getattr(step_cost, "_rocm_dspark_cache", None)
    if cache is None:
        cache = {}
        with contextlib.suppress(AttributeError, TypeError):
            object.__setattr__(step_cost, "_rocm_dspark_cache", cache)
    return cache


def verify_table(step_cost, upto: int):
    """verify_seconds(0..upto) as one array."""
    import numpy as np

    cache = _cache(step_cost)
    table = cache.get("verify")
    if table is None or table.size <= upto:
        table = cache["verify"] = np.asarray(step_cost.verify_seconds(np.arange(int(upto) + 1)), dtype=np.float64)
    return table


def _fixed_seconds(step_cost, num_requests: int, gamma: int) -> float:
    """The part of a step that does not depend on the budget: the drafter (it drafts every position
    anyway) and the per-request charge."""
    cache = _cache(step_cost)
    key = (num_requests, gamma)
    if key not in cache:
        cache[key] = float(step_cost.draft_seconds(num_requests, gamma)) + request_seconds(step_cost, num_requests)
    return cache[key]


def request_seconds(step_cost, num_requests: int) -> float:
    """The cost's per-step charge that depends on the request count alone (attention over each
    request's context in the calibrated model; 0 for costs that carry none)."""
    fn = getattr(step_cost, "request_seconds", None)
    return float(fn(num_requests)) if fn is not None and num_requests > 0 else 0.0


def admitted_slots(surv, budget: int):
    """Boolean [requests, positions]: the `budget` best slots by the ranking above."""
    return _admitted(surv, budget).T


def allocate(surv, budget: int):
    """Verified drafts per request when the `budget` best slots are admitted (always a prefix)."""
    import numpy as np

    return _admitted(surv, budget).sum(axis=0, dtype=np.int64)


def _admitted(surv, budget: int):
    """Boolean [positions, requests] (position-major: the earliest index wins a tie) of the `budget` best slots.
    Rank counting, not a full sort: the budget-th value is found by a partition, every slot above it is
    admitted, and the tied slots at the boundary are taken in (position, request) order."""
    import numpy as np

    by_position = np.ascontiguousarray(np.asarray(surv, dtype=np.float64).T)
    values, total, budget = by_position.ravel(), by_position.size, int(budget)
    if budget < 0:
        raise ValueError("budget must not be negative")
    if not 0 < budget < total:
        return np.full(by_position.shape, budget >= total)  # every slot or none
    threshold = np.partition(values, total - budget)[total - budget]
    admitted = values >= threshold
    extra = int(np.count_nonzero(admitted)) - budget
    if extra:  # more than one slot ties at the threshold: keep the earliest, drop the last `extra`
        ties = np.flatnonzero(values == threshold)
        admitted[ties[len(ties) - extra :]] = False
    return admitted.reshape(by_position.shape)


@dataclass(frozen=True)
class Budget:
    """The chosen number of draft slots and the objective it maximised (expected tokens / second)."""

    budget: int
    tokens_per_s: float
    curve: object  # numpy array: expected tokens / s for every budget 0..N


def budget_curve(hist_surv, step_cost):
    """Expected tokens per second for every budget b = 0..N, from survivals `hist_surv`.

    theta(b) = (R + sum of the b best survivals) / (draft(R) + verify(R + b)).
    With no requests there is nothing to plan: one budget (0) at rate 0.
    """
    import numpy as np

    hist_surv = np.asarray(hist_surv, dtype=np.float64)
    num_requests, gamma = hist_surv.shape
    if num_requests == 0:
        return np.zeros(1)
    scores = np.sort(hist_surv.ravel())[::-1]
    expected = np.empty(scores.size + 1)
    expected[0] = num_requests
    np.cumsum(scores, out=expected[1:])
    expected[1:] += num_requests
    fixed = _fixed_seconds(step_cost, num_requests, gamma)
    seconds = verify_table(step_cost, num_requests + scores.size)[num_requests : num_requests + scores.size + 1]
    return expected / (fixed + seconds)


def choose_budget(hist_surv, step_cost) -> Budget:
    """Full search: every budget is evaluated and the first maximum wins (np.argmax). Between two
    graph sizes the cost is flat while the numerator grows, so this is the same as searching the
    graph sizes, and it stays exact for any cost table, monotone or not."""
    import numpy as np

    curve = budget_curve(hist_surv, step_cost)
    b = int(np.argmax(curve))
    return Budget(b, float(curve[b]), curve)


@dataclass(frozen=True)
class StepPlan:
    budget: int  # draft slots verified this step (K in the paper's production scheme)
    lengths: object  # numpy int array: verified drafts per request, a prefix of each draft
    tokens: int  # target tokens this step: one anchor row per request + budget


def plan_step(history_conf, current_conf, step_cost) -> StepPlan:
    """Two-phase causal scheme: budget from `history_conf` (the previous step's drafts), allocation
    from `current_conf` (the drafts verified now). The current confidences never reach the budget. A request
    without history (NaN: new or preempted) counts as fully confident (survival). Zero requests plan an empty
    step (budget 0, no tokens)."""
    import numpy as np

    current = survival(current_conf)
    history = survival(history_conf)
    if history.shape != current.shape:
        raise ValueError(f"history {history.shape} and current {current.shape} confidences differ in shape")
    lengths = allocate(current, int(np.argmax(budget_curve(history, step_cost))))  # choose_budget's, no Budget
    return StepPlan(budget=int(lengths.sum()), lengths=lengths, tokens=int(current.shape[0] + lengths.sum()))
