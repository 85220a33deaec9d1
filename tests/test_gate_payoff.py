"""The gate asks both (issue #12 item 4): proof (a probe record) x payoff (an A/B record, else the calibrated
prediction less its error) x override (--adaptive auto|on).

A/B records here are built and written by the real code (rocm_dspark.probe.ab_record) with numbers chosen
for the case; tests/slow/test_ab_real.py makes one from two real vLLM launches.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rocm_dspark.probe import ab_record, payoff, store
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.usecase.verdict import combine
from tests.helpers.ab_records import NOT_PROVEN, PROVEN, arm, decide, plan_of, workload, write_ab

P = {s: payoff.Payoff(s, "prediction" if s != "none" else "none", f"it {s}")
     for s in (payoff.PAYS, payoff.LOSES, payoff.UNKNOWN)}


# --- the truth table ------------------------------------------------------------------------------------


@pytest.mark.parametrize("proof", [PROVEN, NOT_PROVEN], ids=["proof", "no-proof"])
@pytest.mark.parametrize("state", [payoff.PAYS, payoff.LOSES, payoff.UNKNOWN])
@pytest.mark.parametrize("mode", ["auto", "on"])
def test_truth_table(proof, state, mode):
    verdict, warning = combine(proof, P[state], mode)
    if not proof.adaptive_proven:
        # (a) fails: off whatever the payoff (--adaptive on turns that into a usage error upstream).
        assert verdict == proof and warning is None
        return
    if mode == "on":
        assert verdict.adaptive_proven                       # (a) alone
        assert (warning is not None) == (state == payoff.LOSES)
        assert "payoff decided by prediction" in verdict.reason
        return
    assert verdict.adaptive_proven == (state == payoff.PAYS)  # auto: (a) and (b)
    assert warning is None
    assert "payoff decided by prediction: it " + state in verdict.reason
    if state != payoff.PAYS:
        assert verdict.reason.startswith("proven on this host") and "block verification stays" in verdict.reason


def test_no_declared_workload_is_unknown():
    decided = payoff.payoff_verdict(load_catalog(), plan_of(), None, state_dir="/nonexistent")
    assert decided.state == payoff.UNKNOWN and "--concurrency" in decided.text
    verdict, _ = combine(PROVEN, decided, "auto")
    assert not verdict.adaptive_proven


# --- A/B records ----------------------------------------------------------------------------------------


def test_a_matching_ab_record_decides_pays_and_loses(tmp_path, fp):
    rid, _ = write_ab(tmp_path, fp, block=1000, adaptive=1100)
    d = decide(tmp_path, fp)
    assert d.state == payoff.PAYS and d.evidence == f"A/B record {rid}" and "+10.0%" in d.text
    rid2, _ = write_ab(tmp_path, fp, block=1000, adaptive=950)   # newer: it decides
    d = decide(tmp_path, fp)
    assert d.state == payoff.LOSES and d.evidence == f"A/B record {rid2}" and "-5.0%" in d.text
    verdict, warning = combine(PROVEN, d, "on")
    assert verdict.adaptive_proven and warning and "does not pay" in warning


def test_the_ab_record_beats_the_prediction(tmp_path, fp):
    # The prediction at c=1 cannot tell (unknown); a measured A/B there decides.
    assert decide(tmp_path / "empty", fp, 1).state == payoff.UNKNOWN
    write_ab(tmp_path, fp, concurrency=1, block=100, adaptive=120)
    assert decide(tmp_path, fp, 1).state == payoff.PAYS


@pytest.mark.parametrize("case", ["override", "other-host", "other-concurrency", "failed", "tampered", "renamed"])
def test_records_that_do_not_count_fall_back_to_the_prediction(tmp_path, fp, case):
    kw = {}
    if case == "override":
        kw["override"] = {"kind": "server-json", "block": "a", "adaptive": "b"}
    if case == "other-concurrency":
        kw["concurrency"] = 16
    if case == "failed":
        kw["failed"] = 3
    fingerprint = dict(fp, gpu_count=4) if case == "other-host" else fp
    rid, path = write_ab(tmp_path, fingerprint, adaptive=5000, **kw)
    if case == "tampered":
        data = json.loads(path.read_text())
        data["arms"]["block"]["output_throughput_tok_s"] = 1.0
        path.write_text(json.dumps(data))
    if case == "renamed":
        path.rename(path.with_name("20261201T015959Z-deadbeef.json"))
    d = decide(tmp_path, fp)
    assert d.evidence == "prediction"
    words = {"override": "ran other commands", "other-host": "is for", "other-concurrency": "measured c=16",
             "failed": "requests failed", "tampered": "not a valid A/B record", "renamed": "renamed file"}[case]
    assert words in d.text


def test_ab_records_are_signed_with_the_host_key(tmp_path, fp):
    rid, path = write_ab(tmp_path, fp)
    data = json.loads(path.read_text())
    assert store.verify(data, store.read_key(tmp_path)) and oct(path.stat().st_mode & 0o777) == "0o644"
    assert oct(ab_record.directory(tmp_path).stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("case", ["unsigned", "other-key", "no-key", "future"])
def test_ab_records_nobody_here_signed_do_not_decide(tmp_path, fp, case):
    """A planted or copied A/B record (README, trust model) falls back to the prediction, with the reason."""
    rid, path = write_ab(tmp_path, fp, adaptive=5000,
                         finished_at="2099-01-01T00:00:00Z" if case == "future" else "2026-12-01T01:10:00Z")
    data = json.loads(path.read_text())
    if case == "unsigned":
        data.pop("hmac")
        path.write_text(json.dumps(data))
    if case == "other-key":  # signed on another host: a valid HMAC under a key that is not this host's
        data["hmac"] = store.signature(data, b"0" * 64)
        path.write_text(json.dumps(data))
    if case == "no-key":
        (tmp_path / store.KEY_FILE).unlink()
    d = decide(tmp_path, fp)
    assert d.evidence == "prediction"
    words = {"unsigned": f"A/B record {rid} is not signed with this host's key",
             "other-key": f"A/B record {rid} is not signed with this host's key",
             "no-key": "A/B records in ", "future": "in the future"}[case]
    assert words in d.text


def test_newest_ab_record_is_by_signed_finish_time_not_file_name(tmp_path, fp):
    late, _ = write_ab(tmp_path, fp, adaptive=1200, finished_at="2026-12-01T02:00:00Z", rid="20261201T000000Z-00000001")
    write_ab(tmp_path, fp, adaptive=900, finished_at="2026-12-01T01:00:00Z", rid="99991231T235959Z-ffffffff")
    d = decide(tmp_path, fp)
    assert d.state == payoff.PAYS and d.evidence == f"A/B record {late}"


def test_verdict_must_follow_from_the_numbers(fp):
    data = ab_record.build(record_id="20261201T010000Z-0000abcd", created_at="t", finished_at="t", toolkit_version="v",
                           host={}, selection={}, fingerprint=fp, concurrency=8, workload=workload(),
                           arms={"block": arm(100.0, concurrency=8), "adaptive": arm(90.0, concurrency=8)}, override=None)
    assert data["verdict"]["pays"] is False and data["verdict"]["text"].startswith("adaptive loses at c=8: -10.0%")
    forged = dict(data, verdict={**data["verdict"], "pays": True})
    from rocm_dspark.probe.record import content_hash

    forged["sha256"] = content_hash(forged)           # even with a recomputed digest
    with pytest.raises(Exception, match="verdict does not follow"):
        ab_record.parse_data(forged)


# --- the prediction -------------------------------------------------------------------------------------


def test_prediction_table_is_the_planners_own():
    """recipes/adaptive_payoff.yaml is what the calibrated planner predicts now (regenerated here)."""
    import yaml

    from rocm_dspark.planner import payoff_table

    assert yaml.safe_load(payoff_table.path().read_text()) == payoff_table.compute(), (
        "recipes/adaptive_payoff.yaml is stale (models, GPUs or the fit changed): regenerate it with "
        "`python -m rocm_dspark.planner.payoff_table --write`")


def test_prediction_needs_the_error_to_be_beaten():
    import yaml

    from rocm_dspark.planner import payoff_table

    prof = yaml.safe_load(payoff_table.path().read_text())["models"]["DeepSeek-V4.1-Flash"]["profiles"]["mi300x"]
    err = prof["error_pp"]
    for c, gain in prof["gain_pct"].items():
        d = payoff.predicted("DeepSeek-V4.1-Flash", "mi300x", c)
        assert d.state == (payoff.PAYS if gain - err > 0 else payoff.LOSES if gain + err < 0 else payoff.UNKNOWN)
    # Issue 24: vllm#52362's capture size is unpublished, and its two readings disagree by more than the
    # predicted gain, so the public calibration alone never decides "pays" (an A/B or --calibrate must).
    assert not any(g - err > 0 for g in prof["gain_pct"].values())
    assert any(abs(g) < err for g in prof["gain_pct"].values())


def test_interpolation_is_in_log_concurrency_and_clamped():
    points = {1: -10.0, 4: 10.0, 16: 30.0}
    assert payoff._interpolate(points, 2)[0] == pytest.approx(0.0)
    assert payoff._interpolate(points, 8)[0] == pytest.approx(20.0)
    value, note = payoff._interpolate(points, 64)
    assert value == 30.0 and "max_num_seqs 16" in note
    for c in range(1, 17):  # between its neighbours
        v = payoff._interpolate(points, c)[0]
        assert -10.0 <= v <= 30.0


def test_payoff_reading_imports_no_numpy():
    code = ("import sys; from rocm_dspark.probe import payoff; "
            "d = payoff.predicted('DeepSeek-V4.1-Flash', 'mi300x', 64); "
            "assert 'numpy' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules); print(d.state)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("pays", "loses", "unknown")


def test_the_store_lists_ab_records_newest_first(tmp_path, fp):
    a, _ = write_ab(tmp_path, fp)
    b, _ = write_ab(tmp_path, fp)
    assert store.record_names(ab_record.directory(tmp_path)) == [f"{b}.json", f"{a}.json"]


@pytest.mark.parametrize("args, words", [
    (["--ab"], "--ab needs one --concurrency C"),
    (["--ab", "--concurrency", "1,4"], "--ab needs one --concurrency C"),
    (["--ab", "--concurrency", "4", "--endpoint", "http://127.0.0.1:9"], "drop --endpoint"),
    (["--ab-server-json", "x.json"], "--ab-server-json is only for --ab"),
])
def test_ab_bad_usage_is_one_line_exit_2(tmp_path, args, words):
    from tests.helpers import cli_env, run_cli

    proc = run_cli(["validate", "--model", "V4.1-Flash", "--gpu", "mi300x", "--report", str(tmp_path / "r"), *args],
                   env=cli_env())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0]


def test_ab_with_one_server_file_is_refused(tmp_path):
    from tests.helpers import cli_env, run_cli

    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"argv": ["true"], "port": 9, "served_name": "x"}))
    proc = run_cli(["validate", "--model", "V4.1-Flash", "--gpu", "mi300x", "--report", str(tmp_path / "r"),
                    "--ab", "--concurrency", "4", "--server-json", str(spec)], env=cli_env())
    assert proc.returncode == 2 and "needs both" in proc.stderr and not (tmp_path / "r").exists()
