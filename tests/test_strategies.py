"""Strategies: every node's argv/env from one node's plan (rocm_dspark/recipe/strategies.py). vLLM's own parser checks
the same argvs in tests/slow/test_strategies_real.py; here the rules themselves are pinned down."""

from __future__ import annotations

import json
from functools import lru_cache

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.plan import Command
from rocm_dspark.recipe.resolve import Selection, resolve
from rocm_dspark.recipe.strategies import STRATEGY_NAMES, ClusterSpec, expand, kv_transfer_config, layout_for

GPUS = ("mi300x", "mi325x", "mi350x", "mi355x")
MULTI = ("multi_node_tp", "multi_node_tep", "multi_node_dep", "multi_node_tp_dp", "multi_node_tp_pp")


@lru_cache(maxsize=None)
def _plan(gpu: str):
    cat = load_catalog()
    return resolve(cat, Selection(model="V4.1-Flash", gpu=gpu)), cat.find_model("V4.1-Flash").query_heads


def cluster(gpu="mi300x", strategy="multi_node_dep", nodes=2, **kw):
    plan, heads = _plan(gpu)
    kw.setdefault("head_address", "10.0.0.1")
    if strategy == "pd_cluster":
        kw.setdefault("node_addresses", tuple(f"10.0.0.{i + 1}" for i in range(nodes)))
    spec = ClusterSpec(strategy=strategy, nodes=nodes, **kw)
    return expand(spec, plan.argv, plan.env, query_heads=heads, block_argv=None, port=plan.port)


def flag(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


def test_names_are_the_recipes_names():
    assert STRATEGY_NAMES == ("single_node", "multi_node_tp", "multi_node_tep", "multi_node_dep", "multi_node_tp_dp",
                              "multi_node_tp_pp", "pd_cluster", "replicas")


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("strategy", MULTI)
@pytest.mark.parametrize("nodes", (2, 4))
def test_every_node_and_the_same_k_everywhere(gpu, strategy, nodes):
    c = cluster(gpu, strategy, nodes, iface="ens5")
    assert [x.node for x in c.commands] == list(range(nodes))
    specs = {flag(x.argv, "--speculative-config") for x in c.commands}
    assert len(specs) == 1 and json.loads(specs.pop())["num_speculative_tokens"] == 5
    for x in c.commands:
        assert x.env["GLOO_SOCKET_IFNAME"] == x.env["NCCL_SOCKET_IFNAME"] == "ens5"
        assert x.argv.count("--tensor-parallel-size") == 1
    head = c.commands[0]
    assert head.role == "head" and head.serves_http and "--headless" not in head.argv


def test_multi_node_tp_mp_rendezvous():
    c = cluster(strategy="multi_node_tp", nodes=4)
    for r, x in enumerate(c.commands):
        assert flag(x.argv, "--tensor-parallel-size") == "32"
        assert (flag(x.argv, "--nnodes"), flag(x.argv, "--node-rank"), flag(x.argv, "--master-addr")) == ("4", str(r), "10.0.0.1")
        assert ("--headless" in x.argv) == (r > 0)
        assert "--enable-expert-parallel" not in x.argv
    assert all("--enable-expert-parallel" in x.argv for x in cluster(strategy="multi_node_tep").commands)


def test_multi_node_tp_refuses_tp_that_does_not_divide_heads():
    with pytest.raises(UsageError, match="query heads"):
        cluster(strategy="multi_node_tp", nodes=3)  # 24 does not divide 64


def test_dep_hybrid_and_internal():
    c = cluster(strategy="multi_node_dep", nodes=2)
    for r, x in enumerate(c.commands):
        assert flag(x.argv, "--data-parallel-size") == "16" and flag(x.argv, "--data-parallel-size-local") == "8"
        assert flag(x.argv, "--tensor-parallel-size") == "1"
        assert flag(x.argv, "--data-parallel-start-rank") == str(8 * r)
        assert flag(x.argv, "--data-parallel-address") == "10.0.0.1" and flag(x.argv, "--data-parallel-rpc-port") == "13345"
        assert "--data-parallel-hybrid-lb" in x.argv and "--headless" not in x.argv and x.serves_http
    c = cluster(strategy="multi_node_dep", nodes=2, dp_lb="internal", rank_tp=2, rpc_port=20000)
    head, worker = c.commands
    assert "--data-parallel-start-rank" not in head.argv  # a start rank without --headless means hybrid LB in vLLM
    assert flag(worker.argv, "--data-parallel-start-rank") == "4" and "--headless" in worker.argv
    assert flag(head.argv, "--data-parallel-size") == "8" and flag(head.argv, "--tensor-parallel-size") == "2"
    assert flag(worker.argv, "--data-parallel-rpc-port") == "20000" and not worker.serves_http


def test_tp_dp_and_tp_pp():
    head, worker = cluster("mi355x", "multi_node_tp_dp").commands
    assert flag(head.argv, "--tensor-parallel-size") == "8" and flag(head.argv, "--data-parallel-size") == "2"
    assert flag(worker.argv, "--data-parallel-start-rank") == "1" and flag(head.argv, "--data-parallel-start-rank") == "0"
    # Hybrid LB on every node: vLLM's head refuses a remote rank that is not headless otherwise (tried).
    assert "--data-parallel-hybrid-lb" in head.argv and "--data-parallel-hybrid-lb" in worker.argv
    head, worker = cluster("mi355x", "multi_node_tp_pp").commands
    assert flag(head.argv, "--pipeline-parallel-size") == "2" and flag(worker.argv, "--node-rank") == "1"
    assert "--headless" in worker.argv


def test_ray_variant():
    c = cluster(strategy="multi_node_dep", backend="ray")
    head, worker = c.commands
    # The head's address as DP master: vLLM's own guess (get_ip) is 0.0.0.0 on a node without a default route,
    # which Ray refuses (docs/multinode.md, tried on network namespaces).
    assert flag(head.argv, "--data-parallel-backend") == "ray" and flag(head.argv, "--data-parallel-address") == "10.0.0.1"
    assert head.setup == (("ray", "start", "--head", "--port=6379"),)
    assert worker.argv == ("ray", "start", "--address=10.0.0.1:6379", "--block")
    head, _ = cluster(strategy="multi_node_tp_pp", backend="ray").commands
    assert flag(head.argv, "--distributed-executor-backend") == "ray" and "--nnodes" not in head.argv


def test_single_node_is_todays_plan():
    plan, heads = _plan("mi300x")
    c = expand(ClusterSpec(), plan.argv, plan.env, query_heads=heads)
    assert c.commands[0].argv == plan.argv and c.commands[0].env == plan.env


@pytest.mark.parametrize("kw, match", [
    ({"strategy": "multi_node_dep", "nodes": 1}, "--nodes 2 or more"),
    ({"strategy": "single_node", "nodes": 2}, "runs on one node"),
    ({"strategy": "multi_node_dep", "head_address": None}, "needs --head-address"),
    ({"strategy": "multi_node_dep", "head_address": "10.0.0.1; rm -rf /"}, "not an IP address"),
    ({"strategy": "multi_node_dep", "rank_tp": 3}, "must divide the 8 GPUs"),
    ({"strategy": "multi_node_tp", "nodes": 16}, "query heads"),
    ({"strategy": "multi_node_dep", "iface": "eth0 x"}, "interface name"),
    ({"strategy": "multi_node_dep", "backend": "slurm"}, "use mp or ray"),
    ({"strategy": "nope"}, "--strategy 'nope'"),
    ({"strategy": "pd_cluster", "nodes": 1}, "2 or more"),
    ({"strategy": "pd_cluster", "node_addresses": ("10.0.0.1",)}, "--node-addresses"),
    ({"strategy": "pd_cluster", "prefill_nodes": 2}, "--prefill-nodes"),
    ({"strategy": "pd_cluster", "connector": "mooncake"}, "nixl or moriio"),
])
def test_bad_input_is_one_line(kw, match):
    with pytest.raises(UsageError, match=match) as e:
        cluster(**kw)
    assert "\n" not in str(e.value)


def _with_spec(argv, **changes):
    """The plan's command with its speculative config changed (through its typed flags, recipe/plan.py)."""
    spec = json.dumps({**json.loads(argv.flags.get("speculative_config")), **changes}, separators=(",", ":"))
    return Command(argv.head, [(f, spec if f == "--speculative-config" else v) for f, v in argv.flags])


def test_a_group_command_keeps_a_value_that_starts_with_a_dash_glued_to_its_flag():
    # strategies re-parsed the plan's argv and wrote `--flag value` back, so a user value like -1 became a word of
    # its own, which vLLM's argparse may read as a flag; the node commands now render from the typed flags.
    cat = load_catalog()
    plan = resolve(cat, Selection(model="V4.1-Flash", gpu="mi355x", extra_args=("--seed=-1",)))
    assert "--seed=-1" in plan.argv
    c = expand(ClusterSpec("multi_node_dep", 2, head_address="10.0.0.1"), plan.argv, plan.env,
               query_heads=cat.find_model("V4.1-Flash").query_heads)
    for cmd in c.commands:
        assert "--seed=-1" in cmd.argv and "-1" not in cmd.argv and cmd.argv.flags.get("seed") == "-1"


def test_vllm_refusals():
    plan, heads = _plan("mi355x")
    adaptive = _with_spec(plan.argv, enable_adaptive_verification=True)
    with pytest.raises(UsageError, match="pipeline parallel"):
        expand(ClusterSpec("multi_node_tp_pp", 2, head_address="10.0.0.1"), adaptive, plan.env, query_heads=heads)
    # Adaptive verification with every other strategy is allowed (DP/TP/EP are fine in vLLM).
    expand(ClusterSpec("multi_node_dep", 2, head_address="10.0.0.1"), adaptive, plan.env, query_heads=heads)
    schedule = _with_spec(plan.argv, num_speculative_tokens_per_batch_size=[[1, 8, 5], [9, 1024, 3]])
    for s in ("multi_node_dep", "multi_node_tp_dp"):
        with pytest.raises(UsageError, match="per-batch-size K"):
            expand(ClusterSpec(s, 2, head_address="10.0.0.1"), schedule, plan.env, query_heads=heads)
    expand(ClusterSpec("multi_node_tp", 2, head_address="10.0.0.1"), schedule, plan.env, query_heads=heads)


def test_fallback_argv_follows_every_node():
    plan, heads = _plan("mi355x")
    adaptive = _with_spec(plan.argv, enable_adaptive_verification=True)
    c = expand(ClusterSpec("multi_node_dep", 2, head_address="10.0.0.1"), adaptive, plan.env, query_heads=heads,
               block_argv=plan.argv)
    for x in c.commands:
        assert x.block_argv is not None
        assert [a for a in x.argv if not a.startswith("{")] == [a for a in x.block_argv if not a.startswith("{")]
        assert json.loads(flag(x.block_argv, "--speculative-config"))["enable_adaptive_verification"] is False


@pytest.mark.parametrize("connector", ("nixl", "moriio"))
def test_pd_cluster(connector):
    c = cluster("mi355x", "pd_cluster", nodes=3, connector=connector, prefill_nodes=1)
    roles = [x.role for x in c.commands]
    assert roles == ["prefill", "decode", "decode", "router"]
    assert "no public" in c.status
    specs = set()
    for x in c.commands[:-1]:
        cfg = json.loads(flag(x.argv, "--kv-transfer-config"))
        assert cfg == kv_transfer_config(connector, x.role, http_port=x.port, proxy_ip="10.0.0.1")
        assert cfg["kv_role"] == ("kv_producer" if x.role == "prefill" else "kv_consumer")
        assert flag(x.argv, "--port") == str(x.port) == ("8001" if x.role == "prefill" else "8002")
        specs.add(flag(x.argv, "--speculative-config"))
        if x.role == "decode":
            assert json.loads(flag(x.argv, "--compilation-config"))["cudagraph_mode"] == "FULL_DECODE_ONLY"
        if connector == "nixl":
            assert x.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == x.address
            assert x.env["UCX_TLS"] == "all" and "NCCL_SOCKET_IFNAME" not in x.env
        else:
            assert set(cfg["kv_connector_extra_config"]) == {"proxy_ip", "proxy_ping_port", "http_port", "handshake_port", "notify_port"}
    assert len(specs) == 1  # DSpark in both pools, same K
    router = c.commands[-1].argv
    assert router[:2] == ("vllm-router", "--vllm-pd-disaggregation")
    if connector == "nixl":
        assert flag(router, "--prefill") == "http://10.0.0.1:8001"
        assert [router[i + 1] for i, a in enumerate(router) if a == "--decode"] == ["http://10.0.0.2:8002", "http://10.0.0.3:8002"]
        assert flag(router, "--policy") == "round_robin"
    else:
        assert flag(router, "--kv-connector") == "moriio" and flag(router, "--vllm-discovery-address") == "0.0.0.0:36367"


def test_layout_numbers():
    assert layout_for(ClusterSpec("multi_node_dep", 4, gpus_per_node=8), 64)["dp"] == 32
    assert layout_for(ClusterSpec("multi_node_tp_dp", 3, gpus_per_node=8, rank_tp=4), 64)["dp"] == 6
    with pytest.raises(UsageError, match="mixture-of-experts"):
        layout_for(ClusterSpec("multi_node_tep", 2), 64, moe=False)
