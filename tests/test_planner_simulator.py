"""Acceptance inputs, the Monte-Carlo simulator and the recommendation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.planner.acceptance import (
    expected_tokens_per_round, geometric_rates, parse_rates, synthetic_rates,
)
from rocm_dspark.planner.recommend import per_batch_size_schedule, plan_grid
from rocm_dspark.planner.seed.example import adaptive_table, seed_confidences, seed_cost
from rocm_dspark.planner.simulator import Policy, simulate
from rocm_dspark.planner.seed.torch_draws import TorchCpuDraws

# --- acceptance inputs ---------------------------------------------------------------------------------


def test_synthetic_length_resolves_like_vllm():
    # docs/scheduler.md, "Synthetic acceptance": L=3.78, gamma=7 -> [1,1,0.78,0,...]; L=3.51, gamma=5 -> [1,1,0.51,0,0]
    assert synthetic_rates(3.78, 7) == pytest.approx([1, 1, 0.78, 0, 0, 0, 0])
    assert synthetic_rates(3.51, 5) == pytest.approx([1, 1, 0.51, 0, 0])
    assert synthetic_rates(6.0, 5) == [1.0] * 5
    assert synthetic_rates(1.0, 3) == [0.0, 0.0, 0.0]
    for length in (1.0, 2.2, 3.51, 4.99, 6.0):
        assert expected_tokens_per_round(synthetic_rates(length, 5)) == pytest.approx(length)
        assert expected_tokens_per_round(geometric_rates(length, 5)) == pytest.approx(length, abs=1e-12)
    with pytest.raises(UsageError):
        synthetic_rates(6.5, 5)
    with pytest.raises(UsageError):
        geometric_rates(0.5, 5)


def test_parse_rates():
    assert parse_rates("0.9, 0.8", 5) == [0.9, 0.8, 0.0, 0.0, 0.0]
    for bad in ("0.9,x", "1.2", "", "0.9,0.8,0.7,0.6,0.5,0.4"):
        with pytest.raises(UsageError):
            parse_rates(bad, 5)


# --- simulator -----------------------------------------------------------------------------------------


def _se_of_mean_emitted(rates, k, n):
    """Standard error of the mean tokens per request-step for n independent request-steps."""
    surv = np.cumprod(rates[:k])
    probs = np.append(1 - surv[:1], surv[:-1] - surv[1:]) if k else np.array([])
    # P(accepted = i) for i < k, and P(accepted = k) = surv[k-1]
    values = np.arange(k + 1)
    pmf = np.append(probs, surv[-1]) if k else np.array([1.0])
    mean = (values * pmf).sum()
    return math.sqrt(((values - mean) ** 2 * pmf).sum() / n)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_fixed_k_simulation_matches_the_closed_form(k):
    rates = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    cost = seed_cost(block=True)
    batch = 16
    res = simulate(cost, rates, batch, Policy("fixed", k), seed=11)
    step = cost.draft_seconds(batch, k) + float(cost.verify_seconds(batch * (1 + k)))
    closed_form = batch * expected_tokens_per_round(rates[:k]) / step
    assert res.expected_tokens_per_s == pytest.approx(closed_form, rel=1e-12)
    se = _se_of_mean_emitted(rates, k, res.steps * batch)
    assert abs(res.mean_acceptance_length - expected_tokens_per_round(rates[:k])) < 5 * se
    assert res.verified_drafts_per_request == k and res.step_ms == pytest.approx(step * 1000)


def test_synthetic_schedule_gives_its_length_exactly_in_distribution():
    rates = synthetic_rates(3.78, 7)
    res = simulate(seed_cost(True), rates, 8, Policy("fixed", 7), seed=3, steps=25_000)
    # accepted drafts are 2 or 3, P(3) = 0.78: mean 3.78 tokens with variance .78 x .22
    assert abs(res.mean_acceptance_length - 3.78) < 5 * math.sqrt(0.78 * 0.22 / (25_000 * 8))


def test_no_speculation_emits_one_token_per_request_step():
    res = simulate(seed_cost(True), [0.9] * 4, 32, Policy("none"))
    assert res.mean_acceptance_length == 1.0 and res.verified_drafts_per_request == 0.0
    assert res.tokens_per_s == pytest.approx(32 / float(seed_cost(True).verify_seconds(32)))


def test_adaptive_simulation_reproduces_the_seed_adaptive_rows():
    """The seed's half-accurate workload as per-request rates: the simulator's two-phase scheduler
    (history = last step's confidences) lands on the seed's plan: 57 slots and 29053 tok/s at 128."""
    draws = TorchCpuDraws(0)
    seed_rows = {r.batch: r for r in adaptive_table()}
    for batch in (16, 128, 512):
        conf = seed_confidences(draws, batch)
        res = simulate(seed_cost(True), conf, batch, Policy("adaptive", 7), steps=300)
        assert res.verified_drafts_per_request * batch == pytest.approx(seed_rows[batch].admitted)
        assert res.expected_tokens_per_s == pytest.approx(seed_rows[batch].adaptive_tokens_per_s, rel=1e-9)


def test_common_random_numbers_make_equal_plans_equal():
    rates = [0.9, 0.9, 0.9]
    a = simulate(seed_cost(True), rates, 4, Policy("fixed", 3), seed=5)
    b = simulate(seed_cost(True), rates, 4, Policy("adaptive", 3), seed=5)   # adaptive verifies all here
    assert b.verified_drafts_per_request == 3
    assert a.mean_acceptance_length == b.mean_acceptance_length


def test_dp_ranks_are_charged_for_the_largest_rank():
    cost = seed_cost(True)
    res = simulate(cost, [0.8] * 3, 5, Policy("fixed", 3), dp=2, steps=50)    # ranks of 3 and 2 requests
    assert res.step_ms == pytest.approx(1000 * (cost.draft_seconds(3, 3) + float(cost.verify_seconds(3 * 4))))
    res = simulate(cost, [0.8] * 3, 5, Policy("adaptive", 3), dp=2, steps=50)
    assert res.steps == 50 and res.tokens_per_s > 0


# --- recommendation ------------------------------------------------------------------------------------


def test_per_batch_size_schedule_is_vllms_inclusive_ranges():
    assert per_batch_size_schedule([(1, 8), (32, 5), (128, 1), (512, 0)], 512) == [
        (1, 1, 8), (2, 32, 5), (33, 128, 1), (129, 512, 0)]
    assert per_batch_size_schedule([(1, 3), (16, 3), (64, 2)], 128) == [(1, 16, 3), (17, 128, 2)]
    assert per_batch_size_schedule([(4, 5)], 4) == [(1, 4, 5)]


def test_plan_grid_on_the_seed_model_finds_the_seed_best_k():
    plan = plan_grid(seed_cost(True), [0.8] * 8, [1, 32, 128, 512], gamma=8)
    assert [r.best_k for r in plan.rows] == [8, 5, 1, 0]           # the seed's block-draft column
    assert plan.schedule == [(1, 1, 8), (2, 32, 5), (33, 128, 1), (129, 512, 0)]
    assert plan.recommended == "per_batch_size"
    assert plan.speculative_config == {"num_speculative_tokens": 8,
                                       "num_speculative_tokens_per_batch_size": [[1, 1, 8], [2, 32, 5],
                                                                                 [33, 128, 1], [129, 512, 0]]}
    # per-batch-size K is within the tolerance of adaptive here, and simpler
    assert plan.scores["adaptive"] >= plan.scores["per_batch_size"] > plan.scores["fixed"]


def test_plan_grid_prefers_no_speculation_when_drafts_never_pay():
    plan = plan_grid(seed_cost(True), [0.05] * 4, [256, 512], gamma=4)
    assert plan.recommended == "none" and plan.speculative_config == {}


def test_plan_grid_caps_the_batch_and_skips_per_batch_size_k_under_dp():
    plan = plan_grid(seed_cost(True), [0.8] * 4, [8, 64], gamma=4, max_num_seqs=16, dp=2)
    assert [r.batch for r in plan.rows] == [8, 32]
    assert plan.schedule is None and "per_batch_size" not in plan.scores
    assert any("data_parallel_size > 1" in n for n in plan.notes)
    assert any("exceeds max_num_seqs" in n for n in plan.notes)


def test_adaptive_is_recommended_only_where_it_is_allowed():
    """Half accurate / half inaccurate requests (the seed's workload): adaptive beats every fixed K by
    more than the tolerance; when the build refuses it, the next best is recommended and the gain noted."""
    conf = seed_confidences(TorchCpuDraws(0), 128)
    plan = plan_grid(seed_cost(True), conf, [128], gamma=7)
    assert plan.recommended == "adaptive"
    assert plan.speculative_config == {"num_speculative_tokens": 7, "enable_adaptive_verification": True}
    assert plan.scores["adaptive"] > 1.1 * plan.scores["fixed"]
    blocked = plan_grid(seed_cost(True), conf, [128], gamma=7, adaptive_allowed=False,
                        adaptive_blocker="vLLM 0.30 refuses it")
    assert blocked.recommended == "fixed" and blocked.fixed_k == 1
    assert any("predicted +" in n and "vLLM 0.30 refuses it" in n for n in blocked.notes)
