"""`rocm-dspark recipe --strategy ...` end to end (a real subprocess): every node's command, one node's, and one
line with exit status 2 for each bad input."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.conftest import cli_env
from tests.helpers import run_cli as run_cli_in_process

BASE = ["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x"]


def run(*args, check=True):
    r = run_cli_in_process(BASE + list(args), capture_output=True, text=True, env=cli_env(), timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def test_done_when_every_node_as_json():
    # v0.33.0: its wheel shards resident Engram tables over the node-local DP group; at TP1 on a build not shown
    # to, every rank would hold all 188.8 GiB of them and the memory check refuses (tests/test_memory_layout.py).
    r = run("--strategy", "multi_node_dep", "--nodes", "2", "--head-address", "10.0.0.1", "--format", "json",
            "--vllm-version", "0.33.0")
    d = json.loads(r.stdout)
    assert d["strategy"] == "multi_node_dep" and d["layout"]["dp"] == 16
    nodes = [c["node"] for c in d["commands"]]
    assert nodes == [0, 1]
    for c in d["commands"]:
        argv = c["argv"]
        assert argv[:2] == ["vllm", "serve"]
        assert argv[argv.index("--data-parallel-start-rank") + 1] == str(8 * c["node"])
        assert argv[argv.index("--data-parallel-address") + 1] == "10.0.0.1"
    assert d["plan"]["profile"] == "DeepSeek-V4.1-Flash/mi300x"


def test_one_node_as_shell_is_copy_pasteable():
    r = run("--strategy", "multi_node_tp", "--nodes", "2", "--head-address", "10.0.0.1", "--node-rank", "1",
            "--iface", "ens5")
    body = [line for line in r.stdout.splitlines() if not line.startswith("#") and line.strip()]
    words = shlex.split(" ".join(line.rstrip("\\") for line in body))
    env = dict(w.split("=", 1) for w in words[: words.index("vllm")])
    argv = words[words.index("vllm"):]
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ens5"
    assert argv[argv.index("--node-rank") + 1] == "1" and "--headless" in argv
    assert "# --- node 1: worker, no HTTP (headless)" in r.stdout


def test_json_with_rank_gives_that_node_only():
    d = json.loads(run("--strategy", "pd_cluster", "--nodes", "2", "--node-addresses", "10.0.0.1,10.0.0.2",
                       "--format", "json", "--node-rank", "0").stdout)
    assert [c["role"] for c in d["commands"]] == ["prefill", "router"]
    assert "no public" in d["status"]


def test_k8s_format_prints_manifests():
    import yaml

    docs = list(yaml.safe_load_all(run("--strategy", "multi_node_tp_pp", "--nodes", "2", "--format", "k8s").stdout))
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim"] * 2 + ["LeaderWorkerSet", "Service", "CronJob"]
    # A pod learns the leader's address from LWS, whatever --head-address says (the cluster is expanded that way).
    out = run("--strategy", "multi_node_tp", "--nodes", "2", "--head-address", "10.0.0.1", "--format", "k8s").stdout
    assert "10.0.0.1" not in out and '--master-addr "$${LWS_LEADER_ADDRESS}"' in out


@pytest.mark.parametrize("args, needle", [
    (["--strategy", "multi_node_dep", "--nodes", "3", "--head-address", "10.0.0.1", "--tp", "3"], "must divide the 8 GPUs"),
    (["--strategy", "multi_node_dep", "--nodes", "2", "--head-address", "10.0.0.1", "--node-rank", "2"], "out of range"),
    (["--strategy", "multi_node_dep", "--nodes", "2"], "needs --head-address"),
    (["--strategy", "multi_node_tp", "--nodes", "16", "--head-address", "10.0.0.1"], "query heads"),
    (["--strategy", "multi_node_dep", "--nodes", "2", "--head-address", "10.0.0.1", "--dp", "4"], "--dp is set by"),
    (["--strategy", "pd_cluster", "--nodes", "2"], "--node-addresses"),
    (["--strategy", "multi_node_dep", "--nodes", "2", "--head-address", "10.0.0.1", "-k", "5,3"], "one K for every rank"),
    (["--strategy", "warp_drive"], "--strategy 'warp_drive'"),
    (["--node-rank", "1"], "--node-rank needs --strategy"),
    (["--strategy", "multi_node_tp", "--nodes", "2", "--format", "k8s", "--node-rank", "1"], "drop --node-rank"),
    (["--strategy", "pd_cluster", "--nodes", "2", "--format", "k8s", "--connector", "moriio"], "MoRIIO"),
    (["--strategy", "multi_node_tp", "--nodes", "2", "--format", "k8s", "--node-addresses", "10.0.0.1,10.0.0.2"],
     "--node-addresses does not apply to --format k8s"),
    (["--strategy", "multi_node_tp_pp", "--nodes", "2", "--head-address", "10.0.0.1", "--adaptive", "on"], None),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    r = run(*args, check=False)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rocm-dspark: error: ") and "Traceback" not in r.stderr
    if needle:
        assert needle in lines[0]
    assert r.stdout == ""


@pytest.mark.parametrize("command", ["recipe", "launch"])
@pytest.mark.parametrize("flags, needle", [
    (["--node-rank", "1"], "--node-rank needs --strategy"),
    (["--iface", "eth0"], "--iface applies to a multi-node layout: add --strategy NAME, or drop --iface"),
    (["--dp-lb", "internal"], "--dp-lb applies to a multi-node layout"),
    (["--router-port", "9000"], "--router-port applies to a multi-node layout"),
    (["--backend", "ray"], "--backend applies to a multi-node layout"),
    (["--replicas", "2"], "--replicas needs --strategy replicas"),
])
def test_a_cluster_flag_without_strategy_is_refused_not_ignored(command, flags, needle, tmp_path):
    """`launch --node-rank 1` without --strategy once wrote the one-node launcher as if the flag were not there."""
    out = tmp_path / "out"
    extra = ["--output", str(out)] if command == "launch" else []
    r = run_cli_in_process([command, "--model", "V4.1-Flash", "--gpu", "mi300x", *extra, *flags], env=cli_env())
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, (r.stdout, r.stderr)
    assert not out.exists()
