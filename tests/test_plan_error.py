"""`plan` recommends only what its stated error supports, and plans past the recipe's max_num_seqs (issue #29).

Real: the resolver's profiles, the calibrated step model (recipes/step_cost.yaml) and the simulator. The planted
cases below change only the stated error of a real plan, so the point predictions are the model's own.
"""

from __future__ import annotations

import dataclasses

import pytest

from rocm_dspark.planner.profile import plan_profile
from rocm_dspark.planner.recommend import DECIDE, gain_over_block_pct, hold_to_error
from rocm_dspark.recipe.catalog import load_catalog
from tests.helpers import run_cli

GRID = [1, 16, 64, 128]


@pytest.fixture(scope="module")
def mi300x():
    catalog = load_catalog()
    return plan_profile(catalog, catalog.find_model("V4.1-Flash"), "mi300x", concurrencies=GRID)


def test_every_verdict_uncertain_recommends_no_arm_over_block(mi300x):
    assert {mi300x.payoff(r) for r in mi300x.rows} == {"uncertain"}
    assert mi300x.recommended == "block" and mi300x.speculative_config == {"num_speculative_tokens": mi300x.gamma}
    line = mi300x.recommendation
    assert line.startswith(f"block verification: num_speculative_tokens={mi300x.gamma}: no setting beats it beyond "
                           "the stated error")
    assert "`rocm-dspark validate --ab --concurrency C`" in line and "`rocm-dspark plan --calibrate FILE`" in line
    # The table keeps the point predictions: adaptive's predicted gain is still there, positive at c128.
    assert mi300x.adaptive_gain_pct(mi300x.rows[-1]) > 0 and gain_over_block_pct(mi300x, "adaptive") > 0


def _with_error(plan, tok_s_pct, gain_pp):
    planted = dataclasses.replace(plan, scores=dict(plan.scores), notes=list(plan.notes))
    planted.error_pct, planted.payoff_error_pp, planted.recommended = tok_s_pct, gain_pp, "adaptive"
    hold_to_error(planted)
    return planted


def test_a_planted_pays_within_the_error_is_not_a_recommendation(mi300x):
    gain = gain_over_block_pct(mi300x, "adaptive")
    best_row = max(mi300x.adaptive_gain_pct(r) for r in mi300x.rows)
    err = (gain + best_row) / 2  # one row "pays" beyond it, the grid's gain is within it
    planted = _with_error(mi300x, 200.0, err)
    assert any(planted.payoff(r) == "pays" for r in planted.rows)
    assert planted.recommended == "block" and DECIDE in planted.recommendation


def test_a_gain_beyond_the_error_is_recommended_and_says_by_how_much(mi300x):
    gain = gain_over_block_pct(mi300x, "adaptive")
    planted = _with_error(mi300x, 200.0, 1.0)
    assert planted.recommended == "adaptive"
    assert planted.recommendation.endswith(f"; {gain:+.1f}% over block verification, beyond the stated error +-1")


def test_no_stated_error_changes_nothing(mi300x):
    planted = dataclasses.replace(mi300x, error_pct=None, recommended="adaptive")
    hold_to_error(planted)
    assert planted.recommended == "adaptive"


def test_max_num_seqs_plans_past_128_and_prices_the_capture_overrun():
    catalog = load_catalog()
    model = catalog.find_model("V4.1-Flash")
    default = plan_profile(catalog, model, "mi300x", concurrencies=[512])
    assert default.rows[0].batch == 128  # the recipe's max_num_seqs: the rest queue
    raised = plan_profile(catalog, model, "mi300x", concurrencies=[256, 512], max_num_seqs=512)
    assert [r.batch for r in raised.rows] == [256, 512]
    # 512 x (1+5) = 3072 tokens: above the cap, so the recipe's capture size stays at the cap and K4-5 overrun.
    assert any("max_num_seqs 512: the recipe's capture size stays at 2048" in n for n in raised.notes)
    assert [(c["concurrency"], c["k"]) for c in raised.capture_overruns] == [(512, 4), (512, 5)]
    held = plan_profile(catalog, model, "mi300x", concurrencies=[512], max_num_seqs=512, capture_size=4096)
    assert held.capture_overruns == []
    # The overrun is priced: block verification at c512 is slower with the graphs it overruns.
    assert (held.rows[0].fixed[5].expected_tokens_per_s > raised.rows[1].fixed[5].expected_tokens_per_s)


def test_the_cli_takes_max_num_seqs_and_refuses_zero():

    from tests.conftest import cli_env

    ok = run_cli(["plan", "--gpu", "mi300x", "--concurrency", "256", "--max-num-seqs", "256", "--json"],
                        capture_output=True, text=True, env=cli_env())
    assert ok.returncode == 0, ok.stderr
    import json

    assert json.loads(ok.stdout)["plans"][0]["rows"][0]["batch"] == 256
    bad = run_cli(["plan", "--gpu", "mi300x", "--max-num-seqs", "0"], capture_output=True, text=True,
                         env=cli_env())
    assert bad.returncode == 2 and "--max-num-seqs" in bad.stderr
