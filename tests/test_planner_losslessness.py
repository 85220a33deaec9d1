"""Losslessness by Monte Carlo: the two-phase scheme keeps the target's output distribution; choosing
the budget from the current draft (the negative control) does not.

Setups
  * DSpark paper Appendix A: one request, gamma=2, target p(A)=0.7, draft q(A)=0.5, c1=0.8,
    c2 = 0.9 if x1 = A else 0, SPS(1)=1, SPS(2)=0.5, SPS(3)=0.45. A budget from the current draft
    verifies x1 only when it is A, so P(first token = A) = 0.5 + 0.5 x 0.7 = 0.85.
  * A richer one: 3 requests, gamma=3, 3 tokens, confidences that depend on the previous draft token,
    and a jagged cost table.
Rejection sampling is the standard rule (accept x with prob min(1, p(x)/q(x)); on rejection sample
max(p - q, 0) normalised; after the last verified draft a bonus token from p). The target is the same
at every position, so under a lossless scheme every emitted token is an independent draw from p.

Statistical tests (fixed seed, so the outcome is reproducible; thresholds set for a false alarm
rate of about 1e-5 if the seed were random):
  * binomial z-test on P(first emitted token = A) per step: |z| < 4.5;
  * chi-square goodness of fit of non-overlapping pairs of the emitted stream against p x p (3 dof)
    and of each request's first token against p (2 dof): p-value > 1e-5;
  * the negative control must be rejected (z > 30) and sit within 4.5 standard errors of 0.85.
"""

from __future__ import annotations

import numpy as np
import pytest

from rocm_dspark.planner.scheduler import allocate, choose_budget, plan_step, survival

Z_MAX = 4.5
P_MIN = 1e-5
STEPS = 200_000


def chisquare_p(observed, expected) -> float:
    """The chi-square goodness-of-fit p-value. scipy.stats is imported here, not at the top: collection imports
    every test module on each xdist worker, and scipy.stats costs about a CPU-second there."""
    from scipy import stats

    return float(stats.chisquare(observed, expected).pvalue)


class SpsCost:
    """Step seconds = 1 / SPS(tokens), no separate drafter cost (the paper's Appendix A model)."""

    def __init__(self, seconds_by_tokens):
        self.table = np.asarray(seconds_by_tokens, dtype=np.float64)

    def verify_seconds(self, tokens):
        return self.table[np.asarray(tokens)]

    def draft_seconds(self, num_requests, k):
        return 0.0


def standard_rejection(rng, p, q, drafts, lengths):
    """Emitted tokens per step: drafts [steps, gamma] ~ q, lengths [steps] verified drafts.
    Returns an int array [steps, gamma + 1] padded with -1."""
    steps, gamma = drafts.shape
    accept = rng.random((steps, gamma)) < np.minimum(1.0, p[drafts] / q[drafts])
    residual = np.maximum(p - q, 0.0)
    corrections = rng.choice(len(p), size=(steps, gamma), p=residual / residual.sum())
    bonus = rng.choice(len(p), size=steps, p=p)
    out = np.full((steps, gamma + 1), -1, dtype=np.int64)
    alive = np.ones(steps, dtype=bool)
    for j in range(gamma + 1):
        verified = alive & (j < lengths)
        done = alive & (j >= lengths)          # every verified draft accepted: bonus token
        out[done, j] = bonus[done]
        ok = verified & accept[:, j] if j < gamma else np.zeros(steps, bool)
        rejected = verified & ~ok
        if j < gamma:
            out[ok, j] = drafts[ok, j]
            out[rejected, j] = corrections[rejected, j]
        alive = ok
    return out


def cached(fn):
    memo = {}

    def call(*arrays):
        key = tuple(np.asarray(a).tobytes() for a in arrays)
        if key not in memo:
            memo[key] = fn(*arrays)
        return memo[key]

    return call


def two_phase_lengths(confs, cost):
    """Run the lagged two-phase scheme over a sequence of per-step confidences [steps, R, gamma]."""
    plan = cached(lambda hist, cur: plan_step(hist, cur, cost).lengths)
    out = np.empty(confs.shape[:2], dtype=np.int64)
    history = np.full(confs.shape[1:], np.nan)          # no history on the first step
    for s, cur in enumerate(confs):
        out[s] = plan(history, cur)
        history = cur
    return out


def biased_lengths(confs, cost):
    """NEGATIVE CONTROL: budget searched over the CURRENT draft's confidences (never do this)."""
    def plan(cur):
        a = survival(cur)
        return allocate(a, choose_budget(a, cost).budget)
    plan = cached(plan)
    return np.stack([plan(cur) for cur in confs])


def z_score(successes, n, p0):
    return (successes / n - p0) / np.sqrt(p0 * (1 - p0) / n)


# --- Appendix A ----------------------------------------------------------------------------------------

P_T = np.array([0.7, 0.3])
Q_D = np.array([0.5, 0.5])
APPENDIX_COST = SpsCost([np.inf, 1 / 1.0, 1 / 0.5, 1 / 0.45])


def appendix_a_run(scheduler_lengths, seed):
    rng = np.random.default_rng(seed)
    drafts = rng.choice(2, size=(STEPS, 2), p=Q_D)
    c2 = np.where(drafts[:, 0] == 0, 0.9, 0.0)
    confs = np.stack([np.full(STEPS, 0.8), c2], axis=1)[:, None, :]   # [steps, R=1, gamma=2]
    lengths = scheduler_lengths(confs, APPENDIX_COST)[:, 0]
    return lengths, standard_rejection(rng, P_T, Q_D, drafts, lengths)


def test_appendix_a_budget_from_the_current_draft_is_biased_to_0_85():
    lengths, out = appendix_a_run(biased_lengths, seed=1)
    assert set(np.unique(lengths)) == {0, 2}          # verifies both drafts exactly when x1 = A
    first_a = int((out[:, 0] == 0).sum())
    se = np.sqrt(0.85 * 0.15 / STEPS)
    assert z_score(first_a, STEPS, 0.7) > 30
    assert abs(first_a / STEPS - 0.85) < Z_MAX * se


def test_appendix_a_two_phase_scheme_keeps_the_target_0_7():
    lengths, out = appendix_a_run(two_phase_lengths, seed=2)
    assert len(np.unique(lengths)) > 1                # the budget really varies from step to step
    first_a = int((out[:, 0] == 0).sum())
    assert abs(z_score(first_a, STEPS, 0.7)) < Z_MAX
    stream = out[out >= 0]
    stream = stream[: stream.size // 2 * 2]
    assert stream.size >= 2 * 10**5
    pairs = stream.reshape(-1, 2) @ np.array([2, 1])
    observed = np.bincount(pairs, minlength=4)
    expected = np.outer(P_T, P_T).ravel() * pairs.size
    assert chisquare_p(observed, expected) > P_MIN


# --- three requests, token-dependent confidences, jagged costs -----------------------------------------

P3 = np.array([0.5, 0.3, 0.2])
Q3 = np.array([0.2, 0.3, 0.5])
NEXT_CONF = np.array([0.95, 0.5, 0.05])   # c[k+1] as a function of draft token x[k]
# Verifying only first positions does not pay (1.0 -> 1.6 ms), deeper confident drafts do: the
# budget swings between 0 and 9 with the confidences, which depend on the draft tokens.
RICH_COST = SpsCost([np.inf] * 3 + [1.0, 1.6, 1.6, 1.6, 1.65, 1.7, 1.75, 1.8, 1.85, 1.9])
REQUESTS, GAMMA = 3, 3
RICH_STEPS = 70_000  # x 3 requests = 210,000 first tokens


def rich_run(scheduler_lengths, seed):
    rng = np.random.default_rng(seed)
    drafts = rng.choice(3, size=(RICH_STEPS, REQUESTS, GAMMA), p=Q3)
    confs = np.empty(drafts.shape)
    confs[:, :, 0] = 0.6
    confs[:, :, 1:] = NEXT_CONF[drafts[:, :, :-1]]
    lengths = scheduler_lengths(confs, RICH_COST)
    first = []
    for r in range(REQUESTS):
        out = standard_rejection(rng, P3, Q3, drafts[:, r, :], lengths[:, r])
        first.append(out[:, 0])
    return lengths, np.concatenate(first)


def test_rich_two_phase_scheme_keeps_the_target_distribution():
    lengths, first = rich_run(two_phase_lengths, seed=3)
    assert len(np.unique(lengths.sum(axis=1))) >= 5    # budgets vary
    observed = np.bincount(first, minlength=3)
    assert chisquare_p(observed, P3 * first.size) > P_MIN


def test_rich_budget_from_the_current_draft_is_detected():
    _, first = rich_run(biased_lengths, seed=4)
    observed = np.bincount(first, minlength=3)
    assert chisquare_p(observed, P3 * first.size) < 1e-12


def test_rejection_sampler_alone_is_exact():
    """Sanity check of the harness: verifying every draft (no scheduler) gives p exactly."""
    rng = np.random.default_rng(5)
    drafts = rng.choice(3, size=(STEPS, 3), p=Q3)
    out = standard_rejection(rng, P3, Q3, drafts, np.full(STEPS, 3))
    observed = np.bincount(out[:, 0], minlength=3)
    assert chisquare_p(observed, P3 * STEPS) > P_MIN
    assert out[:, 0].min() >= 0


@pytest.mark.parametrize("lengths_fn", [two_phase_lengths])
def test_harness_budget_uses_the_previous_steps_confidences(lengths_fn):
    """On Appendix A the two-phase budget at step s follows x1 of step s-1, not of step s."""
    rng = np.random.default_rng(6)
    drafts = rng.choice(2, size=(1000, 2), p=Q_D)
    confs = np.stack([np.full(1000, 0.8), np.where(drafts[:, 0] == 0, 0.9, 0.0)], axis=1)[:, None, :]
    lengths = lengths_fn(confs, APPENDIX_COST)[:, 0]
    assert np.array_equal(lengths[1:] == 2, drafts[:-1, 0] == 0)
