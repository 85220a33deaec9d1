"""`plan --calibrate` on host runs with and without --monokernel (issue 37): the mono term (verify step / s,
planner/mono_term.py) fitted from runs tagged mono, kept only where mono runs at two or more concurrencies
identify it within the leave-one-out bound; without mono runs it stays public and uncalibrated, said so.

The tables are synthetic, generated from known parameters by the model's own predictor (recovering s checks the
fit, not the kernels): no mono run exists yet, the kernels are not yet run on MI300-class hardware."""

from __future__ import annotations

import csv
import json

import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.planner import host_fit as H
from rocm_dspark.planner.calibration import physics_for, predict_run_tok_s
from rocm_dspark.planner.profile import plan_profile
from rocm_dspark.probe import calibration_record as R
from tests.helpers.host_fit_tables import CAT, MODEL, TRUE, state, synthetic_rows

S = 1.5  # the true verify-step speedup of the synthetic mono runs


def _mono_rows(gpu="mi355x", s=S, at=((4, "none", 0, 1.0), (4, "k5", 5, 3.5), (8, "k5", 5, 3.5),
                                       (16, "none", 0, 1.0))):
    g = CAT.find_gpu(gpu)
    physics = physics_for(MODEL, g, MODEL.profiles[g.key].tp, 0.8)
    out = []
    for c, arm, k, al in at:
        r = {"arm": f"{arm}-mono", "k": k, "adaptive": False, "mono": True, "concurrency": c, "capture_size": 512,
             "acceptance_length": al}
        r["output_tok_s"] = round(predict_run_tok_s(TRUE, physics, r, s), 4)
        out.append(r)
    return out


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*H.COLUMNS, "mono"])
        w.writeheader()
        w.writerows([{**r, "mono": str(r.get("mono", False)).lower()} for r in rows])
    return path


def test_mono_runs_at_two_concurrencies_recover_the_speedup_and_plan_uses_it(tmp_path):
    rows = synthetic_rows("mi355x", concurrencies=(4, 8, 16, 64, 128)) + _mono_rows()
    calib, loo, used = H.calibrate(_write(tmp_path / "runs.csv", rows), CAT, MODEL, "mi355x")
    assert calib.mono is not None and calib.mono["speedup"] == pytest.approx(S, abs=0.01)
    assert calib.mono["runs"] == 4 and calib.mono["loo_error_pct"] < 1 and "mono" not in calib.not_identified
    # the step model is fitted to the runs without mono: still the true parameters
    assert calib.params.fixed_ms == pytest.approx(TRUE.fixed_ms, abs=1e-3)
    plan = plan_profile(CAT, MODEL, "mi355x", concurrencies=[4, 64], steps=1, calibration=calib)
    on = next(m for m in plan.mono if m["concurrency"] == 4)
    assert on["on"] and on["source"] == "host" and on["speedup"][0] == on["speedup"][1] > 1
    base = plan.rows[0].at_k(plan.fixed_k).expected_tokens_per_s
    assert on["tok_s"][0] - 1 <= base * on["speedup"][0] <= on["tok_s"][1] + 1  # speedup rounded to 3 places
    assert not next(m for m in plan.mono if m["concurrency"] == 64)["on"]
    assert any(n.startswith("mono decode (--monokernel): this host's term") for n in plan.notes)


def test_the_kept_record_carries_the_mono_term_and_reads_back(tmp_path):
    s = state(tmp_path)
    table = _write(tmp_path / "runs.csv", synthetic_rows("mi355x", concurrencies=(4, 8, 16, 64, 128)) + _mono_rows())
    lines, kept = R.run_calibrate(CAT, MODEL, "mi355x", table, s)
    assert kept
    text = "\n".join(lines)
    assert "mono term: verify step x1/1.5 with --monokernel" in text
    assert "leave-one-out error (runs without mono)" in text
    assert [ln.split()[3] for ln in lines if "-mono" in ln and ln.strip().endswith("%")] == ["yes"] * 4
    loaded, _ = R.host_calibration(MODEL.key, "mi355x", MODEL.profiles["mi355x"].tp, s)
    assert loaded.mono == {"speedup": pytest.approx(S, abs=0.01), "loo_error_pct": loaded.mono["loo_error_pct"],
                           "runs": 4}


def test_without_mono_runs_the_term_stays_public_and_says_its_error(tmp_path):
    path = _write(tmp_path / "runs.csv", synthetic_rows("mi355x"))
    calib, _, _ = H.calibrate(path, CAT, MODEL, "mi355x")
    assert calib.mono is None and "mono" in calib.not_identified and not calib.notes
    lines, kept = R.run_calibrate(CAT, MODEL, "mi355x", path, state(tmp_path))
    (note,) = [ln for ln in lines if ln.startswith("mono term")]
    assert kept and "not identified" in note and "public 1.1-2.18x per layer" in note
    assert "public and uncalibrated, its error the range itself" in note
    plan = plan_profile(CAT, MODEL, "mi355x", concurrencies=[4], steps=1, calibration=calib)
    assert plan.mono[0]["source"] == "public"


def test_mono_runs_at_one_concurrency_are_fitted_but_not_kept(tmp_path):
    rows = synthetic_rows("mi355x") + _mono_rows(at=((4, "none", 0, 1.0), (4, "k5", 5, 3.5)))
    calib, _, _ = H.calibrate(_write(tmp_path / "runs.csv", rows), CAT, MODEL, "mi355x")
    assert calib.mono is None and "mono" in calib.not_identified
    note = next(n for n in calib.notes if n.startswith("mono term"))
    assert "x1/1.5" in note and "at one concurrency: not identified" in note


def test_a_mono_run_past_the_rows_is_fitted_as_a_run_without_it(tmp_path):
    # c64 x (1+5) = 384 rows > 48: vLLM takes its own path (mono_decode.py:618), so the run measures no mono gain
    rows = synthetic_rows("mi355x") + _mono_rows() + [
        {**next(r for r in synthetic_rows("mi355x") if r["concurrency"] == 64 and r["arm"] == "k5"),
         "arm": "k5-mono", "mono": True}]
    calib, _, used = H.calibrate(_write(tmp_path / "runs.csv", rows), CAT, MODEL, "mi355x")
    assert not next(r for r in used if r["arm"] == "k5-mono" and r["concurrency"] == 64)["mono"]
    assert any("k5-mono at c64: its decode steps do not take the kernels (384 rows > 48)" in n for n in calib.notes)
    assert calib.mono["speedup"] == pytest.approx(S, abs=0.01)


def test_a_slower_mono_is_fitted_as_such(tmp_path):
    rows = synthetic_rows("mi355x", concurrencies=(4, 8, 16, 64, 128)) + _mono_rows(s=0.8)
    calib, _, _ = H.calibrate(_write(tmp_path / "runs.csv", rows), CAT, MODEL, "mi355x")
    assert calib.mono["speedup"] == pytest.approx(0.8, abs=0.01)


def test_an_ab_record_is_tagged_mono_from_its_argv(tmp_path):
    argv = ["vllm", "serve", "m", "--monokernel", "--max-cudagraph-capture-size", "512", "--speculative-config"]
    rec = {"schema": "rocm-dspark/ab-record/1", "concurrency": 4, "arms": {
        "block": {"argv": [*argv, json.dumps({"num_speculative_tokens": 5})], "output_throughput_tok_s": 900.0,
                  "acceptance_length": 3.5},
        "adaptive": {"argv": [*argv, json.dumps({"num_speculative_tokens": 5, "enable_adaptive_verification": True})],
                     "output_throughput_tok_s": 880.0, "acceptance_length": 3.0}}}
    path = tmp_path / "ab.json"
    path.write_text(json.dumps(rec))
    rows = H.read_table(path)
    assert [r["mono"] for r in rows] == [True, True]


def test_a_bad_mono_value_is_one_line(tmp_path):
    rows = synthetic_rows("mi355x") + [{**_mono_rows()[0], "mono": "perhaps"}]
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*H.COLUMNS, "mono"])
        w.writeheader()
        w.writerows([{"mono": "", **r} for r in rows])
    with pytest.raises(UsageError) as exc:
        H.calibrate(path, CAT, MODEL, "mi355x")
    assert "mono 'perhaps' is not true or false" in str(exc.value) and "\n" not in str(exc.value)
