"""Adaptive verification scheduler: properties against brute force, and published goldens.

Brute-force references enumerate every per-request length vector (R <= 4, gamma <= 4), so they do not
share any code with the scheduler's sort/partition/argmax.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocm_dspark.planner.cost_table import MeasuredCost
from rocm_dspark.planner.scheduler import admitted_slots, allocate, choose_budget, plan_step, survival
from rocm_dspark.planner.simulator import Policy, simulate


class TableCost:
    """An arbitrary (also non-monotone) cost table indexed by target tokens, plus a constant drafter."""

    def __init__(self, verify, draft=0.0):
        self.table = np.asarray(verify, dtype=np.float64)
        self.draft = draft

    def verify_seconds(self, tokens):
        return self.table[np.asarray(tokens)]

    def draft_seconds(self, num_requests, k):
        return self.draft if k > 0 else 0.0


# Confidences with many exact ties: saturated 1.0, zeros, and a few repeated values.
conf_value = st.sampled_from([0.0, 0.25, 0.5, 0.5, 0.75, 0.9, 1.0, 1.0]) | st.floats(0.0, 1.0)


@st.composite
def conf_matrix(draw, max_r=4, max_g=4):
    r = draw(st.integers(1, max_r))
    g = draw(st.integers(1, max_g))
    return np.array([[draw(conf_value) for _ in range(g)] for _ in range(r)])


def brute_best_for_budget(a, budget):
    """max over length vectors with sum == budget of the sum of admitted survivals."""
    r, g = a.shape
    best = -1.0
    for lengths in itertools.product(range(g + 1), repeat=r):
        if sum(lengths) == budget:
            best = max(best, sum(a[i, :l].sum() for i, l in enumerate(lengths)))
    return best


def brute_best_rate(a, cost):
    """max over every length vector of (R + sum admitted survivals) / step cost."""
    r, g = a.shape
    best = -np.inf
    for lengths in itertools.product(range(g + 1), repeat=r):
        tokens = r + sum(lengths)
        expected = r + sum(a[i, :l].sum() for i, l in enumerate(lengths))
        best = max(best, expected / (cost.draft_seconds(r, g) + float(cost.verify_seconds(tokens))))
    return best


# --- survival, ranking and allocation ------------------------------------------------------------------


def test_survival_is_the_running_product():
    assert np.allclose(survival([[0.9, 0.8, 0.5]]), [[0.9, 0.72, 0.36]])  # ATOM's unit golden
    assert np.allclose(survival([[np.nan, np.nan]]), [[1.0, 1.0]])       # missing history counts as 1.0
    with pytest.raises(ValueError):
        survival([[1.2, 0.5]])


def test_ranking_ties_go_by_position_then_request():
    surv = np.array([[0.5, 0.5], [0.5, 0.2], [0.9, 0.5]])
    # the slot each extra unit of budget admits, in rank order
    order = [tuple(np.argwhere(admitted_slots(surv, b + 1) & ~admitted_slots(surv, b))[0]) for b in range(surv.size)]
    assert order == [(2, 0), (0, 0), (1, 0), (0, 1), (2, 1), (1, 1)]


@settings(max_examples=300, deadline=None)
@given(conf_matrix(), st.data())
def test_admitted_slots_form_a_prefix_of_each_request(conf, data):
    a = survival(conf)
    budget = data.draw(st.integers(0, a.size))
    mask = admitted_slots(a, budget)
    lengths = allocate(a, budget)
    assert mask.sum() == budget
    for r, length in enumerate(lengths):
        assert mask[r, :length].all() and not mask[r, length:].any()


@settings(max_examples=300, deadline=None)
@given(conf_matrix(), st.data())
def test_fixed_budget_allocation_is_optimal_against_brute_force(conf, data):
    a = survival(conf)
    budget = data.draw(st.integers(0, a.size))
    lengths = allocate(a, budget)
    got = sum(a[i, :l].sum() for i, l in enumerate(lengths))
    assert got == pytest.approx(brute_best_for_budget(a, budget), abs=1e-12)


def test_allocation_of_no_budget_and_of_more_than_every_slot():
    a = survival(np.full((3, 4), 0.9))
    assert list(allocate(a, 0)) == [0, 0, 0]
    assert list(allocate(a, 100)) == [4, 4, 4]


# --- budget search ---------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(conf_matrix(), st.data())
def test_full_search_equals_brute_force_for_any_cost_table(conf, data):
    a = survival(conf)
    r, g = a.shape
    size = r * (g + 1) + 1
    table = data.draw(st.lists(st.floats(0.1, 10.0), min_size=size, max_size=size))  # not monotone
    cost = TableCost(table, draft=data.draw(st.sampled_from([0.0, 0.5, 3.0])))
    chosen = choose_budget(a, cost)
    best = brute_best_rate(a, cost)
    assert chosen.tokens_per_s == pytest.approx(best, rel=1e-12)
    lengths = allocate(a, chosen.budget)
    achieved = (r + sum(a[i, :l].sum() for i, l in enumerate(lengths))) / (
        cost.draft_seconds(r, g) + float(cost.verify_seconds(r + lengths.sum())))
    assert achieved == pytest.approx(best, rel=1e-12)


def first_local_maximum(curve) -> int:
    """The paper's Algorithm 1: the budget grows while the objective improves (greedy early stop)."""
    b = 0
    while b + 1 < len(curve) and curve[b + 1] > curve[b]:
        b += 1
    return b


def test_vllm_golden_full_search_and_early_stop_differ():
    """docs/scheduler.md, "Executable goldens": vLLM's tables from profiled curves; full search b=9, early stop b=5."""
    cost = MeasuredCost.from_samples(verify=[(1, 10), (2, 10.2), (4, 10.4), (8, 11), (16, 13)],
                                     draft=[(1, 1), (4, 1.2), (8, 1.5)], capture_sizes=[1, 2, 4, 8])
    hist = survival([[0.9, 0.8, 0.5], [0.6, 0.5, 0.4], [0.95, 0.9, 0.9]])
    full = choose_budget(hist, cost)
    expected = [.2586, .3405, .3975, .4676, .5307, .5897, .5489, .5743, .5954, .6038]
    assert np.round(full.curve / 1000.0, 4).tolist() == expected  # tokens per ms, as printed
    assert full.budget == 9
    assert first_local_maximum(full.curve) == 5


def test_deepinfer_golden_two_phase_step():
    """docs/scheduler.md, "Executable goldens" (DeepInfer replica): best_bsz 8 = 7.1945 / 14 ms, seqlens_q [2, 4, 2]."""
    cost = MeasuredCost.from_samples(verify=[(1, 10), (2, 10.5), (4, 11), (8, 14), (16, 22)],
                                     capture_sizes=[1, 2, 4, 8, 16])
    hist = [[0.9, 0.8, 0.5], [0.6, 0.5, 0.4], [0.95, 0.9, 0.9]]
    current = [[0.7, 0.7, 0.7], [0.9, 0.9, 0.9], [0.5, 0.5, 0.5]]
    chosen = choose_budget(survival(hist), cost)
    assert chosen.budget + 3 == 8
    assert chosen.tokens_per_s * 1e-3 == pytest.approx(7.1945 / 14, rel=1e-12)
    step = plan_step(hist, current, cost)
    assert list(step.lengths + 1) == [2, 4, 2] and step.tokens == 8


def test_appendix_a_objective_values():
    """Paper Appendix A: SPS(1)=1, SPS(2)=.5, SPS(3)=.45; c2=.9 gives 1.134 (verify both), c2=0 gives 0.81."""
    cost = TableCost([np.inf, 1 / 1.0, 1 / 0.5, 1 / 0.45])
    good = choose_budget(survival([[0.8, 0.9]]), cost)
    assert np.allclose(good.curve, [1.0, 0.9, 1.134]) and good.budget == 2
    bad = choose_budget(survival([[0.8, 0.0]]), cost)
    assert np.allclose(bad.curve, [1.0, 0.9, 0.81]) and bad.budget == 0
    assert first_local_maximum(good.curve) == 0  # where an early stop would end


# --- causality -----------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(conf_matrix(), st.data())
def test_budget_ignores_the_current_drafts_confidences(hist, data):
    cost = TableCost(np.linspace(1.0, 3.0, hist.size + hist.shape[0] + 1) ** 1.5)
    cur_a = np.array([[data.draw(conf_value) for _ in row] for row in hist])
    cur_b = np.array([[data.draw(conf_value) for _ in row] for row in hist])
    assert plan_step(hist, cur_a, cost).budget == plan_step(hist, cur_b, cost).budget


@settings(max_examples=300, deadline=None)
@given(conf_matrix(), st.data())
def test_admission_of_a_slot_ignores_later_positions(conf, data):
    r_count, g = conf.shape
    budget = data.draw(st.integers(0, conf.size))
    r = data.draw(st.integers(0, r_count - 1))
    j = data.draw(st.integers(0, g - 1))
    before = admitted_slots(survival(conf), budget)[r, j]
    changed = conf.copy()
    # Later positions of the same request: anything, including 1.0 (an exact tie with a[r, j]).
    changed[r, j + 1:] = [data.draw(st.sampled_from([0.0, 1.0]) | st.floats(0, 1)) for _ in range(g - j - 1)]
    assert admitted_slots(survival(changed), budget)[r, j] == before


def test_first_step_without_history_treats_every_slot_as_confident():
    cost = TableCost(np.arange(1, 20, dtype=float))
    conf = np.full((2, 3), 0.1)
    plan = plan_step(np.full(conf.shape, np.nan), conf, cost)
    assert plan.budget == choose_budget(np.ones((2, 3)), cost).budget


# --- data parallel -------------------------------------------------------------------------------------


def test_dp_ranks_plan_their_own_budget_and_pay_for_the_largest_rank():
    """simulate's DP path: each rank's two-phase step on its own requests, every rank charged the largest."""
    cost = MeasuredCost.from_samples(verify=[(1, 10), (2, 10.5), (4, 11), (8, 14), (16, 22)],
                                     capture_sizes=[1, 2, 4, 8, 16])
    confident, doubtful = [[0.9, 0.8, 0.5], [0.6, 0.5, 0.4]], [[0.1, 0.1, 0.1], [0.1, 0.1, 0.1]]
    tokens = [plan_step(c, c, cost).tokens for c in (confident, doubtful)]  # steady state: history == current
    assert tokens[0] != tokens[1]
    res = simulate(cost, confident + doubtful, 4, Policy("adaptive", 3), dp=2, steps=3)
    assert res.step_ms == pytest.approx(1000 * float(cost.verify_seconds(max(tokens))), rel=1e-12)
    assert res.verified_drafts_per_request == pytest.approx((tokens[0] + tokens[1] - 4) / 4)


def test_zero_requests_plan_an_empty_step():
    cost = MeasuredCost.from_samples(verify=[(1, 10), (8, 14)], capture_sizes=[1, 8])
    step = plan_step(np.zeros((0, 5)), np.zeros((0, 5)), cost)
    assert step.budget == 0 and step.tokens == 0 and step.lengths.shape == (0,)
    curve = choose_budget(np.zeros((0, 5)), cost).curve
    assert not np.isnan(curve).any()
