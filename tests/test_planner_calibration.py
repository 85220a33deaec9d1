"""The calibrated step-cost model: refit from the public data, held-out error within the stated bound,
the public trend reproduced, and sparse measured tables interpolated (issue #12 items 1 and 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from rocm_dspark.planner import calibration as C
from rocm_dspark.planner.cost_table import MeasuredCost, load_cost_table
from tests.helpers import run_cli

# The bounds the README and `plan` state for the calibration setting. Changing the model or the data
# so that the held-out error grows past them fails here.
HELD_OUT_TOK_S_BOUND_PCT = 15.0
HELD_OUT_GAIN_BOUND_PP = 12.0


@pytest.fixture(scope="module")
def fits():
    """fit() once, keeping each capture reading's own fit (fit_reading) for the tests that compare the readings:
    the same fits fit() makes, not a second run of them."""
    readings = {}
    real = C.fit_reading

    def keep(data, catalog, largest):
        readings[largest] = real(data, catalog, largest)
        return readings[largest]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(C, "fit_reading", keep)
        calib = C.fit()
    assert sorted(readings) == [512, 2048]
    return calib, readings


@pytest.fixture(scope="module")
def refit(fits):
    return fits[0]


def test_refit_matches_the_stored_fit(refit):
    """recipes/step_cost.yaml's `fit:` is the output of fit(), not hand-tuned numbers."""
    stored = C.stored()
    # On failure: the data or recipes/models changed; refit with
    # `python scripts/refit_step_cost.py --write`, then regenerate the payoff table.
    for name in ("fixed_ms", "per_request_ms", "per_token_ms", "draft_ms", "adaptive_ms", "rho", "spread",
                 "eager_launch_ms", "eager_per_token_ms"):
        assert getattr(refit.params, name) == pytest.approx(getattr(stored.params, name), abs=1e-5), name
    assert refit.acceptance_length == stored.acceptance_length
    assert refit.held_out_error_pct == stored.held_out_error_pct
    assert refit.held_out_payoff_error_pp == stored.held_out_payoff_error_pp
    assert refit.cross_build_spread_pct == stored.cross_build_spread_pct


def test_the_fit_block_carries_every_fitted_field_and_reads_back_as_fitted(refit):
    """fit() -> fit_block() (what scripts/refit_step_cost.py --write stores) -> stored(): one list of the fields,
    so a field the fit gains cannot be dropped on the way to `plan`; read back unrounded, it is the fit."""
    from dataclasses import fields

    provenance = {"source_url", "source_label", "model", "gpu", "tp", "bandwidth_efficiency", "rows", "readings",
                  "host", "not_identified", "params", "notes", "mono"}  # mono: a host fit's (host_fit._mono_term)
    block = C.fit_block(refit)
    assert set(block) == {f.name for f in fields(C.StepParams)} | {f.name for f in fields(C.Calibration)} - provenance
    data = C.load_data()
    assert list(block) == list(data["fit"])  # the file's own order: a --write rewrites only the numbers
    back = C.stored({**data, "fit": block})
    for f in fields(C.Calibration):
        if f.compare:
            assert getattr(back, f.name) == getattr(refit, f.name), f.name


def test_held_out_error_within_the_stated_bound(refit):
    held = [r for r in refit.rows if r["part"] == "held-out"]
    assert {r["concurrency"] for r in held} == {8, 32, 128}
    # Recompute the error from the rows (measured numbers are the public ones, copied in the data file).
    worst = max(abs(p / m - 1) * 100 for r in held for p, m in zip(r["predicted"], r["measured"]))
    assert worst == pytest.approx(refit.fit_held_out_error_pct, abs=0.05)
    assert worst <= HELD_OUT_TOK_S_BOUND_PCT
    gain = max(abs(r["adaptive_gain_pct"][1] - r["adaptive_gain_pct"][0]) for r in held)
    assert gain <= HELD_OUT_GAIN_BOUND_PP


# docs/calibration.md: vllm#52362's capture size is unpublished, so both readings are fitted and the
# stated error adds their largest difference. These are the documented figures.
DOC_HELD_OUT = {512: (33.9, 57.4), 2048: (14.1, 11.7)}
DOC_STATED = (44.0, 57.3)


def test_both_capture_readings_are_fitted_and_the_stated_error_covers_them(fits):
    refit, readings = fits
    assert refit.capture_known is False
    got = {r["capture_size"]: (r["held_out_error_pct"], r["held_out_payoff_error_pp"]) for r in refit.readings}
    assert got == DOC_HELD_OUT
    assert (refit.held_out_error_pct, refit.held_out_payoff_error_pp) == DOC_STATED
    other = readings[512]
    diff_pct = max(abs(p / q - 1) * 100 for a, b in zip(refit.rows, other.rows)
                   for p, q in zip(a["predicted"], b["predicted"]))
    diff_pp = max(abs(a["adaptive_gain_pct"][1] - b["adaptive_gain_pct"][1]) for a, b in zip(refit.rows, other.rows))
    # covering: if the other reading is the true one, every prediction moves by at most what is added
    assert refit.held_out_error_pct >= refit.fit_held_out_error_pct + diff_pct - 0.1
    assert refit.held_out_payoff_error_pp >= refit.fit_held_out_payoff_error_pp + diff_pp - 0.1
    # the 512 reading is the one where fixed K=7 at c128/c256 leaves the graphs: the eager term is fitted there
    assert other.params.eager_launch_ms > 0 and refit.params.eager_launch_ms == other.params.eager_launch_ms


# docs/calibration.md: leave one concurrency of vllm#52362 out, fit the other six (reading 2048, the kept
# one). The worst cells are the two where fixed K=7 collapses; the other five are within 5.2% and 8.1 points.
DOC_LOO = {128: (12.9, 10.4), 256: (30.3, 45.5)}


def test_leave_one_concurrency_out_on_vllm52362_matches_the_documented_figures():
    from rocm_dspark.recipe.catalog import load_catalog

    pct, pp, cells = C.leave_one_out(C.load_data(), load_catalog(), 2048, only=sorted(DOC_LOO))
    assert {c: (a, b) for c, a, b in cells} == DOC_LOO
    assert (pct, pp) == (30.3, 45.5)


def test_the_refit_prints_old_and_new_held_out_error(refit, monkeypatch, capsys):
    # The script stands alone (its own sys.path, imports, options) ...
    proc = subprocess.run([sys.executable, "scripts/refit_step_cost.py", "--help"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "--write" in proc.stdout, proc.stderr
    # ... and its main() prints this fit (the module's one, not a second identical refit of the same data).
    import importlib.util

    spec = importlib.util.spec_from_file_location("refit_step_cost", "scripts/refit_step_cost.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "fit", lambda data: refit if data == C.load_data() else pytest.fail("another data"))
    assert script.main([]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("held-out error, previous fit"))
    assert "14.1% tok/s, 11.7 points" in line and "covering the readings: 44% and 57.3 points" in line
    assert "capture reading 512" in out and "capture reading 2048" in out


def test_data_points_are_the_public_ones():
    """Spot-check against the vllm#52362 table as published (c4 and c256 rows) and the MI355X rerun."""
    data = C.load_data()
    table = data["sources"]["vllm52362"]["output_tok_s"]
    assert table[4] == [381.53, 970.33, 902.37] and table[256] == [8878.57, 7852.42, 13324.67]
    assert data["sources"]["vllm52362_mi355x"]["output_tok_s"][8] == [500.33, 1255.57, 1084.48]
    for source in data["sources"].values():
        assert source["url"].startswith("https://github.com/")


def test_the_blog_capture_pair_shows_the_cliff_the_issue_quotes():
    """Fixed K=7 at c256 against no speculation: -52.7% with capture size 1024, +20.3% with 4096
    (the vLLM blog's two versions, read from its figure; step_cost.yaml says how)."""
    pair = C.load_data()["capture_evidence"]["vllm_blog_b300"]
    runs = {r["max_cudagraph_capture_size"]: r["output_tok_s"] for r in pair["runs"]}
    i = pair["concurrency"].index(256)
    rel = {cap: round(100 * (t["k7"][i] / t["none"][i] - 1), 1) for cap, t in runs.items()}
    assert rel == {1024: -52.7, 4096: 20.3}
    # no speculation barely moves between the runs (within 2%), so the spec arms' drop is not the workload's
    assert all(abs(a / b - 1) < 0.02 for a, b in zip(runs[1024]["none"], runs[4096]["none"]))
    # every arm whose verify batch (256 x (1+K)) exceeds 1024 loses at least 40% against the 4096 run
    for k in (5, 6, 7):
        assert runs[1024][f"k{k}"][i] < 0.6 * runs[4096][f"k{k}"][i]


def test_the_model_reproduces_the_public_trend(refit):
    """Speculation gains most at low concurrency and least at high; adaptive loses at low and wins at
    high concurrency (the shape of vllm#52362), in the fitted model's own predictions."""
    rows = sorted(refit.rows, key=lambda r: r["concurrency"])
    speedup = [r["predicted"][1] / r["predicted"][0] for r in rows]
    assert speedup[0] > 2.0 and speedup[-1] < 1.1
    assert all(a >= b for a, b in zip(speedup, speedup[1:]))
    gains = [r["adaptive_gain_pct"][1] for r in rows]
    assert gains[0] < 0 < gains[-1]


def test_fixed_per_step_time_is_not_left_out(refit):
    """The seed roofline predicted a 0.25 ms step at batch 1; the fit has a fixed term of milliseconds."""
    assert refit.params.fixed_ms > 3.0


def test_the_plan_prints_source_and_error_next_to_the_predictions():
    proc = run_cli(["plan", "--gpu", "mi355x", "--concurrency", "1,128"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "error: every tok/s below: within +-" in out and "vllm#52362" in out
    assert "https://github.com/vllm-project/vllm/pull/52362" in out
    lines = [line for line in out.splitlines() if line.strip().startswith(("1 ", "128 "))]
    batch1 = lines[0].split("|")
    no_spec, fixed = float(batch1[1]), float(batch1[2].split()[0])
    assert fixed > 1.5 * no_spec  # speculation pays at batch 1 (the seed model said the opposite)
    assert no_spec < 300  # not a 0.25 ms step


def test_json_carries_the_error():
    proc = run_cli(["plan", "--gpu", "mi350x", "--concurrency", "64",
                           "--json"], capture_output=True, text=True, timeout=300)
    plan = json.loads(proc.stdout)["plans"][0]
    assert plan["error"]["tok_s_pct"] > HELD_OUT_TOK_S_BOUND_PCT  # transferred: held out + cross-build spread
    assert plan["rows"][0]["adaptive_payoff"] in ("pays", "loses", "uncertain")


def test_calibration_setting_states_the_held_out_error():
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.planner.profile import plan_profile

    catalog = load_catalog()
    plan = plan_profile(catalog, catalog.find_model("V4-Flash"), "mi350x", concurrencies=[4, 256],
                        acceptance_length=4.84, steps=50)
    assert plan.error_pct == C.stored().held_out_error_pct
    assert "this is the calibration setting" in " ".join(plan.notes)


# --- sparse measured tables: interpolation --------------------------------------------------------------


def sparse():
    return MeasuredCost.from_samples(verify=[(4, 10.0), (32, 14.0), (256, 40.0)],
                                     capture_sizes=[1, 2, 4, 8, 16, 24, 32, 64, 128, 256, 512])


def test_sparse_table_interpolates_between_samples_not_steps_up():
    cost = sparse()
    assert not cost.dense
    ms = cost.verify_seconds(np.array([4, 8, 16, 32, 64, 128, 256])) * 1e3
    assert ms.tolist() == pytest.approx([10.0, 10 + 4 * 4 / 28, 10 + 4 * 12 / 28, 14.0,
                                         14 + 26 * 32 / 224, 14 + 26 * 96 / 224, 40.0])
    # Padded first: 17 tokens run the 24-token graph.
    assert cost.verify_seconds(17) * 1e3 == pytest.approx(10 + 4 * 20 / 28)


def test_sparse_interpolation_properties():
    """Equal to the sample at every sample, monotone, between its neighbours, flat below the first."""
    rng = np.random.default_rng(1)
    for _ in range(50):
        xs = np.unique(rng.integers(1, 600, 5))
        ys = np.cumsum(rng.uniform(0.1, 5.0, xs.size)) + 5
        cost = MeasuredCost.from_samples(verify=list(zip(xs.tolist(), ys.tolist())))
        assert (cost.verify_seconds(xs) * 1e3).tolist() == pytest.approx(ys.tolist())
        grid = np.arange(1, 700)
        ms = cost.verify_seconds(grid) * 1e3
        assert (np.diff(ms) >= -1e-9).all()
        inside = (grid >= xs[0]) & (grid <= xs[-1])
        assert (ms[inside] >= ys[0] - 1e-9).all() and (ms[inside] <= ys[-1] + 1e-9).all()
        assert (ms[grid < xs[0]] == pytest.approx(ys[0]))


def test_dense_table_keeps_vllms_step_rule():
    cost = MeasuredCost.from_samples(verify=[(1, 10), (2, 10.2), (4, 10.4), (8, 11)], capture_sizes=[1, 2, 4, 8])
    assert cost.dense and cost.verify_seconds(3) * 1e3 == pytest.approx(10.4)


def test_far_from_samples_is_warned():
    cost = sparse()
    assert cost.far_sizes([1, 4, 40, 512, 600]) == [1, 600]  # 512 is exactly 2x from 256: near enough
    assert any("sparse" in n for n in cost.notes())


def test_includes_draft_round_trips(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"verify": [[4, 10], [32, 14]], "includes_draft": True, "samples": []}))
    assert load_cost_table(path).includes_draft is True
    path.write_text(json.dumps({"verify": [[4, 10]], "includes_draft": "yes"}))
    with pytest.raises(Exception, match="includes_draft"):
        load_cost_table(path)


def test_a_tie_the_data_cannot_break_goes_to_the_earliest_column_whatever_the_rounding():
    # Columns 1 and 2 proportional (the two eager columns when every step above the capture size has the same
    # token count): either alone fits equally, up to rounding. The old strict `<` let BLAS rounding pick.
    import numpy as np

    rng = np.random.default_rng(3)
    picks = set()
    for _ in range(200):
        t = rng.uniform(1, 9)
        a = np.array([[1.0, 60.0, t * 60.0 / 7], [1.0, 0.0, 0.0], [1.0, 60.0, t * 60.0 / 7], [1.0, 0.0, 0.0]])
        a = a * rng.uniform(0.5, 2.0, size=(4, 1))
        b = a @ np.array([0.3, 0.01, 0.0]) * (1 + rng.normal(0, 1e-3, size=4))
        x, resid = C.nonneg_lstsq(a, b)
        picks.add((x[1] > 0, x[2] > 0))
        assert resid == pytest.approx(float(np.sum((a @ x - b) ** 2)))
    assert picks == {(True, False)}
