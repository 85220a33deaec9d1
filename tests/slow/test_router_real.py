"""The vllm-router commands of pd_cluster (both connectors), hybrid-LB DP nodes and replicas through vllm-router's own argument parser
(vllm_router.launch_router.parse_router_args). vllm-router is not a dependency: point
ROCM_DSPARK_VLLM_ROUTER_PY at an interpreter that has it (`python -m venv v && v/bin/pip install vllm-router`;
checked with vllm-router 0.1.17). Nothing is started."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.resolve import Selection, resolve
from rocm_dspark.recipe.strategies import ClusterSpec, expand

pytestmark = pytest.mark.slow

CHILD = r'''
import json, sys
from vllm_router.launch_router import parse_router_args
out = []
for argv in json.load(sys.stdin):
    a = parse_router_args(argv[1:])
    out.append({k: getattr(a, k, None) for k in ("vllm_pd_disaggregation", "prefill_urls", "decode_urls", "policy",
                                                  "worker_urls",
                                                  "prefill_policy", "decode_policy", "kv_connector",
                                                  "vllm_discovery_address", "host", "port",
                                                  "worker_startup_timeout_secs")})
print(json.dumps(out))
'''


def test_router_commands_parse_with_vllm_router():
    py = os.environ.get("ROCM_DSPARK_VLLM_ROUTER_PY")
    if not py:
        pytest.skip("set ROCM_DSPARK_VLLM_ROUTER_PY to a python with vllm-router installed")
    cat = load_catalog()
    model = cat.find_model("V4.1-Flash")
    plan = resolve(cat, Selection(model="V4.1-Flash", gpu="mi355x"))
    argvs = []
    for conn in ("nixl", "moriio"):
        spec = ClusterSpec("pd_cluster", 3, node_addresses=("10.0.0.1", "10.0.0.2", "10.0.0.3"), connector=conn,
                           prefill_nodes=1)
        argvs.append(list(expand(spec, plan.argv, plan.env, query_heads=model.query_heads).commands[-1].argv))
    # External load balancing in front of hybrid-LB DP nodes (multi_node_tp_dp with --node-addresses).
    spec = ClusterSpec("multi_node_tp_dp", 2, head_address="10.0.0.1", node_addresses=("10.0.0.1", "10.0.0.2"))
    argvs.append(list(expand(spec, plan.argv, plan.env, query_heads=model.query_heads).commands[-1].argv))
    # Two independent TP-4 servers on one MI300X node (--strategy replicas).
    from rocm_dspark.usecase.launch_plan import cluster_for

    rep = cluster_for({"model": "V4.1-Flash", "gpu": "mi300x", "concurrency": 4, "adaptive": "off"},
                      {"strategy": "replicas"})[1]
    argvs.append(list(rep.commands[-1].argv))
    r = subprocess.run([py, "-c", CHILD], input=json.dumps(argvs), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    nixl, mori, dp, replicas = json.loads(r.stdout)
    assert replicas["worker_urls"] == [f"http://127.0.0.1:{c.port}" for c in rep.commands[:-1]] == [
        "http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert replicas["policy"] == "round_robin" and replicas["port"] == 8000 and not replicas["vllm_pd_disaggregation"]
    assert replicas["worker_startup_timeout_secs"] == 3600 and replicas["host"] == "0.0.0.0"
    assert dp["worker_urls"] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"] and dp["policy"] == "round_robin"
    assert dp["port"] == 8100 and not dp["vllm_pd_disaggregation"]
    assert nixl["vllm_pd_disaggregation"] and nixl["policy"] == "round_robin" and nixl["kv_connector"] == "nixl"
    assert [u[0] for u in nixl["prefill_urls"]] == ["http://10.0.0.1:8001"]
    assert nixl["decode_urls"] == ["http://10.0.0.2:8002", "http://10.0.0.3:8002"] and nixl["port"] == 8000
    assert mori["kv_connector"] == "moriio" and mori["vllm_discovery_address"] == "0.0.0.0:36367"
    assert mori["policy"] == mori["prefill_policy"] == mori["decode_policy"] == "consistent_hash"
