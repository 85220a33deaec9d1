"""The canary (rocm_dspark.service.canary, rocm_dspark.up.canary's timer, `rocm-dspark canary`): its lock, its record, the readiness server's /metrics
and the switch's bookkeeping. The re-scoring itself on a real vLLM is tests/slow/test_canary_real.py's; here the
lock is the real flock(2), the record a real file under docs/trust.md's rules, and /metrics is the real readiness
server process, parsed with prometheus_client's own text parser. The one stand-in is vLLM's /health (a stdlib
server) and, for the switch, the start of the block launcher (recorded, not run, as tests/test_up_loads.py does)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.errors import UsageError
from tests.helpers import free_port
from rocm_dspark.service import canary as watch
from rocm_dspark.up import canary
from rocm_dspark.up.steps_common import out_hash
from rocm_dspark.service.trust import up_lock

parser = pytest.importorskip("prometheus_client.parser")
REPO = Path(__file__).resolve().parents[1]


def test_a_second_canary_while_one_runs_refuses_in_one_line(tmp_path):
    d = tmp_path / "s" / "up"
    d.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "s", 0o700)
    with up_lock(d, "rocm-dspark canary"):  # the lock a running canary holds (the same flock(2) on up/up.lock)
        r = CliRunner().invoke(cli, ["canary", "--state-dir", str(tmp_path / "s")])
        up = CliRunner().invoke(cli, ["up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--mode", "foreground",
                                      "--yes", "--state-dir", str(tmp_path / "s")])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert f"refusing to start: another `rocm-dspark canary` (pid {os.getpid()}) is running on the state dir" in r.output
    assert up.exit_code == 2 and f"a `rocm-dspark canary` (pid {os.getpid()}) is running" in up.output
    assert not (d / watch.FILE).exists()  # refused before anything was written
    # Released: the next one runs (no service recorded here: its own one line, exit 2).
    r = CliRunner().invoke(cli, ["canary", "--state-dir", str(tmp_path / "s")])
    assert r.exit_code == 2 and "no service recorded" in r.output and "Traceback" not in r.output


def test_the_record_counts_each_result_keeps_the_last_runs_and_is_read_by_the_trust_rules(tmp_path):
    s = tmp_path / "s"
    (s / "up").mkdir(parents=True, mode=0o700)
    os.chmod(s, 0o700)
    assert watch.load_record(s) == {"schema": 1, "counts": {"pass": 0, "violation": 0, "error": 0}, "runs": []}
    results = ["pass"] * 19 + ["violation", "error", "pass"]
    for i, result in enumerate(results):
        watch.save(s, {"at": f"2026-12-02T10:{i:02d}:00Z", "result": result, "command": "block", "why": "x"})
    rec = watch.load_record(s)
    assert rec["counts"] == {"pass": 20, "violation": 1, "error": 1}  # counted over all runs
    assert len(rec["runs"]) == watch.RUNS_KEPT and rec["runs"][-1]["at"] == "2026-12-02T10:21:00Z"
    path = s / "up" / watch.FILE
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    path.chmod(0o620)  # writable by the group: not believed
    with pytest.raises(UsageError, match="writable by other users"):
        watch.load_record(s)
    path.chmod(0o600)
    path.write_text(json.dumps({"schema": 1, "counts": {"pass": -1}, "runs": []}))
    with pytest.raises(UsageError, match=r"is not a canary record file \(counts is not a count per result\)"):
        watch.load_record(s)
    path.write_text('{"schema": 1, "counts": {}, "runs": [{"result": "maybe"}]}')
    with pytest.raises(UsageError, match="runs is not a list of runs"):
        watch.load_record(s)


HEALTH = ("import sys\nfrom http.server import BaseHTTPRequestHandler, HTTPServer\n"
          "class H(BaseHTTPRequestHandler):\n"
          "    def do_GET(self):\n"
          "        self.send_response(200 if self.path == '/health' else 404); self.end_headers()\n"
          "    def log_message(self, *a): pass\n"
          "HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


def _families(text: str) -> dict:
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def test_metrics_serve_the_observability_contract_and_a_violation_on_adaptive_switches_to_block_once(
        tmp_path, monkeypatch):
    from rocm_dspark.launch.observability import plan_hash
    from rocm_dspark.runtime.client import base_url
    from rocm_dspark.runtime.procfs import start_ticks
    from rocm_dspark.runtime.progress import Display
    from rocm_dspark.service import control as service
    from rocm_dspark.service import start
    from rocm_dspark.up import serve, steps
    from rocm_dspark.service.status import status_lines
    from rocm_dspark.up.runner import status
    from tests.test_up_loads import FakeServer, _run

    port, procs = free_port(), []

    def start_process(launcher, env, *, host, port, log_path):  # the launcher's start, recorded not run
        procs.append(subprocess.Popen([sys.executable, "-c", HEALTH, str(port)], start_new_session=True))
        time.sleep(0.5)
        pid = procs[-1].pid
        return FakeServer(base_url(host, port)), {"kind": "process", "pid": pid, "start_ticks": start_ticks(pid),
                                                   "host": host, "port": port, "launcher": str(launcher),
                                                   "base_url": base_url(host, port), "log": str(log_path)}

    monkeypatch.setattr(service, "start_process", start_process)
    monkeypatch.setattr(start, "launch_state", lambda d, wait_s=10.0: {})
    monkeypatch.setattr(start, "launcher_phase", lambda d: "serving")  # its warm-up passed
    run = _run(tmp_path, "foreground")
    run.options.selection["port"] = port
    run.outputs["choose"] = steps.choose_run(run)
    run.outputs["launchers"] = steps.launchers_run(run)
    run.state.mark("choose", "done", "x", output=run.outputs["choose"])
    run.state.mark("launchers", "done", "x", output=run.outputs["launchers"])
    rport = free_port()
    ready = subprocess.Popen([sys.executable, "-m", "rocm_dspark", "status", "--ready", "--listen", f"127.0.0.1:{rport}",
                              "--state-dir", str(run.options.state_dir)], env={**os.environ, "PYTHONPATH": str(REPO)},
                             stderr=subprocess.DEVNULL)
    try:
        serve.load(run, "block", "the service")
        serve.load(run, "adaptive", "prove")  # up's prove step kept the adaptive start
        run.state.set_readiness(True, "serving", "adaptive verification serves, validated")

        def scrape() -> dict:
            for _ in range(100):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{rport}/metrics", timeout=5) as res:
                        assert res.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                        return _families(res.read().decode())
                except OSError:
                    time.sleep(0.1)
            raise AssertionError("the readiness server never answered /metrics")

        fams = scrape()
        info = fams["rocm_dspark_service_info"].samples[0]
        assert info.labels == {"endpoint": base_url(run.plan.host, port), "plan_hash": plan_hash(run.plan),
                               "image_digest": "none", "verification": "adaptive"} and info.value == 1
        assert fams["rocm_dspark_ready"].samples[0].value == 1
        assert fams["rocm_dspark_mode_changes"].type == "counter"
        assert [s.value for s in fams["rocm_dspark_mode_changes"].samples if s.name.endswith("_total")] == [1]
        assert {s.labels["result"]: s.value for s in fams["rocm_dspark_canary_runs"].samples
                if s.name.endswith("_total")} == {"pass": 0, "violation": 0, "error": 0}
        assert "rocm_dspark_canary_last_passed" not in fams  # no run yet: no made-up last result

        # A violation on the adaptive service (the re-scoring is the slow test's): one restart to block.
        results = iter([{"result": "violation", "why": "1 of 256 emitted tokens are not the reference argmax",
                         "tokens": 256, "acceptance_length": 2.1},
                        {"result": "pass", "why": "256 emitted tokens: 0 violations", "tokens": 256}])
        monkeypatch.setattr(watch, "check", lambda served, deadline, temperature=0.0: {
            "endpoint": base_url(served.host, served.port), "command": served.command, **next(results)})
        loads = len(run.state.data["loads"])
        code, entry = watch.run_canary(run.options.state_dir, Display(say=lambda line: None))
        assert code == 1 and entry["result"] == "violation" and entry["switch"]["started"] is True
        state = json.loads((run.dir / "up-state.json").read_text())
        assert len(state["loads"]) == loads + 1 and state["loads"][-1]["command"] == "block"
        assert state["loads"][-1]["why"].startswith("canary violation at ")
        assert state["service"]["command"] == "block" and state["service"]["plan_hash"] == plan_hash(run.plan)
        assert state["mode_changes"][-1]["from"] == "adaptive" and state["mode_changes"][-1]["to"] == "block"
        assert state["readiness"]["ready"] is True and "block re-checked" in state["readiness"]["why"]
        fams = scrape()
        assert fams["rocm_dspark_service_info"].samples[0].labels["verification"] == "block"
        assert [s.value for s in fams["rocm_dspark_mode_changes"].samples if s.name.endswith("_total")] == [2]
        assert {s.labels["result"]: s.value for s in fams["rocm_dspark_canary_runs"].samples
                if s.name.endswith("_total")} == {"pass": 0, "violation": 1, "error": 0}
        assert fams["rocm_dspark_canary_last_passed"].samples[0].value == 0
        stamp = fams["rocm_dspark_canary_last_run_timestamp_seconds"].samples[0].value
        assert abs(stamp - time.time()) < 120
        lines = "\n".join(status_lines(status(run.options.state_dir)))
        assert f"canary: last {entry['at']}: VIOLATION (adaptive, 256 tokens re-scored)" in lines
        assert "mode last changed" in lines and "adaptive -> block (canary violation at" in lines
        assert "model loads: 1 in the last run that loaded (block" in lines  # the canary's own run
        # `up` again keeps block (no load) while the canary's hold stands: it does not undo the switch.
        run.state = type(run.state).load(run.dir)
        assert watch.hold(run.state, out_hash(run, "probe")) and steps.start_run(run)
        assert len(json.loads((run.dir / "up-state.json").read_text())["loads"]) == loads + 1
        # An untrusted record: the scrape fails (an alert) rather than report made-up counts.
        (run.dir / watch.FILE).chmod(0o666)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{rport}/metrics", timeout=5)
        assert err.value.code == 500 and b"writable by other users" in err.value.read()
    finally:
        ready.terminate()
        ready.wait(timeout=20)
        for p in procs:
            p.kill()
            p.wait()


def test_the_switch_runs_only_a_start_up_recorded_inside_its_launch_dir(tmp_path, monkeypatch):
    """The switch starts the block start `up` recorded with the service (service/start.py recorded): one of another
    shape (an older `up`) or naming a launcher outside <state>/up/launch is refused in one line, readiness withdrawn,
    and nothing is run."""
    from rocm_dspark.runtime.procfs import start_ticks
    from rocm_dspark.runtime.progress import Display
    from rocm_dspark.service.state import UpState, up_dir
    from rocm_dspark.service.trust import prepare

    state_dir, ran = tmp_path / "s", tmp_path / "ran"
    prepare(up_dir(state_dir))
    evil = tmp_path / "evil.sh"
    evil.write_text(f"#!/bin/sh\ntouch {ran}\n")
    evil.chmod(0o755)
    outside = {"command": "block", "launcher": str(evil), "unit": None, "user": "u", "env": {}, "host": "127.0.0.1",
               "port": free_port(), "window_s": 5}
    monkeypatch.setattr(watch, "check", lambda served, deadline, temperature=0.0: {
        "endpoint": "e", "command": served.command, "result": "violation", "why": "planted", "tokens": 1})
    svc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        for facts, why in (({}, "holds no start in the shape `up` writes"),
                           ({"block": {"start": outside}}, f"names a file outside {state_dir / 'up' / 'launch'}")):
            state = UpState.load(up_dir(state_dir))
            state.set_service({"kind": "process", "pid": svc.pid, "start_ticks": start_ticks(svc.pid),
                               "host": "127.0.0.1", "port": outside["port"], "command": "adaptive", "facts": facts})
            code, entry = watch.run_canary(state_dir, Display(say=lambda line: None))
            assert code == 1 and entry["switch"]["started"] is False and why in entry["switch"]["why"], entry
            ready = UpState.load(up_dir(state_dir)).readiness
            assert (ready["ready"], ready["phase"]) == (False, "failed"), ready
        assert not ran.exists() and svc.poll() is None  # nothing started, the old service not stopped
    finally:
        svc.kill()
        svc.wait()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_systemd_form_is_a_timer_and_a_bounded_oneshot_that_systemd_accepts(tmp_path, monkeypatch):
    from rocm_dspark.launch.launch_facts import CANARY_EVERY_MIN
    from rocm_dspark.service import control as service
    from tests.test_up_health import _run

    monkeypatch.setattr(service, "systemd_usable", lambda: None)
    run = _run(tmp_path, "systemd", None)
    files = canary.unit_files(run)
    name = run.name
    assert list(files) == [f"{name}-canary.service", f"{name}-canary.timer"]
    for file, text in files.items():
        (tmp_path / file).write_text(text)
    res = subprocess.run(["systemd-analyze", "verify", "--man=no", *[str(tmp_path / f) for f in files]],
                         capture_output=True, text=True)
    assert res.returncode == 0 and not res.stderr.strip(), res.stderr
    unit, timer = files.values()
    assert "\nType=oneshot\n" in unit and f"--state-dir {tmp_path / 'state'}" in unit
    assert "-m rocm_dspark canary --timeout 300 " in unit
    timeout = int(unit.split("TimeoutStartSec=")[1].split()[0])
    assert 600 < timeout < 2 * 3600 * 24  # two checks and one block start, bounded
    assert f"\nOnUnitInactiveSec={CANARY_EVERY_MIN}min\n" in timer and "\nWantedBy=timers.target\n" in timer
    # `up` (summary step) writes them and enables the timer; the dry run prints the same commands.
    assert canary.actions(run)[-1].argv == ("systemctl", "enable", "--now", f"{name}-canary.timer")
    broken = unit.replace("Type=oneshot", "Type=sometimes")
    (tmp_path / f"{name}-canary.service").write_text(broken)
    res = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / f"{name}-canary.service")],
                         capture_output=True, text=True)
    assert "sometimes" in res.stderr  # the check can fail
