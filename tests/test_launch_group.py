"""A multi-node group's launchers, run for real on loopback with the stand-in `vllm` of tests/helpers/launcher_rig.py:
the head's adaptive start is refused, the head publishes block verification in the shared group directory, and
the worker (which had started adaptive) stops and restarts with block verification: the group falls back
together. The worker is ready only when the head answers /health and /v1/models. No AMD GPU involved."""

from __future__ import annotations

import json
import signal
import time

import pytest

from rocm_dspark.cli import main as _cli_main  # noqa: F401  (the CLI imports cleanly with the group options)
from rocm_dspark.errors import UsageError
from rocm_dspark.launch.launch_group import _rendezvous
from rocm_dspark.recipe.plan import Command
from rocm_dspark.recipe.strategies import ClusterSpec, expand
from tests.helpers.launcher_rig import Rig, alive, free_port, http_status, make_plan, wait_until


def _spec_modes(records):
    out = []
    for r in records:
        argv = [a.decode() for a in r["argv"]]
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        out.append("adaptive" if spec["enable_adaptive_verification"] else "block")
    return out


def phase(rig) -> str | None:
    try:
        return rig.state().get("phase")
    except (FileNotFoundError, ValueError):  # not written yet, or caught mid-rename
        return None


@pytest.fixture
def rigs(tmp_path):
    head, worker = Rig(tmp_path / "head"), Rig(tmp_path / "worker")
    group = tmp_path / "shared-group"
    return head, worker, group


def _write(rig, plan, name, group):
    from rocm_dspark.launch.launchers import write_launchers

    return write_launchers(plan, rig.root / "out", "shell", name=name, group=group).launcher


def test_group_falls_back_together(rigs):
    head_rig, worker_rig, group = rigs
    hp, wp = free_port(), free_port()
    head = _write(head_rig, make_plan(hp), "grp-node0-head", {"group_role": "head", "group_name": "grp"})
    worker = _write(worker_rig, make_plan(wp, extra=("--headless",)), "grp-node1-worker",
                    {"group_role": "worker", "ready_host": "127.0.0.1", "ready_port": hp, "group_name": "grp"})
    common = {"ROCM_DSPARK_GROUP_DIR": str(group)}
    w = worker_rig.start(worker, **common)
    h = None
    try:
        # The worker waits for the head's mode before it starts anything.
        assert not wait_until(lambda: worker_rig.records(), 1.5)  # one that did not wait starts in ~0.2 s
        h = head_rig.start(head, STANDIN_REFUSE_ADAPTIVE="1", STANDIN_REFUSE_AFTER="3", **common)
        assert wait_until(lambda: http_status(hp, "/v1/models") == 200, 90), "head never became ready"
        assert wait_until(lambda: phase(worker_rig) == "serving", 90), worker_rig.state()
        # The worker started adaptive (the head's first mode), then block when the head fell back. (Its readiness is
        # the head's, which can answer before the worker's block vLLM has written its record: wait for it.)
        assert wait_until(lambda: _spec_modes(worker_rig.records()) == ["adaptive", "block"], 10), worker_rig.records()
        assert _spec_modes(head_rig.records()) == ["adaptive", "block"]
        lines = (group / "grp.group-mode").read_text().splitlines()
        assert lines[0] == "2" and lines[1] == "block" and "Adaptive verification" in lines[2]
        assert worker_rig.state()["mode"] == "block" and head_rig.state()["mode"] == "block"
        # The adaptive worker process was stopped, not left running beside the block one.
        first = worker_rig.records()[0]["pids"]
        assert wait_until(lambda: not any(alive(p) for p in first), 10)
    finally:
        for proc in (w, h):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=40)
    pids = [p for rig in (head_rig, worker_rig) for r in rig.records() for p in r["pids"]]
    assert wait_until(lambda: not any(alive(p) for p in pids), 10)


def test_group_with_fallback_needs_a_shared_directory(rigs):
    head_rig, worker_rig, _ = rigs
    hp = free_port()
    head = _write(head_rig, make_plan(hp), "g-head", {"group_role": "head", "group_name": "grp"})
    worker = _write(worker_rig, make_plan(free_port()), "g-worker",
                    {"group_role": "worker", "ready_host": "127.0.0.1", "ready_port": hp, "group_name": "grp"})
    for rig, script in ((head_rig, head), (worker_rig, worker)):
        r = rig.run(script, timeout=30)
        assert r.returncode != 0
        assert b"ROCM_DSPARK_GROUP_DIR" in r.stderr and not rig.records()


def test_block_group_needs_no_directory_and_worker_waits_for_head(rigs):
    head_rig, worker_rig, _ = rigs
    hp, wp = free_port(), free_port()
    head = _write(head_rig, make_plan(hp, adaptive=False), "b-head", {"group_role": "head", "group_name": "grp"})
    worker = _write(worker_rig, make_plan(wp, adaptive=False), "b-worker",
                    {"group_role": "worker", "ready_host": "127.0.0.1", "ready_port": hp, "group_name": "grp"})
    w = worker_rig.start(worker)
    h = None
    try:
        assert wait_until(lambda: worker_rig.records(), 60)
        state = worker_rig.root / "state" / "launch-state"
        assert wait_until(state.exists, 30)
        time.sleep(1)  # a worker that did not wait for the head would be serving a few checks after its vLLM started
        assert worker_rig.state()["phase"] == "starting"  # its own vLLM runs, but the group is not up
        h = head_rig.start(head)
        assert wait_until(lambda: phase(worker_rig) == "serving", 90)
    finally:
        for proc in (w, h):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=40)


def test_cli_writes_one_launcher_per_node(tmp_path):
    from click.testing import CliRunner

    from rocm_dspark.cli import cli

    out = tmp_path / "out"
    out.mkdir()
    r = CliRunner().invoke(cli, ["launch", "--model", "V4.1-Flash", "--gpu", "mi355x", "--strategy", "multi_node_tp_pp",
                                 "--nodes", "3", "--head-address", "10.0.0.1", "--output", str(out), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    names = sorted(p.name for p in out.iterdir() if p.suffix == ".sh")
    assert names == [f"rocm-dspark-deepseek-v4-1-flash-mi355x-node{i}-{role}.sh"
                     for i, role in ((0, "head"), (1, "worker"), (2, "worker"))]
    # and one set of observability files for the whole group (rocm_dspark/launch/observability.py)
    assert sorted(p.name for p in out.iterdir() if p.suffix != ".sh") == [
        f"rocm-dspark-deepseek-v4-1-flash-mi355x.{ext}" for ext in ("grafana.json", "prometheus.yml", "rules.yml")]
    assert data["nodes"] == 3
    text = (out / names[2]).read_text()
    assert "the worker of group" in text and "BASE_URL=http://10.0.0.1:" in text and "'--node-rank'" not in text
    assert "  --node-rank 2" in text
    from tests.helpers.launcher_rig import shellcheck

    shellcheck(*(out / n for n in names))


# --- joining (from test_multinode_join.py) --------------------------------------------------------

# Multi-node group commands and the launchers' join rules, fast: the rendezvous each launcher gets, the
# --node-addresses rule, the vllm-router command of hybrid load balancing, and the join timeouts run for real
# on loopback with the stand-in `vllm` of tests/helpers/launcher_rig.py (a head whose stand-in never answers, a worker
# whose head port is closed). The same rules on separate network stacks with a real vLLM:
# tests/slow/test_multinode_netns.py.


ARGV = Command(("vllm", "serve", "m"), [("--port", "8000"), ("--tensor-parallel-size", "1")])  # a plan's typed command


def _expand(**kw):
    spec = ClusterSpec(**{"strategy": "multi_node_tp_dp", "nodes": 2, "gpus_per_node": 1, "head_address": "10.0.0.1",
                          **kw})
    return expand(spec, ARGV, {}, query_heads=4, port=8000, moe=False)


def test_hybrid_dp_with_node_addresses_prints_a_round_robin_router():
    c = _expand(node_addresses=("10.0.0.1", "10.0.0.2"), dp_lb="hybrid")
    router = c.commands[-1]
    assert router.role == "router" and router.node == 0 and router.port == 8100
    assert router.argv == ("vllm-router", "--policy", "round_robin", "--worker-urls", "http://10.0.0.1:8000",
                           "http://10.0.0.2:8000", "--host", "0.0.0.0", "--port", "8100")
    assert [c.address for c in c.commands] == ["10.0.0.1", "10.0.0.2", "10.0.0.1"]
    # Each node names its own address to vLLM (its guess is 0.0.0.0 without a default route).
    assert [cmd.env.get("VLLM_HOST_IP") for cmd in c.commands[:2]] == ["10.0.0.1", "10.0.0.2"]
    assert "VLLM_HOST_IP" not in _expand(dp_lb="hybrid").commands[0].env
    assert all(cmd.role != "router" for cmd in _expand(dp_lb="hybrid").commands)  # no addresses: a note only
    assert all(cmd.role != "router" for cmd in _expand(node_addresses=("10.0.0.1", "10.0.0.2"),
                                                        dp_lb="internal").commands)
    with pytest.raises(UsageError, match="--router-port 8000 is the nodes' --port"):
        _expand(node_addresses=("10.0.0.1", "10.0.0.2"), dp_lb="hybrid", router_port=8000)


@pytest.mark.parametrize("addrs, needle", [
    (("10.0.0.1",), "needs 2 addresses"),
    (("10.0.0.2", "10.0.0.1"), "node 0's being the --head-address 10.0.0.1"),
    (("10.0.0.1", "head node"), "--node-addresses 'head node' is not an IP address or host name"),
])
def test_node_addresses_rule(addrs, needle):
    with pytest.raises(UsageError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        _expand(node_addresses=addrs)


def test_rendezvous_is_the_dp_rpc_port_or_the_master_port():
    c = _expand(iface="eth1", dp_lb="internal", rpc_port=14000)
    assert _rendezvous(c.commands[1].argv, c.commands[1].env, 2) == {
        "join_host": "10.0.0.1", "join_port": 14000, "group_nodes": 2, "iface": "eth1"}
    tp = expand(ClusterSpec("multi_node_tp", nodes=2, gpus_per_node=2, head_address="10.0.0.1"), ARGV, {},
                query_heads=4, port=8000, moe=False)
    assert _rendezvous(tp.commands[1].argv, tp.commands[1].env, 2) == {
        "join_host": "10.0.0.1", "join_port": 29501, "group_nodes": 2, "iface": ""}


def _error_lines(stderr: bytes) -> list[str]:
    return [ln for ln in stderr.decode().splitlines() if "]: error: " in ln]


def test_a_worker_whose_head_port_is_closed_stops_with_one_line(tmp_path):
    rig = Rig(tmp_path)
    port = free_port()  # nothing listens there
    script = rig.write(make_plan(free_port(), extra=("--headless",)), name="w",
                       group={"group_role": "worker", "ready_host": "127.0.0.1", "ready_port": free_port(),
                              "join_host": "127.0.0.1", "join_port": port, "group_nodes": 2, "iface": "lo"})
    t0 = time.monotonic()
    # 1 s: the worker still tries twice (its port check every 2 s) before it gives up.
    res = rig.run(script, ROCM_DSPARK_JOIN_TIMEOUT_S="1", ROCM_DSPARK_GROUP_DIR=str(tmp_path / "group"))
    took = time.monotonic() - t0
    assert res.returncode == 1 and 1 <= took < 20, (took, res.stderr)
    assert _error_lines(res.stderr) == [
        f"rocm-dspark[w]: error: cannot reach the head at 127.0.0.1:{port} (interface lo) within 1s: start node 0 "
        f"first, or check --head-address, --iface and that port {port} is open"]
    assert rig.records() == []  # vLLM was never started


def test_a_missing_interface_stops_the_worker_at_once(tmp_path):
    rig = Rig(tmp_path)
    script = rig.write(make_plan(free_port(), extra=("--headless",)), name="w",
                       group={"group_role": "worker", "ready_host": "127.0.0.1", "ready_port": free_port(),
                              "join_host": "127.0.0.1", "join_port": free_port(), "group_nodes": 2,
                              "iface": "nope0"})
    res = rig.run(script, ROCM_DSPARK_JOIN_TIMEOUT_S="30", ROCM_DSPARK_GROUP_DIR=str(tmp_path / "group"), timeout=20)
    errors = _error_lines(res.stderr)
    assert res.returncode == 1 and len(errors) == 1, res.stderr
    assert "interface nope0 (--iface, GLOO_SOCKET_IFNAME) does not exist on this node" in errors[0]


def test_a_head_whose_workers_never_connect_stops_and_serves_nothing(tmp_path):
    rig = Rig(tmp_path)
    port = free_port()
    script = rig.write(make_plan(port), name="h",
                       group={"group_role": "head", "join_host": "127.0.0.1", "join_port": free_port(),
                              "group_nodes": 3, "iface": "lo"})
    t0 = time.monotonic()
    # The stand-in never answers /health (as vLLM's head while ranks are missing).
    res = rig.run(script, timeout=60, ROCM_DSPARK_JOIN_TIMEOUT_S="1", ROCM_DSPARK_READY_TIMEOUT_S="50",
                  ROCM_DSPARK_GROUP_DIR=str(tmp_path / "group"),
                  STANDIN_HEALTH="never")
    took = time.monotonic() - t0
    assert res.returncode == 1 and took < 30, (took, res.stderr)
    errors = _error_lines(res.stderr)
    assert len(errors) == 1 and errors[0].startswith("rocm-dspark[h]: error: 0 of 2 worker node(s) joined the group at "
                                                     "127.0.0.1:"), res.stderr
    assert "(interface lo) within 1s; stopped, nothing served" in errors[0]
    state = rig.state()
    assert state["phase"] == "failed" and state["attempts"][-1]["outcome"] == "workers_not_joined"
