"""Multi-node group commands and the launchers' join rules, fast: the rendezvous each launcher gets, the
--node-addresses rule, the vllm-router command of hybrid load balancing, and the join timeouts run for real
on loopback with the stand-in `vllm` of test_launchers_run.py (a head whose stand-in never answers, a worker
whose head port is closed). The same rules on separate network stacks with a real vLLM:
tests/slow/test_multinode_netns.py."""

from __future__ import annotations

import time

import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.launch.launch_group import _rendezvous
from rocm_dspark.recipe.plan import Command
from rocm_dspark.recipe.strategies import ClusterSpec, expand
from tests.test_launchers_run import Rig, free_port, make_plan

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
    res = rig.run(script, ROCM_DSPARK_JOIN_TIMEOUT_S="3", ROCM_DSPARK_GROUP_DIR=str(tmp_path / "group"))
    took = time.monotonic() - t0
    assert res.returncode == 1 and 3 <= took < 20, (took, res.stderr)
    assert _error_lines(res.stderr) == [
        f"rocm-dspark[w]: error: cannot reach the head at 127.0.0.1:{port} (interface lo) within 3s: start node 0 "
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
    res = rig.run(script, timeout=60, ROCM_DSPARK_JOIN_TIMEOUT_S="2", ROCM_DSPARK_READY_TIMEOUT_S="50",
                  ROCM_DSPARK_GROUP_DIR=str(tmp_path / "group"),
                  STANDIN_HEALTH="never")
    took = time.monotonic() - t0
    assert res.returncode == 1 and took < 30, (took, res.stderr)
    errors = _error_lines(res.stderr)
    assert len(errors) == 1 and errors[0].startswith("rocm-dspark[h]: error: 0 of 2 worker node(s) joined the group at "
                                                     "127.0.0.1:"), res.stderr
    assert "(interface lo) within 2s; stopped, nothing served" in errors[0]
    state = rig.state()
    assert state["phase"] == "failed" and state["attempts"][-1]["outcome"] == "workers_not_joined"
