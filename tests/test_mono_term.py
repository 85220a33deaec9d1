"""The planner's mono decode term (rocm_dspark/planner/mono_term.py): per row, whether --monokernel runs at the
profile's layout and what the public per-layer figure predicts; public and uncalibrated, with its range as the
error. The independent reference is the same public source's end-to-end figure (1.30-1.66x P90 interactivity
at concurrency 1-8), which the predicted range must overlap. Not yet run on MI300-class hardware."""

from __future__ import annotations

import json

import pytest

from rocm_dspark.planner.profile import plan_profile
from rocm_dspark.recipe.catalog import load_catalog
from tests.conftest import cli_env
from tests.helpers import run_cli

CAT = load_catalog()
V41 = CAT.find_model("V4.1-Flash")


def test_mono_runs_within_the_rows_and_its_range_overlaps_the_public_end_to_end_figure():
    plan = plan_profile(CAT, V41, "mi355x", concurrencies=[1, 4, 8, 9, 64])
    by = {m["concurrency"]: m for m in plan.mono}
    assert [c for c, m in by.items() if m["on"]] == [1, 4, 8]  # 9 x 6 = 54 > 48 rows
    lo, hi = CAT.mono["public_gain"]["per_layer"]
    ilo, ihi = CAT.mono["public_gain"]["interactivity"]
    for row in plan.rows:
        m = by[row.concurrency]
        if not m["on"]:
            assert "rows > 48" in m["why"] and "tok_s" not in m
            continue
        a, b = m["speedup"]
        assert 1.0 < a < b and a <= lo and b <= hi  # the draft and per-request work are not sped up
        assert a < ihi and b > ilo, (row.concurrency, m)  # overlaps the public P90 interactivity range
        base = row.at_k(plan.fixed_k).expected_tokens_per_s
        assert m["tok_s"] == [pytest.approx(base * a, abs=0.1), pytest.approx(base * b, abs=0.1)]
    note = next(n for n in plan.notes if n.startswith("mono decode"))
    assert "public, uncalibrated" in note and "not yet run on MI300-class hardware" in note


def test_tp8_profile_is_off_at_every_row_with_the_reason():
    plan = plan_profile(CAT, V41, "mi300x", concurrencies=[1, 4])
    assert plan.mono and not any(m["on"] for m in plan.mono)
    assert any("off at every planned concurrency (TP 8 (the gfx942 kernels take TP 4)" in n for n in plan.notes)


def test_plan_cli_shows_mono_per_row():
    proc = run_cli(["plan", "--gpu", "mi355x", "--concurrency", "1,4,8,64"], capture_output=True,
                          text=True, env=cli_env())
    assert proc.returncode == 0, proc.stderr
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip().startswith("mono decode: ")]
    assert len(lines) == 4 and all("ON (" in ln and "public, uncalibrated" in ln for ln in lines[:3])
    assert lines[3].startswith("mono decode: off: 64 requests")
    js = run_cli(["plan", "--gpu", "mi355x", "--concurrency", "4", "--json"], capture_output=True,
                        text=True, env=cli_env())
    row = json.loads(js.stdout)["plans"][0]["rows"][0]
    assert row["mono"]["on"] and row["mono"]["rows"] == 24 and len(row["mono"]["tok_s"]) == 2
