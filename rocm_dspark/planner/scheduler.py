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


def _as_conf(conf, name: str):
    import numpy as np

    arr = np.asarray(conf, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array [requests, positions], got shape {arr.shape}")
    # NaN (a missing history) compares False both ways, so it passes; out-of-range values do not.
    if arr.size and (np.fmin.reduce(arr, axis=None) < 0.0 or np.fmax.reduce(arr, axis=None) > 1.0):
        raise ValueError(f"{name} must lie in [0, 1]")
    return arr


def _drafts(drafts, num_requests: int, gamma: int):
    import numpy as np

    if drafts is None:
        return np.full(num_requests, gamma, dtype=np.int64)
    d = np.asarray(drafts, dtype=np.int64)
    if d.shape != (num_requests,) or (d < 0).any() or (d > gamma).any():
        raise ValueError(f"drafts must be {num_requests} counts in [0, {gamma}]")
    return d


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


def verify_table(step_cost, upto: int):
    """verify_seconds(0..upto) as one array, built once per cost object and reused (vLLM builds its
    cost tables once after profiling too). The cost objects are immutable, so the cache stays valid."""
    import numpy as np

    table = getattr(step_cost, "_rocm_dspark_verify_table", None)
    if table is None or table.size <= upto:
        table = np.asarray(step_cost.verify_seconds(np.arange(int(upto) + 1)), dtype=np.float64)
        try:
            object.__setattr__(step_cost, "_rocm_dspark_verify_table", table)
        except (AttributeError, TypeError):  # __slots__ objects: no cache, still correct
            pass
    return table


def _fixed_seconds(step_cost, num_requests: int, gamma: int) -> float:
    """The part of a step that does not depend on the budget: the drafter (it drafts every position
    anyway) and the per-request charge. Cached per cost object, like verify_table."""
    cache = getattr(step_cost, "_rocm_dspark_fixed", None)
    if cache is None:
        cache = {}
        with contextlib.suppress(AttributeError, TypeError):
            object.__setattr__(step_cost, "_rocm_dspark_fixed", cache)
    key = (num_requests, gamma)
    if key not in cache:
        cache[key] = float(step_cost.draft_seconds(num_requests, gamma)) + request_seconds(step_cost, num_requests)
    return cache[key]


def request_seconds(step_cost, num_requests: int) -> float:
    """The cost's per-step charge that depends on the request count alone (attention over each
    request's context in the calibrated model; 0 for costs that carry none)."""
    fn = getattr(step_cost, "request_seconds", None)
    return float(fn(num_requests)) if fn is not None and num_requests > 0 else 0.0


def rank_slots(surv, drafts=None):
    """All valid slots (j < drafts[r]) in rank order: value desc, then position asc, then request asc.
    Returns (requests, positions), two index arrays."""
    import numpy as np

    surv = np.asarray(surv, dtype=np.float64)
    num_requests, gamma = surv.shape
    d = _drafts(drafts, num_requests, gamma)
    # Lay the slots out position-major (j, then r): a stable sort by value then keeps ties in
    # (position, request) order, which is the documented tie-break.
    pos, req = np.nonzero(np.arange(gamma)[:, None] < d[None, :])
    values = surv[req, pos]
    order = np.argsort(-values, kind="stable")
    return req[order], pos[order]


def admitted_slots(surv, budget: int, drafts=None):
    """Boolean [requests, positions]: the `budget` best valid slots by the ranking above.

    Rank counting, not a full sort: the budget-th value is found by a partition, every slot above it
    is admitted, and the tied slots at the boundary are taken in (position, request) order.
    """
    import numpy as np

    surv = np.asarray(surv, dtype=np.float64)
    num_requests, gamma = surv.shape
    budget = int(budget)
    if budget < 0:
        raise ValueError("budget must not be negative")
    if drafts is None:  # every slot valid: no mask to build or apply
        values = surv.T.ravel()  # (j, r) order
        admitted = _admit(values, budget)
        return admitted.reshape(gamma, num_requests).T
    d = _drafts(drafts, num_requests, gamma)
    valid_t = np.arange(gamma)[:, None] < d[None, :]  # position-major [gamma, R]
    slots = np.zeros_like(valid_t)
    slots[valid_t] = _admit(surv.T[valid_t], budget)
    return slots.T


def _admit(values, budget: int):
    """Boolean mask of the `budget` largest values; ties at the boundary go to the earliest index."""
    import numpy as np

    total = values.size
    if budget >= total:
        return np.ones(total, dtype=bool)
    if budget <= 0:
        return np.zeros(total, dtype=bool)
    threshold = np.partition(values, total - budget)[total - budget]
    admitted = values >= threshold
    extra = int(np.count_nonzero(admitted)) - budget
    if extra:  # more than one slot ties at the threshold: keep the earliest, drop the last `extra`
        ties = np.flatnonzero(values == threshold)
        admitted[ties[len(ties) - extra :]] = False
    return admitted


def allocate(surv, budget: int, drafts=None):
    """Verified drafts per request when the `budget` best slots are admitted (always a prefix)."""
    import numpy as np

    surv = np.asarray(surv, dtype=np.float64)
    if drafts is None and budget >= 0:  # the common case: position-major values, no mask round trip
        by_position = np.ascontiguousarray(surv.T)
        admitted = _admit(by_position.ravel(), int(budget)).reshape(by_position.shape)
        return admitted.sum(axis=0, dtype=np.int64)
    return admitted_slots(surv, budget, drafts).sum(axis=1).astype(np.int64)


@dataclass(frozen=True)
class Budget:
    """The chosen number of draft slots and the objective it maximised (expected tokens / second)."""

    budget: int
    tokens_per_s: float
    curve: object  # numpy array: expected tokens / s for every budget 0..N


def budget_curve(hist_surv, step_cost, *, drafts=None, num_sampling=None, max_budget=None):
    """Expected tokens per second for every budget b = 0..N, from survivals `hist_surv`.

    theta(b) = (requests sampling + sum of the b best survivals) / (draft(R) + verify(R + b)).
    With no requests there is nothing to plan: one budget (0) at rate 0.
    """
    import numpy as np

    hist_surv = np.asarray(hist_surv, dtype=np.float64)
    num_requests, gamma = hist_surv.shape
    if num_requests == 0:
        return np.zeros(1)
    if drafts is None:
        scores = hist_surv.ravel()
    else:
        d = _drafts(drafts, num_requests, gamma)
        scores = hist_surv[np.arange(gamma)[None, :] < d[:, None]]
    scores = np.sort(scores)[::-1]
    if max_budget is not None:
        scores = scores[: max(0, int(max_budget))]
    sampling = num_requests if num_sampling is None else num_sampling
    expected = np.empty(scores.size + 1)
    expected[0] = sampling
    np.cumsum(scores, out=expected[1:])
    expected[1:] += sampling
    fixed = _fixed_seconds(step_cost, num_requests, gamma)
    seconds = verify_table(step_cost, num_requests + scores.size)[num_requests : num_requests + scores.size + 1]
    return expected / (fixed + seconds)


def choose_budget(hist_surv, step_cost, **kw) -> Budget:
    """Full search: every budget is evaluated and the first maximum wins (np.argmax). Between two
    graph sizes the cost is flat while the numerator grows, so this is the same as searching the
    graph sizes, and it stays exact for any cost table, monotone or not."""
    import numpy as np

    curve = budget_curve(hist_surv, step_cost, **kw)
    b = int(np.argmax(curve))
    return Budget(b, float(curve[b]), curve)


def choose_budget_early_stop(hist_surv, step_cost, **kw) -> Budget:
    """The paper's Algorithm 1 (greedy, stops at the first budget that does not improve).
    Optimal only when the objective is unimodal; kept to show where the full search differs."""
    curve = budget_curve(hist_surv, step_cost, **kw)
    b = 0
    while b + 1 < len(curve) and curve[b + 1] > curve[b]:
        b += 1
    return Budget(b, float(curve[b]), curve)


@dataclass(frozen=True)
class StepPlan:
    budget: int  # draft slots verified this step (K in the paper's production scheme)
    lengths: object  # numpy int array: verified drafts per request, a prefix of each draft
    tokens: int  # target tokens this step: one anchor row per request + budget


def plan_step(history_conf, current_conf, step_cost, *, drafts=None, max_budget=None) -> StepPlan:
    """Two-phase causal scheme: budget from `history_conf` (the previous step's drafts), allocation
    from `current_conf` (the drafts verified now). The current confidences never reach the budget.
    Zero requests plan an empty step (budget 0, no tokens)."""
    import numpy as np

    current = survival(current_conf)
    history = survival(history_conf)
    if history.shape != current.shape:
        raise ValueError(f"history {history.shape} and current {current.shape} confidences differ in shape")
    if current.shape[0] == 0:
        return StepPlan(budget=0, lengths=np.zeros(0, dtype=np.int64), tokens=0)
    budget = int(np.argmax(budget_curve(history, step_cost, drafts=drafts, max_budget=max_budget)))
    lengths = allocate(current, budget, drafts)
    return StepPlan(budget=int(lengths.sum()), lengths=lengths, tokens=int(current.shape[0] + lengths.sum()))


class TwoPhaseScheduler:
    """Keeps the one step of lag, per request: each call plans with the confidences each request had
    in the previous call as its history.

    History is keyed by request id, as vLLM keys its stale confidences by request (req_id_to_index;
    `add_request` resets the slot): a request that takes another's row, even at the same batch size,
    never inherits the other's confidences. A request without history (new, or absent from the
    previous call) gets survival 1.0, vLLM's policy for a new request (docs/scheduler.md, "Missing history").
    Without `request_ids`, row i is taken to be the same request in every call.
    """

    def __init__(self, step_cost, *, max_budget=None):
        self.step_cost = step_cost
        self.max_budget = max_budget
        self._previous: dict = {}

    def step(self, current_conf, drafts=None, request_ids=None) -> StepPlan:
        import numpy as np

        current = _as_conf(current_conf, "current confidences")
        ids = list(range(current.shape[0])) if request_ids is None else list(request_ids)
        if len(ids) != current.shape[0] or len(set(ids)) != len(ids):
            raise ValueError(f"request_ids must name each of the {current.shape[0]} rows once")
        history = np.full(current.shape, np.nan)
        for row, rid in enumerate(ids):
            previous = self._previous.get(rid)
            if previous is not None and previous.shape == current.shape[1:]:
                history[row] = previous
        plan = plan_step(history, current, self.step_cost, drafts=drafts, max_budget=self.max_budget)
        self._previous = {rid: current[row].copy() for row, rid in enumerate(ids)}
        return plan


def dp_charged_tokens(tokens_per_rank) -> int:
    """Data-parallel ranks run one graph shape: every rank pays for the largest rank's token count
    (a smaller local budget buys nothing while another rank pads the graph)."""
    return int(max(tokens_per_rank))


def plan_dp_step(histories, currents, step_cost, *, max_budget=None):
    """Each DP rank plans its own two-phase step (vLLM: per-rank budget, then one collective agrees the
    graph); returns the per-rank plans and the token count every rank is charged for."""
    plans = [plan_step(h, c, step_cost, max_budget=max_budget) for h, c in zip(histories, currents)]
    return plans, dp_charged_tokens(p.tokens for p in plans)
