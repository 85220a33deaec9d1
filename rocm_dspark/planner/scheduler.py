"""Adaptive verification: which drafted positions the target verifies in one step.

Vocabulary (research/scheduler.md §0): R requests each drafted gamma positions; c[r, j] is the
confidence head's estimate of P(draft j accepted | drafts 1..j-1 accepted); the survival
a[r, j] = c[r, 1] * ... * c[r, j] is the probability that draft j is accepted and so adds one token.
Every request always verifies its anchor row (one token, the correction or bonus), so a step that
admits `budget` draft slots runs R + budget target tokens and expects R + sum(admitted a) tokens.

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

from dataclasses import dataclass


def _as_conf(conf, name: str):
    import numpy as np

    arr = np.asarray(conf, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array [requests, positions], got shape {arr.shape}")
    finite = arr[~np.isnan(arr)]
    if finite.size and (finite.min() < 0.0 or finite.max() > 1.0):
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

    arr = _as_conf(conf, "confidences")
    return np.cumprod(np.where(np.isnan(arr), 1.0, arr), axis=1)


def rank_slots(surv, drafts=None):
    """All valid slots (j < drafts[r]) in rank order: value desc, then position asc, then request asc.
    Returns (requests, positions), two index arrays."""
    import numpy as np

    surv = np.asarray(surv, dtype=np.float64)
    num_requests, gamma = surv.shape
    d = _drafts(drafts, num_requests, gamma)
    # Lay the slots out position-major (j, then r): a stable sort by value then keeps ties in
    # (position, request) order, which is the documented tie-break.
    pos, req = np.nonzero((np.arange(gamma)[:, None] < d[None, :]))
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
    d = _drafts(drafts, num_requests, gamma)
    valid_t = np.arange(gamma)[:, None] < d[None, :]      # position-major [gamma, R]
    budget = int(budget)
    if budget < 0:
        raise ValueError("budget must not be negative")
    values = surv.T[valid_t]                               # (j, r) order
    total = values.size
    if budget >= total:
        return valid_t.T.copy()
    admitted = np.zeros(total, dtype=bool)
    if budget > 0:
        threshold = np.partition(values, total - budget)[total - budget]
        admitted = values > threshold
        ties = np.flatnonzero(values == threshold)
        admitted[ties[: budget - int(admitted.sum())]] = True
    slots = np.zeros_like(valid_t)
    slots[valid_t] = admitted
    return slots.T


def allocate(surv, budget: int, drafts=None):
    """Verified drafts per request when the `budget` best slots are admitted (always a prefix)."""
    import numpy as np

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
    """
    import numpy as np

    hist_surv = np.asarray(hist_surv, dtype=np.float64)
    num_requests, gamma = hist_surv.shape
    d = _drafts(drafts, num_requests, gamma)
    valid = np.arange(gamma)[None, :] < d[:, None]
    scores = np.sort(hist_surv[valid])[::-1]
    if max_budget is not None:
        scores = scores[: max(0, int(max_budget))]
    sampling = num_requests if num_sampling is None else num_sampling
    expected = sampling + np.concatenate(([0.0], np.cumsum(scores)))
    tokens = num_requests + np.arange(scores.size + 1)
    seconds = step_cost.draft_seconds(num_requests, gamma)  # the drafter drafts every position anyway
    seconds = seconds + np.asarray(step_cost.verify_seconds(tokens), dtype=np.float64)
    return expected / seconds


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
    budget: int          # draft slots verified this step (K in the paper's production scheme)
    lengths: object      # numpy int array: verified drafts per request, a prefix of each draft
    tokens: int          # target tokens this step: one anchor row per request + budget


def plan_step(history_conf, current_conf, step_cost, *, drafts=None, max_budget=None) -> StepPlan:
    """Two-phase causal scheme: budget from `history_conf` (the previous step's drafts), allocation
    from `current_conf` (the drafts verified now). The current confidences never reach the budget."""
    current = survival(current_conf)
    history = survival(history_conf)
    if history.shape != current.shape:
        raise ValueError(f"history {history.shape} and current {current.shape} confidences differ in shape")
    budget = choose_budget(history, step_cost, drafts=drafts, max_budget=max_budget).budget
    lengths = allocate(current, budget, drafts)
    return StepPlan(budget=int(lengths.sum()), lengths=lengths, tokens=int(current.shape[0] + lengths.sum()))


class TwoPhaseScheduler:
    """Keeps the one step of lag: each call plans with the previous call's confidences as history.

    The first call (or a change in the request set, seen as a change of shape) has no history:
    survival 1.0 for every slot, vLLM's policy for a new request (research/scheduler.md §1.7).
    """

    def __init__(self, step_cost, *, max_budget=None):
        self.step_cost = step_cost
        self.max_budget = max_budget
        self._previous = None

    def step(self, current_conf, drafts=None) -> StepPlan:
        import numpy as np

        current = _as_conf(current_conf, "current confidences")
        history = self._previous
        if history is None or history.shape != current.shape:
            history = np.full(current.shape, np.nan)
        plan = plan_step(history, current, self.step_cost, drafts=drafts, max_budget=self.max_budget)
        self._previous = current.copy()
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
