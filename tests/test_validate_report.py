"""The report files (JSON, Markdown, PNG) and the sweep statistics; the runner's order and stop rule;
`rocm-dspark validate` end to end in a subprocess on this GPU-less host (no server, and a dead endpoint)."""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.usecase.launch_plan import plan_for
from tests.helpers import free_port
from rocm_dspark.validate import report, runner, sweep
from rocm_dspark.validate.context import ValidateOptions, parse_endpoint
from rocm_dspark.validate.result import Check, Outcome
from tests.conftest import cli_env
from tests.helpers import run_cli as cli_in_process
from tests.helpers import sweep_rows

SELECTION = {"model": "V4.1-Flash", "gpu": "mi300x", "adaptive": "off"}


def assert_real_png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"  # the PNG signature
    import matplotlib.image
    from PIL import Image

    assert matplotlib.image.imread(str(path)).ndim == 3
    with Image.open(path) as im:
        im.verify()
        assert im.format == "PNG"


def test_percentile_and_summary_match_numpy():
    np = pytest.importorskip("numpy")
    rng = random.Random(7)
    for n in (1, 2, 5, 50):
        xs = [rng.uniform(0, 3) for _ in range(n)]
        for q in (0, 50, 90, 99, 100):
            assert sweep_rows.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    recs = [sweep_rows.RequestRecord(True, ttft_s=0.1 * i, latency_s=0.1 * i + 1.0, output_tokens=11, itl_s=[0.1] * 10)
            for i in range(1, 5)] + [sweep_rows.RequestRecord(False, error="ReadError: boom")]
    s = sweep_rows.summarise(recs, wall_s=2.0, concurrency=2)
    assert (s["requests"], s["succeeded"], s["failed"], s["output_tokens"]) == (5, 4, 1, 44)
    assert s["output_throughput_tok_s"] == 22.0
    assert s["ttft_ms"]["p50"] == pytest.approx(float(np.percentile([100, 200, 300, 400], 50)))
    assert s["tpot_ms"]["mean"] == pytest.approx(100.0)     # (1.0 s after the first token) / 10 more tokens
    assert s["errors"] == ["ReadError: boom"]


def _levels():
    return [sweep_rows.summarise([sweep_rows.RequestRecord(True, ttft_s=0.02 * c, latency_s=0.5, output_tokens=32,
                                                           itl_s=[0.01])], 1.0, c) for c in (1, 4, 16)]


def test_report_files_are_complete_and_parse(tmp_path):
    checks = [Check("host.one", True, None, "first"), Check("server.two", False, None, "second")]
    rows = [{"name": "host.one", "category": "host", "status": "pass", "blocking": True, "message": "ok | fine",
             "value": 1, "threshold": 1, "evidence": {"x": [1, 2]}, "duration_s": 0.1},
            {"name": "server.two", "category": "server", "status": "warn", "blocking": False, "message": "meh",
             "value": None, "threshold": None, "evidence": None, "duration_s": 0.0}]
    rep = {"plan": {"model_key": "M", "profile": "M/g", "status": "experimental", "vllm_version": "1"},
           "server": {"mode": "endpoint", "base_url": "http://x:1", "served_name": "s", "recipe_model": True},
           "host": {"hostname": "h"}, "started_at": "t", "duration_s": 1.0, "summary": report.summary(rows),
           "checks": rows, "measurements": {}}
    data = {"acceptance": {"al": 2.9, "per_position": [0.9, 0.6, 0.4], "threshold": 2.5}, "sweep": _levels()}
    written = report.write_report(tmp_path, rep, {c.name: c.description for c in checks}, data)
    assert set(written) == {"report.json", "report.md", report.PLOT_ACCEPTANCE, report.PLOT_SWEEP}  # no /metrics: no cost table
    back = json.loads((tmp_path / "report.json").read_text())
    assert back["summary"]["result"] == "pass" and back["plots"] == [report.PLOT_ACCEPTANCE, report.PLOT_SWEEP]
    for c in back["checks"]:
        assert set(c) >= {"name", "category", "status", "value", "threshold", "evidence", "blocking"}
    md = (tmp_path / "report.md").read_text()
    assert "| PASS | `host.one` | yes | 1 | 1 | ok \\| fine |" in md and "| WARN | `server.two` | no |" in md
    assert "No AMD GPU was checked" not in md and "- `server.two`: second" in md   # a host check passed
    assert_real_png(tmp_path / report.PLOT_ACCEPTANCE)
    assert_real_png(tmp_path / report.PLOT_SWEEP)


def test_existing_report_is_not_overwritten_without_force(tmp_path):
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(UsageError, match="already holds report.json: pass --force"):
        report.prepare_dir(tmp_path, force=False)
    assert (tmp_path / "report.json").read_text() == "{}"
    report.prepare_dir(tmp_path, force=True)          # --force clears the old files first
    assert not (tmp_path / "report.json").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="is a file"):
        report.prepare_dir(tmp_path / "file", force=False)


@pytest.mark.parametrize("url,expect", [("http://127.0.0.1:8000", ("127.0.0.1", 8000)), ("localhost:9", ("localhost", 9)),
                                        ("http://h:8000/", ("h", 8000))])
def test_endpoint_parsing(url, expect):
    assert parse_endpoint(url) == expect


@pytest.mark.parametrize("url,msg", [("https://h:1", "http only"), ("http://h:1/v1", "without a path"),
                                     ("http://h:99999", "port")])
def test_bad_endpoint(url, msg):
    with pytest.raises(UsageError, match=msg):
        parse_endpoint(url)


def test_runner_stops_at_the_first_blocking_failure(tmp_path, monkeypatch):
    calls = []

    def make(name, status):
        def run(ctx):
            calls.append(name)
            return Outcome(status, f"{name} said {status}")
        return run

    fake = [Check("host.ok", True, make("host.ok", "pass")),
            Check("host.warn", False, make("host.warn", "warn")),
            Check("host.soft", False, make("host.soft", "fail")),      # non-blocking failure: goes on
            Check("host.crash", False, lambda ctx: 1 / 0),           # a broken check is its own failure
            Check("software.stop", True, make("software.stop", "fail")),
            Check("software.after", True, make("software.after", "pass")),
            Check("server.x", True, make("server.x", "pass"))]
    monkeypatch.setattr(runner, "build_checks", lambda opts: fake)
    rep = runner.run_validation(ValidateOptions(report_dir=tmp_path / "r", endpoint=f"http://127.0.0.1:{free_port()}"),
                                SELECTION)
    assert calls == ["host.ok", "host.warn", "host.soft", "software.stop"]
    status = {c["name"]: c["status"] for c in rep["checks"]}
    assert status == {"host.ok": "pass", "host.warn": "warn", "host.soft": "fail", "host.crash": "fail", "software.stop": "fail",
                      "software.after": "skipped", "server.x": "skipped"}
    assert "ZeroDivisionError" in rep["checks"][3]["message"]
    assert rep["checks"][5]["message"] == "not run: blocking check software.stop failed"
    assert rep["summary"] == {**rep["summary"], "result": "fail", "exit_status": 1, "stopped_at": "software.stop",
                              "reason": "software.stop said fail"}


def test_check_names_are_stable_and_ordered():
    names = runner.check_names(ValidateOptions(report_dir="x", quick=True))
    cats = [n.split(".")[0] for n in names]
    assert cats == sorted(cats, key=["host", "software", "server", "spec_decode", "sweep"].index)
    assert names[-4:] == ["sweep.concurrency_1", "sweep.concurrency_4", "sweep.jit", "sweep.gsm8k"]
    full = runner.check_names(ValidateOptions(report_dir="x", launch=True))
    # Each says what it means in report.md (a check function's docstring, or the sweep level's own line).
    assert all(c.description for c in runner.build_checks(ValidateOptions(report_dir="x", launch=True)))
    assert "server.start" in full and [n for n in full if n.startswith("sweep.concurrency")] == [
        "sweep.concurrency_1", "sweep.concurrency_16", "sweep.concurrency_64", "sweep.concurrency_128"]
    assert ValidateOptions(report_dir="x").requests_for(128) == 512 and ValidateOptions(report_dir="x").requests_for(1) == 4


def run_cli(*args, env=None):
    return cli_in_process(["validate", *args], capture_output=True, text=True, env=env or cli_env(), timeout=600)


@pytest.mark.parametrize("extra", [[], ["--quick"], ["--server-json", "{t}/s.json"]])
def test_cli_without_a_server_is_usage_exit_2_and_writes_nothing(tmp_path, extra):
    # Issue 22: it printed "validation PASS" and exited 0 with every server check skipped.
    (tmp_path / "s.json").write_text(json.dumps({"argv": ["vllm"], "port": 9, "served_name": "x"}))
    proc = run_cli("--model", "V4.1-Flash", "--report", str(tmp_path / "r"), *[a.format(t=tmp_path) for a in extra])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "no server to check: pass --endpoint URL" in line and "--launch" in line
    assert not (tmp_path / "r").exists()


def test_a_skipped_blocking_check_is_not_a_pass(tmp_path, monkeypatch):
    fake = [Check("host.ok", True, lambda ctx: Outcome("pass", "ok")),
            Check("software.skip", True, lambda ctx: Outcome("skipped", "could not look")),
            Check("software.soft", False, lambda ctx: Outcome("skipped", "optional"))]
    monkeypatch.setattr(runner, "build_checks", lambda opts: fake)
    rep = runner.run_validation(ValidateOptions(report_dir=tmp_path / "r", endpoint=f"http://127.0.0.1:{free_port()}"),
                                SELECTION)
    assert rep["summary"] == {**rep["summary"], "result": "incomplete", "exit_status": 1, "stopped_at": None,
                              "reason": "blocking check software.skip was skipped: could not look"}
    md = (tmp_path / "r" / "report.md").read_text()
    assert md.startswith("# rocm-dspark validation: INCOMPLETE") and "**Not a PASS**: blocking check software.skip" in md
    # A non-blocking skip alone keeps the PASS.
    monkeypatch.setattr(runner, "build_checks", lambda opts: [fake[0], fake[2]])
    rep = runner.run_validation(ValidateOptions(report_dir=tmp_path / "r2", endpoint=f"http://127.0.0.1:{free_port()}"),
                                SELECTION)
    assert rep["summary"]["result"] == "pass" and rep["summary"]["exit_status"] == 0


def test_gsm8k_not_requested_is_not_applicable_not_a_skipped_blocker():
    from rocm_dspark.validate import gsm8k

    class Ctx:
        options = ValidateOptions(report_dir="x")

    assert gsm8k.gsm8k(Ctx()).status == "not_applicable"


def test_cli_without_gpu_against_a_dead_server(tmp_path):
    env = cli_env(PATH=f"{tmp_path}:/usr/bin:/bin")    # no amd-smi / rocminfo on this host anyway
    out = tmp_path / "rep"
    dead = ["--endpoint", f"http://127.0.0.1:{free_port()}"]
    proc = run_cli("--model", "V4.1-Flash", "--report", str(out), *dead, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "validation FAIL" in proc.stdout and "no AMD GPU was checked" in proc.stdout
    rep = json.loads((out / "report.json").read_text())
    by = {c["name"]: c for c in rep["checks"]}
    assert by["host.gpus"]["status"] == "not_applicable"
    assert by["host.gpus"]["message"] == "no AMD GPU: amd-smi and rocminfo absent and no /dev/kfd"
    assert all(c["status"] == "skipped" for c in rep["checks"]
               if c["category"] in ("server", "spec_decode", "sweep") and c["name"] != "server.health")
    assert f"[ 1/{len(rep['checks'])}] host.gpus" in proc.stderr      # the progress display
    # A second run into the same directory is refused, in one line, and changes nothing.
    before = (out / "report.json").read_bytes()
    again = run_cli("--model", "V4.1-Flash", "--report", str(out), *dead, env=env)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "Traceback" not in again.stderr
    assert "--force" in again.stderr and (out / "report.json").read_bytes() == before


def test_cli_dead_endpoint_fails_health_and_skips_the_rest(tmp_path):
    port = free_port()   # nothing listens there
    proc = run_cli("--model", "V4.1-Flash", "--gpu", "mi300x", "--endpoint", f"http://127.0.0.1:{port}",
                   "--report", str(tmp_path / "r"), "--quick")
    assert proc.returncode == 1, proc.stderr
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    by = {c["name"]: c for c in rep["checks"]}
    assert by["server.health"]["status"] == "fail" and "connection refused" in by["server.health"]["message"]
    assert by["server.models"]["status"] == "skipped" and by["sweep.concurrency_1"]["status"] == "skipped"
    assert rep["summary"]["stopped_at"] == "server.health"
    assert "stopped at server.health" in proc.stdout


@pytest.mark.parametrize("args,msg", [
    (["--endpoint", "http://h:1", "--launch"], "exclude each other"),
    (["--endpoint", "ftp://h"], "http only"),
    (["--concurrency", "1,x"], "comma-separated positive integers"),
    (["--launch", "--server-json", "/nonexistent.json"], "--server-json /nonexistent.json: no such file"),
])
def test_cli_bad_usage_is_one_line_exit_2(tmp_path, args, msg):
    proc = run_cli("--model", "V4.1-Flash", "--report", str(tmp_path / "r"), *args)
    assert proc.returncode == 2 and msg in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()                    # nothing written


def _server_json(tmp_path, **data):
    path = tmp_path / "server.json"
    path.write_text(json.dumps(data))
    return path


def test_server_json_becomes_the_target(tmp_path):
    # The file's format and errors are tested in tests/test_server_spec.py; here: what validate takes from it.
    _, _, plan = plan_for(SELECTION)
    spec = _server_json(tmp_path, argv=["vllm", "serve", "tiny"], env={"A": "1"}, port=18431, served_name="tiny",
                        num_speculative_tokens=3)
    launched = runner._target(ValidateOptions(report_dir=tmp_path / "r", launch=True, server_json=spec), plan)
    assert (launched.served_name, launched.host, launched.port, launched.recipe_model) == ("tiny", "127.0.0.1", 18431, False)
    assert launched.argv == ("vllm", "serve", "tiny") and launched.env == {"A": "1"}
    assert launched.num_speculative_tokens == 3 and launched.description == f"server from {spec}"
    assert launched.notes == ()
    attached = runner._target(ValidateOptions(report_dir=tmp_path / "r", endpoint="http://10.0.0.2:9000",
                                              server_json=spec), plan)
    assert (attached.host, attached.port) == ("10.0.0.2", 9000)     # the endpoint wins over the file's host/port
    assert runner._target(ValidateOptions(report_dir=tmp_path / "r", server_json=spec), plan) is None


def test_server_json_without_served_name_is_refused_by_validate(tmp_path):
    _, _, plan = plan_for(SELECTION)
    spec = _server_json(tmp_path, argv=["vllm"], port=18431)
    with pytest.raises(UsageError, match=r"--server-json .*: validate needs served_name") as info:
        runner._target(ValidateOptions(report_dir=tmp_path / "r", launch=True, server_json=spec), plan)
    assert "\n" not in str(info.value)


def test_probe_only_keys_are_reported_not_dropped(tmp_path, monkeypatch):
    spec = _server_json(tmp_path, argv=["vllm"], port=free_port(), served_name="tiny", prompts=["p"],
                        deterministic_check={"prompt": "Say hi", "expect": "hi"})
    monkeypatch.setattr(runner, "build_checks", lambda opts: [Check("host.ok", True, lambda ctx: Outcome("pass", "ok"))])
    lines = []
    rep = runner.run_validation(ValidateOptions(report_dir=tmp_path / "r", endpoint=f"http://127.0.0.1:{free_port()}",
                                                server_json=spec), SELECTION, say=lines.append)
    (note,) = [n for n in rep["notes"] if "--server-json" in n]
    assert "deterministic_check, prompts are read by `probe` only" in note
    assert f"note: {note}" in lines
    assert json.loads((tmp_path / "r" / "report.json").read_text())["notes"] == rep["notes"]


def test_hardware_suite_skips_cleanly_without_an_amd_gpu(tmp_path):
    import sys

    from tests.conftest import REPO

    proc = subprocess.run([sys.executable, "-m", "pytest", "validation", "-m", "hardware", "-q", "-p", "no:cacheprovider",
                           "--report", str(tmp_path / "r")], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=cli_env(PATH=f"{tmp_path}:/usr/bin:/bin"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert " skipped" in proc.stdout and "failed" not in proc.stdout and "error" not in proc.stdout.lower()
    assert not (tmp_path / "r").exists()     # nothing ran: no GPU
    # Without -m hardware the suite is deselected by the project's addopts.
    quiet = subprocess.run([sys.executable, "-m", "pytest", "validation", "-q", "-p", "no:cacheprovider"], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
    assert "deselected" in quiet.stdout


def test_sweep_writes_a_cost_table_plan_reads(tmp_path):
    """Issue #12 item 2: the sweep's step costs (median chunk gap, running requests x (1 + drafts per step)
    from /metrics deltas) land in cost_table.json, which `plan --cost-table` reads as it is."""
    from rocm_dspark.runtime.metrics import SpecDecodeCounters
    from rocm_dspark.planner.cost_table import load_cost_table

    levels = []
    for c, gap in ((1, 0.010), (4, 0.012), (16, 0.020)):
        recs = [sweep_rows.RequestRecord(True, ttft_s=0.05, latency_s=0.5, output_tokens=32, itl_s=[gap] * 8)] * 8
        s = sweep_rows.summarise(recs, 1.0, c)
        before = SpecDecodeCounters(True, num_drafts=10, num_draft_tokens=30, num_accepted_tokens=15)
        after = SpecDecodeCounters(True, num_drafts=110, num_draft_tokens=330, num_accepted_tokens=215)
        s.update(sweep.step_estimate(s, before, after, 64))
        levels.append(s)
    assert levels[1]["tokens_per_step"] == 4 * (1 + 3.0) and levels[1]["step_ms"] == 12.0
    assert levels[1]["acceptance_length"] == 3.0
    rep = {"server": {"description": "tiny server"}, "host": {"hostname": "h"}, "started_at": "2026-12-01T02:00:00",
           "checks": [{"name": "server.version", "value": "0.32.0"}], "summary": {}, "plan": {}}
    table = report.cost_table(levels, rep)
    assert table["verify"] == [[4, 10.0], [16, 12.0], [64, 20.0]] and table["includes_draft"] is True
    assert "tiny server" in table["source"] and "0.32.0" in table["source"]
    path = tmp_path / report.COST_TABLE
    path.write_text(json.dumps(table))
    cost = load_cost_table(path, capture_sizes=[1, 2, 4, 8, 16, 32, 64])   # what `plan` passes: the profile's grid
    assert cost.includes_draft and not cost.dense
    assert cost.verify_seconds(8) * 1e3 == pytest.approx(10 + 2 * 4 / 12)      # interpolated, not stepped up to 12
    proc = cli_in_process(["plan", "--gpu", "mi300x", "--concurrency", "1,4,16", "--cost-table", str(path)],
                          capture_output=True, text=True, env=cli_env())
    assert proc.returncode == 0, proc.stderr
    assert "cost: measured (cost_table.json)" in proc.stdout and "sparse (3 samples" in proc.stdout


def test_sweep_plot_names_server_build_and_run(tmp_path):
    rep = {"server": {"description": "tiny server"}, "host": {"hostname": "h"}, "started_at": "T",
           "checks": [{"name": "server.version", "value": "0.32.0"}]}
    label = report.run_label(rep)
    assert label == "server: tiny server; vLLM 0.32.0; run: h T"
    report.plot_sweep(tmp_path / "s.png", _levels(), label)
    assert_real_png(tmp_path / "s.png")


FIELD_CHECKS = [("server.deterministic", True), ("server.capture", True), ("server.tool_calls", True),
                ("spec_decode.acceptance", True), ("sweep.concurrency_1", True), ("sweep.concurrency_4", True),
                ("sweep.jit", False), ("sweep.gsm8k", True)]


def _field_report(failing: str | None) -> dict:
    rows = []
    for name, blocking in FIELD_CHECKS:
        bad = name == failing
        status = ("fail" if blocking else "warn") if bad else "pass"
        rows.append({"name": name, "category": name.split(".")[0], "status": status, "blocking": blocking,
                     "message": f"{name} said {status}", "value": None, "threshold": None, "duration_s": 0.0,
                     "evidence": {"failing": [{"case": "streaming, thinking on", "problems": ["arguments carry a tag"],
                                               "request": {"tools": []}, "response": {"choices": []}}]}
                     if bad and name == "server.tool_calls" else None})
    def level(c):  # the sweep's own statistics: 8 requests in 1 s, 100 x c // 8 tokens each; 3 fail at the failing level
        n_bad = 3 if failing == f"sweep.concurrency_{c}" else 0
        recs = [sweep_rows.RequestRecord(True, ttft_s=0.1, latency_s=0.5, output_tokens=100 * c // 8)
                for _ in range(8 - n_bad)] + [sweep_rows.RequestRecord(False, error="ReadError: boom")] * n_bad
        return sweep_rows.summarise(recs, 1.0, c)

    sweep_levels = [level(c) for c in (1, 4)]
    return {"plan": {"model_key": "M", "profile": "M/g", "status": "experimental", "vllm_version": "1"},
            "server": {"mode": "endpoint", "base_url": "http://x:1", "served_name": "s", "recipe_model": True},
            "host": {"hostname": "h"}, "started_at": "t", "duration_s": 1.0, "summary": report.summary(rows),
            "checks": rows, "measurements": {"sweep": sweep_levels}}


@pytest.mark.parametrize("failing", [name for name, _ in FIELD_CHECKS])
def test_verdict_names_each_checks_failure_first(failing):
    rep = _field_report(failing)
    md = report.render_markdown(rep, {})
    verdict = next(line for line in md.splitlines() if line.startswith("**Verdict"))
    blocking = dict(FIELD_CHECKS)[failing]
    assert verdict == (f"**Verdict: FAIL**, first failing check `{failing}`" if blocking
                       else f"**Verdict: PASS**, first warning check `{failing}`")
    rows = {r["row"]: r for r in report.field_table(rep["checks"], rep["measurements"]["sweep"])}
    bad = [r for r in rows.values() if r["status"] != "pass"]
    assert bad and all(r["check"] == failing for r in bad)
    if failing.startswith("sweep.concurrency"):   # errors beside the accuracy, with the counts per level
        c = failing.rpartition("_")[2]
        assert rows["request errors"]["detail"].startswith("3 of 16 requests failed (")
        assert f"3 at c={c}" in rows["request errors"]["detail"] and rows["accuracy"]["status"] == "pass"
    if failing == "server.tool_calls":   # the failing request and response are in the report
        assert "## Failing tool call: streaming, thinking on" in md and "- arguments carry a tag" in md


def test_verdict_of_a_clean_run():
    rep = _field_report(None)
    md = report.render_markdown(rep, {})
    assert "**Verdict: PASS**\n" in md and "| throughput | PASS | `sweep.concurrency_1` | c=1: 96.0 tok/s, c=4: 400.0 tok/s |" in md
    assert [r["row"] for r in report.field_table(rep["checks"], rep["measurements"]["sweep"])] == [
        "accuracy", "tool calls", "request errors", "graph capture", "JIT after warm-up", "acceptance", "throughput"]
