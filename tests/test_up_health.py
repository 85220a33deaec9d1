"""Issue 32: the readiness `up` controls (rocm_dspark.service.readiness, up/ready_server.py): GET /ready and
`status --ready` give one answer, read from the `up` state file.

Real parts: the readiness server is the real `python -m rocm_dspark status --ready --listen` process, asked by a
real HTTP client on loopback; the state file is a real `up` state file; the service it records is a real process.
The one stand-in is vLLM itself: a stdlib HTTP server answering /health with the code a file holds (the real
vLLM's /health, 200 or 503 on a dead engine, is tests/slow/test_up_loads_real.py's; see ready_checks() there).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.runtime.process import is_alive
from tests.helpers import free_port
from rocm_dspark.runtime.procfs import start_ticks
from rocm_dspark.service import control as service
from rocm_dspark.up import ready_server
from rocm_dspark.service.status import down, status_lines
from rocm_dspark.up.runner import UpOptions, UpRun, status
from rocm_dspark.service.state import UpState, up_dir

VLLM_STAND_IN = textwrap.dedent("""
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    code_file = sys.argv[2]
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            code = int(open(code_file).read()) if self.path == "/health" else 404
            self.send_response(code); self.send_header("Content-Length", "0"); self.end_headers()
        def log_message(self, *a): pass
    HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def _get(url: str, method: str = "GET") -> tuple[int, dict | None]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            body = res.read()
            return res.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if body else None


def _wait_port(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            _get(url)
            return
        except OSError:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else "exited"
            time.sleep(0.1)
    raise AssertionError(f"{url} never answered")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture
def vllm_stand_in(tmp_path):
    port, code = free_port(), tmp_path / "health-code"
    code.write_text("200")
    proc = subprocess.Popen([sys.executable, "-c", VLLM_STAND_IN, str(port), str(code)], start_new_session=True)
    _wait_port(f"http://127.0.0.1:{port}/health", proc)
    yield proc, port, code
    _stop(proc)


def _readiness_server(state_dir: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "rocm_dspark", "status", "--ready", "--listen", f"127.0.0.1:{port}",
                             "--state-dir", str(state_dir)], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_port(f"http://127.0.0.1:{port}/ready", proc)
    return proc


def _cli_ready(state_dir: Path) -> tuple[int, dict]:
    r = CliRunner().invoke(cli, ["status", "--ready", "--json", "--state-dir", str(state_dir)])
    return r.exit_code, json.loads(r.output)


def test_get_ready_and_status_ready_agree_through_every_phase(tmp_path, vllm_stand_in):
    proc, vllm_port, code = vllm_stand_in
    state_dir = tmp_path / "state"
    state = UpState.load(up_dir(state_dir))
    state.save()
    rport = free_port()
    server = _readiness_server(state_dir, rport)
    url = f"http://127.0.0.1:{rport}/ready"
    seen = []

    def check(want_code: int, want_phase: str) -> dict:
        got_code, body = _get(url)
        rc, cli_body = _cli_ready(state_dir)
        assert (got_code, body["phase"]) == (want_code, want_phase), body
        assert rc == (0 if want_code == 200 else 1) and cli_body["phase"] == body["phase"] == want_phase
        assert cli_body["ready"] is body["ready"] is (want_code == 200)
        seen.append(want_phase)
        return body

    try:
        check(503, "none")  # no service recorded yet
        state.set_service({"kind": "process", "pid": proc.pid, "start_ticks": start_ticks(proc.pid), "host": "127.0.0.1",
                           "port": vllm_port, "command": "block", "base_url": f"http://127.0.0.1:{vllm_port}"})
        # up's phases, in the order a run that proves adaptive verification and keeps it goes through them
        state.set_readiness(False, "starting", "block verification is starting (the service)")
        check(503, "starting")
        state.set_readiness(False, "validating", "block verification serves (started); not ready until validated")
        check(503, "validating")  # vLLM's /health already says 200 here: it is not the load balancer's answer
        assert _get(f"http://127.0.0.1:{vllm_port}/health")[0] == 200
        state.set_readiness(False, "proving", "the adaptive start is being proved: not a finished endpoint")
        body = check(503, "proving")
        assert "not a finished endpoint" in body["why"]
        state.set_readiness(False, "validating", "adaptive verification serves (kept: ...); not ready until validated")
        check(503, "validating")
        state.set_readiness(True, "serving", "adaptive verification serves, validated (pass: report.md)")
        body = check(200, "serving")
        assert body["command"] == "block"  # the recorded service's command, from the same state file
        # HEAD: the same code, no body (HAProxy's and many load balancers' default check method)
        assert _get(url, "HEAD") == (200, None)
        # vLLM's engine dies: its /health answers 503, so the node is not ready whatever the state says.
        code.write_text("503")
        body = check(503, "unhealthy")
        assert body["why"] == "vLLM's /health answers HTTP 503"
        code.write_text("200")
        check(200, "serving")
        # The service goes away: stopped, although the state still says serving.
        _stop(proc)
        check(503, "stopped")
        assert _get(f"http://127.0.0.1:{rport}/health")[0] == 404  # one path only: /ready
        assert seen[:3] == ["none", "starting", "validating"]
        # status (without --ready) says the same
        lines = status_lines(status(state_dir))
        assert lines[-1] == "readiness: NOT READY (stopped: the service is not running)", lines
    finally:
        _stop(server)
    assert server.returncode == 0  # SIGTERM: a clean shutdown
    assert "answering GET http://127.0.0.1:" in server.stdout.read()


def test_status_says_proving_while_the_adaptive_start_is_proved(tmp_path, vllm_stand_in):
    proc, vllm_port, _code = vllm_stand_in
    st = UpState.load(up_dir(tmp_path))
    st.set_service({"kind": "process", "pid": proc.pid, "start_ticks": start_ticks(proc.pid), "host": "127.0.0.1",
                    "port": vllm_port, "command": "adaptive", "base_url": f"http://127.0.0.1:{vllm_port}"})
    st.set_readiness(False, "proving", "the adaptive start is being proved: not a finished endpoint")
    lines = status_lines(status(tmp_path))
    assert any(ln.startswith(f"service: proving (process pid {proc.pid})") for ln in lines), lines
    assert lines[-1] == "readiness: NOT READY (proving: the adaptive start is being proved: not a finished endpoint)"
    r = CliRunner().invoke(cli, ["status", "--ready", "--state-dir", str(tmp_path)])
    assert r.exit_code == 1 and r.output.startswith("not ready: proving:"), r.output


def test_listen_refuses_bad_input_in_one_line(tmp_path):
    runner = CliRunner()
    r = runner.invoke(cli, ["status", "--listen", "8001", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2 and "give it with --ready" in r.output and "Traceback" not in r.output
    r = runner.invoke(cli, ["status", "--ready", "--listen", "127.0.0.1:http", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2 and "give HOST:PORT or PORT" in r.output
    with __import__("socket").socket() as held:  # a port something else holds
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = runner.invoke(cli, ["status", "--ready", "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2 and "cannot listen there" in r.output and len(r.output.strip().splitlines()) == 1, r.output


def _run(tmp_path, mode, ready_port) -> UpRun:
    opts = UpOptions(selection={"model": "V4.1-Flash", "gpu": "mi300x", "state_dir": str(tmp_path / "state"),
                                "host": "127.0.0.1"}, mode=mode, yes=True, ready_port=ready_port)
    return UpRun(opts, _Say(), UpState.load(up_dir(opts.state_dir)))


class _Say:
    def __init__(self):
        self.lines = []

    def say(self, line):
        self.lines.append(line)


def test_up_starts_the_readiness_server_once_and_down_stops_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    port = free_port()
    run = _run(tmp_path, "foreground", port)
    run.dir.mkdir(parents=True, mode=0o700)
    rec = ready_server.ensure(run)
    try:
        assert rec["kind"] == "process" and service.alive(rec) and rec["url"] == f"http://127.0.0.1:{port}/ready"
        assert _get(rec["url"]) == (503, {"ready": False, "phase": "none", "why": "no service started yet"})
        # A rerun with the same words keeps it (no second server on the port).
        again = ready_server.ensure(_run(tmp_path, "foreground", port))
        assert again["pid"] == rec["pid"]
        st = status(tmp_path / "state")
        assert st["ready_server"]["pid"] == rec["pid"]
        assert status_lines(st)[-1] == f"readiness server: {rec['url']} (process pid {rec['pid']})"
        # down stops it even with no service recorded.
        say = _Say()
        assert down(tmp_path / "state", say) == 0
        assert say.lines[0].startswith(f"stopped the readiness server (pid {rec['pid']}, {rec['url']})")
        assert not is_alive(rec["pid"])
        assert UpState.load(up_dir(tmp_path / "state")).data["ready_server"] is None
    finally:
        if is_alive(rec["pid"]):
            os.killpg(rec["pid"], signal.SIGKILL)


def test_a_ready_port_that_is_taken_fails_the_step_in_one_line(tmp_path, monkeypatch):
    from rocm_dspark.up.steps_common import StepFailed

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        run = _run(tmp_path, "foreground", held.getsockname()[1])
        run.dir.mkdir(parents=True, mode=0o700)
        with pytest.raises(StepFailed) as exc:
            ready_server.ensure(run)
    assert "cannot listen there" in exc.value.message and "choose a free --ready-port" in exc.value.fix
    assert run.state.data["ready_server"] is None


def test_ready_port_must_not_be_vllms_port(tmp_path):
    r = CliRunner().invoke(cli, ["up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--mode", "foreground", "--dry-run",
                                 "--ready-port", "8000", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2 and "--ready-port 8000 is vLLM's port" in r.output and "Traceback" not in r.output


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_mode_runs_it_as_a_unit_that_systemd_accepts(tmp_path, monkeypatch):
    monkeypatch.setattr(service, "systemd_usable", lambda: None)
    r = CliRunner().invoke(cli, ["up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--mode", "systemd", "--dry-run",
                                 "--ready-port", "8001", "--service-user", "vllm", "--state-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "readiness for a load balancer: GET http://0.0.0.0:8001/ready (200 ready, 503 while starting" in flat
    assert "systemctl enable --now rocm-dspark-deepseek-v4-1-flash-mi300x-ready.service" in flat
    run = _run(tmp_path, "systemd", 8001)
    path = tmp_path / ready_server.unit_name(run)
    path.write_text(ready_server.unit_text(run))
    res = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True)
    assert res.returncode == 0 and not res.stderr.strip(), res.stderr
    text = path.read_text()
    assert f"--listen 127.0.0.1:8001 --state-dir {tmp_path / 'state'}" in text  # the selection's --host here
    assert "\nProtectSystem=strict\n" in text and "\nCapabilityBoundingSet=\n" in text



def test_each_load_withdraws_readiness_before_the_old_service_stops(tmp_path, monkeypatch):
    """The phases up's steps write, in order. The starts are recorded, not run (as tests/test_up_loads.py does:
    a vLLM start is the slow suite's); what is checked is that the state says not ready before anything stops."""
    from tests.test_up_loads import FakeServer, _run as loads_run

    from rocm_dspark.service import start
    from rocm_dspark.up import prove, serve, steps

    def start_process(launcher, env, *, host, port, log_path):
        return FakeServer(f"http://127.0.0.1:{port}"), {"kind": "process", "pid": 4242, "host": host, "port": port,
                                                         "launcher": str(launcher), "base_url": f"http://127.0.0.1:{port}"}

    monkeypatch.setattr(service, "start_process", start_process)
    monkeypatch.setattr(start, "launch_state", lambda d, wait_s=10.0: {})
    monkeypatch.setattr(start, "launcher_phase", lambda d: "serving")  # its warm-up passed
    run = loads_run(tmp_path, "foreground", concurrency=(64,))
    run.outputs["choose"] = steps.choose_run(run)
    run.outputs["launchers"] = steps.launchers_run(run)
    at_stop = []
    monkeypatch.setattr(service, "stop_recorded", lambda state, grace_s=None: at_stop.append(dict(state.readiness)) or {})
    monkeypatch.setattr(service, "alive", lambda svc: bool(svc))  # the recorded service "runs" once started
    run.state.set_readiness(True, "serving", "block verification serves, validated (an earlier run)")
    phases = lambda: run.state.readiness["phase"]  # noqa: E731
    steps.start_run(run)  # no service yet: one load, then validating
    assert phases() == "validating" and not run.state.readiness["ready"]
    serve.load(run, "adaptive", "prove", phase="proving")
    assert at_stop[-1]["phase"] == "proving" and at_stop[-1]["ready"] is False  # withdrawn before the block stop
    assert phases() == "proving"  # still proving after the adaptive start is up: the gate has not decided
    prove.validating(run, "adaptive", "kept: proven and paying")
    assert phases() == "validating"
    run.state.set_readiness(True, "serving", "adaptive verification serves, validated")
    serve.load(run, "block", "back to block")
    assert at_stop[-1]["phase"] == "starting" and at_stop[-1]["ready"] is False
    assert len(at_stop) == 2 and [ld["command"] for ld in run.loads] == ["block", "adaptive", "block"]


def test_a_kept_service_whose_validation_still_holds_serves_at_the_summary(tmp_path, monkeypatch):
    """A run that died mid-load left "starting"; the rerun keeps the service it finds (same command, unchanged
    launchers) and skips validate (its inputs equal the validated ones): the summary marks it serving. A failed
    validation or a stopped service is never turned into ready."""
    from rocm_dspark.up import summary

    run = _run(tmp_path, "foreground", None)
    run.state.set_service({"kind": "process", "pid": os.getpid(), "start_ticks": start_ticks(os.getpid()),
                           "host": "127.0.0.1", "port": 18000, "command": "block", "base_url": "http://127.0.0.1:18000"})
    run.outputs["validate"] = {"result": "pass", "report": "r/report.md"}
    for phase, alive, ready in (("failed", True, False), ("starting", False, False), ("starting", True, True)):
        monkeypatch.setattr(service, "alive", lambda svc, a=alive: a)
        run.state.set_readiness(False, phase, "left by an earlier run")
        summary.ready_if_validated(run)
        assert run.state.readiness["ready"] is ready, (phase, alive, run.state.readiness)
    assert run.state.readiness["why"] == ("block verification serves, validated (pass: r/report.md; its inputs "
                                          "unchanged since)")
