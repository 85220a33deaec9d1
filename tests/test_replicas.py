"""The `replicas` strategy: N independent TP-(GPUs/N) servers on one node behind vllm-router
(rocm_dspark/recipe/strategies.py _expand_replicas, rocm_dspark/recipe/cluster.py). A table of GPU x replicas x
concurrency: mono decode decided per replica from ceil(C/N) requests, every replica on its own GPUs and port,
the router over all of them; and the one-line refusals. vLLM 0.33.0's and vllm-router 0.1.17's own parsers read
the same commands in tests/slow/test_parser_real.py and tests/slow/test_router_real.py."""

from __future__ import annotations

import json
from functools import cache

import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.mono import decide
from rocm_dspark.recipe.plan import Command
from rocm_dspark.usecase.launch_plan import cluster_for
from tests.conftest import cli_env
from tests.helpers import run_cli


@cache
def _cluster(gpu: str, replicas: int | None = 2, concurrency: int | None = 4, **kw):
    opts = {"model": "V4.1-Flash", "gpu": gpu, "concurrency": concurrency, "adaptive": "off", **kw}
    return cluster_for(opts, {"strategy": "replicas", "replicas": replicas})


def _mono(note_holder):
    return [n for n in note_holder.notes if n.topic == "mono decode"]


# gpu, replicas, concurrency, TP per replica, mono on?, a fragment of the (one) mono note
CASES = [
    ("mi300x", 2, 4, 4, True, "steps of <= 7 requests at K=5"),
    ("mi300x", 2, 14, 4, True, "(42 rows <= 42"),                 # 7 per replica: the gfx942 bound exactly
    ("mi300x", 2, 15, 4, False, "8 requests x (1+K=6) = 48 rows > 42"),  # ceil(15/2) = 8: one over
    ("mi300x", 2, None, 4, False, "no --concurrency"),
    ("mi325x", 2, 8, 4, True, "ON (--monokernel)"),
    ("mi355x", 2, 16, 4, True, "(48 rows <= 48"),                 # 8 per replica: the gfx950 bound exactly
    ("mi355x", 2, 17, 4, False, "9 requests x (1+K=6)"),
    ("mi355x", 4, 8, 2, True, "ON (--monokernel)"),               # TP 2 replicas: the gfx950 kernels take TP 2
]


@pytest.mark.parametrize("gpu,replicas,conc,tp,on,fragment", CASES, ids=[f"{c[0]}-r{c[1]}-c{c[2]}" for c in CASES])
def test_mono_per_replica_and_distinct_gpus_and_ports(gpu, replicas, conc, tp, on, fragment):
    plan, c = _cluster(gpu, replicas, conc)
    (note,) = _mono(plan)
    assert (fragment in note.text or fragment in note.short) and note.short.startswith("ON" if on else "off: "), note
    servers, router = c.commands[:-1], c.commands[-1]
    assert [s.role for s in servers] == ["replica"] * replicas and router.role == "router"
    gpus = [s.env["HIP_VISIBLE_DEVICES"] for s in servers]
    assert gpus == [s.env["CUDA_VISIBLE_DEVICES"] for s in servers]  # vLLM refuses the two disagreeing
    assert gpus == [",".join(str(i) for i in range(r * tp, (r + 1) * tp)) for r in range(replicas)]
    ports = [s.port for s in servers]
    assert ports == list(range(8001, 8001 + replicas)) and router.port == 8000
    for s in servers:
        cmd = Command.from_words(s.argv)
        assert cmd.value("tensor_parallel_size") == str(tp) and cmd.value("port") == str(s.port)
        assert cmd.flags.has("monokernel") is on and s.block_argv is None  # --adaptive off: no fallback
        if on:  # a graph mode the kernels take, as the single TP-4 plan has it
            assert json.loads(cmd.value("compilation_config"))["cudagraph_mode"] == "FULL_DECODE_ONLY"
            assert s.env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0" and cmd.value("kv_cache_dtype") == "fp8_ds_mla"
        assert "--data-parallel-size" not in s.argv and "--enable-expert-parallel" not in s.argv
    r = list(router.argv)
    assert r[:3] == ["vllm-router", "--policy", "round_robin"]
    assert r[r.index("--worker-urls") + 1:r.index("--worker-urls") + 1 + replicas] == [
        f"http://127.0.0.1:{p}" for p in ports]
    assert r[r.index("--worker-startup-timeout-secs") + 1] == "3600"  # vLLM's own engine-ready deadline


def test_the_replica_is_the_single_node_plan_at_its_tp():
    """Each replica reuses the one-server TP-4 resolution (memory, capture, batch tokens), sized for ceil(C/N)."""
    from rocm_dspark.usecase.launch_plan import plan_from_options

    plan, c = _cluster("mi300x", 2, 8)
    alone = plan_from_options({"model": "V4.1-Flash", "gpu": "mi300x", "tp": 4, "concurrency": 4, "adaptive": "off"})
    assert [w if w != "8000" else "8001" for w in alone.argv] == list(c.commands[0].argv)  # only --port differs
    assert alone.env == {k: v for k, v in c.commands[0].env.items() if not k.endswith("_VISIBLE_DEVICES")}
    assert plan.memory == alone.memory and plan.max_num_batched_tokens == 2048
    notes = dict(c.notes)
    assert "ceil(8/2) = 4" in notes["concurrency"] and "188.8 GiB" in notes["host memory"]


def test_mi300x_tp8_note_names_the_replicas_command():
    plan, _ = cluster_for({"model": "V4.1-Flash", "gpu": "mi300x", "concurrency": 4, "adaptive": "off"},
                          {"strategy": "single_node"})
    (note,) = _mono(plan)
    assert "--strategy replicas --replicas 2 would take it" in note.short
    assert "2 independent TP-4 servers behind vllm-router, 2 requests each" in note.text


def test_tp8_note_offers_replicas_only_where_each_replica_fits():
    from rocm_dspark.recipe.catalog import load_catalog

    cat = load_catalog()
    gpu = cat.find_gpu("mi300x")
    kw = dict(model="DeepSeek-V4.1-Flash", gpu=gpu, build="v0.33.0", has_change=True, tp=8, dp=1, ep=1, nodes=1, k=5,
              capture_size=1024, k_schedule=False)
    assert "--strategy replicas" in decide(cat.mono, concurrency=14, **kw).short      # 7 each: 42 rows
    assert "--strategy replicas" not in decide(cat.mono, concurrency=16, **kw).why    # 8 each: 48 > 42
    dp = decide(cat.mono, concurrency=4, **dict(kw, tp=4, dp=2))
    assert "--strategy replicas --replicas 2 would" in dp.why and not dp.on


@pytest.mark.parametrize("gpu,replicas,copts,opts,fragment", [
    ("mi300x", 3, {}, {}, "--replicas 3 does not divide the node's 8 GPUs; use one of 2, 4, 8"),
    ("mi300x", 1, {}, {}, "give 2 or more"),
    ("mi300x", 4, {}, {}, "--replicas 4: each TP-2 replica: no room for KV cache"),  # TP 2 does not fit MI300X
    ("mi300x", 8, {}, {}, "--replicas 8: each TP-1 replica: no room for KV cache"),
    ("mi300x", 2, {}, {"nodes": 2}, "splits ONE node's GPUs"),
    ("mi300x", 2, {}, {"dp": 2}, "--dp is set by --strategy replicas"),
    ("mi300x", 2, {}, {"tp": 8}, "each replica is TP 4; drop --tp"),
    ("mi300x", 2, {}, {"tp": 2}, "drop --tp or pass --replicas 4"),
    ("mi300x", 2, {"router_port": 8001}, {}, "--router-port 8001 collides with the replicas' ports 8000-8001"),
    ("mi300x", 2, {}, {"extra_env": ("CUDA_VISIBLE_DEVICES=1",)}, "drop --env CUDA_VISIBLE_DEVICES"),
    ("mi300x", 2, {}, {"extra_env": ("ROCR_VISIBLE_DEVICES=1",)}, "drop --env ROCR_VISIBLE_DEVICES"),
    ("mi300x", 2, {"backend": "ray"}, {}, "--backend ray does not apply to --strategy replicas"),
    ("mi300x", 2, {"iface": "ens5"}, {}, "--iface does not apply"),
    ("mi300x", 2, {}, {"head_address": "10.0.0.1"}, "--head-address does not apply"),
])
def test_refused_in_one_line(gpu, replicas, copts, opts, fragment):
    with pytest.raises(UsageError) as exc:
        cluster_for({"model": "V4.1-Flash", "gpu": gpu, "concurrency": 4, "adaptive": "off", **opts},
                    {"strategy": "replicas", "replicas": replicas, **copts})
    assert fragment in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_replicas_without_its_strategy_is_refused():
    with pytest.raises(UsageError, match="--replicas applies to --strategy replicas, not pd_cluster"):
        cluster_for({"model": "V4.1-Flash", "gpu": "mi300x", "adaptive": "off"}, {"strategy": "pd_cluster", "replicas": 2})


def test_kubernetes_is_refused_with_the_way_to_do_it():
    with pytest.raises(UsageError, match="no Kubernetes form.*kubectl scale --replicas 2"):
        cluster_for({"model": "V4.1-Flash", "gpu": "mi300x", "adaptive": "off"}, {"strategy": "replicas"}, k8s=True)


@pytest.mark.parametrize("strategy, also", [(("replicas",), ""),
                                             (("pd_cluster", "--nodes", "2", "--node-addresses", "10.0.0.1,10.0.0.2"),
                                              " or k8s")])
def test_format_docker_names_only_the_formats_the_strategy_has(strategy, also):
    r = run_cli(["recipe", "--model", "V4.1-Flash", "--gpu", "mi355x", "--strategy", *strategy, "--format", "docker",
                 "--adaptive", "off"], env=cli_env())
    assert r.returncode == 2 and r.stderr.strip().endswith(f"with --strategy use shell or json{also}"), r.stderr


def test_recipe_prints_a_section_per_server_and_the_router():
    r = run_cli(["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--strategy", "replicas", "--concurrency", "4",
                 "--adaptive", "off"], env=cli_env())
    assert r.returncode == 0, r.stderr
    heads = [ln for ln in r.stdout.splitlines() if ln.startswith("# --- ")]
    assert heads == ["# --- node 0: replica 0 on GPUs 0,1,2,3, serves HTTP on :8001",
                     "# --- node 0: replica 1 on GPUs 4,5,6,7, serves HTTP on :8002",
                     "# --- node 0: router, serves HTTP on :8000"]
    assert r.stdout.count("  --monokernel \\") == 2 and r.stdout.count("# mono decode: ON (--monokernel)") == 1


def test_launch_writes_a_launcher_per_replica_and_the_router_script(tmp_path):
    from rocm_dspark.launch.launch_group import write_group
    from rocm_dspark.launch.observability import targets

    plan, c = _cluster("mi300x", 2, 4)
    got = write_group(plan, c, tmp_path, "systemd", name="v41")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert {"v41-replica0.sh", "v41-replica0.service", "v41-replica1.sh", "v41-replica1.service",
            "v41-router.sh"} <= set(names)
    r0, r1 = (tmp_path / "v41-replica0.sh").read_text(), (tmp_path / "v41-replica1.sh").read_text()
    assert "export HIP_VISIBLE_DEVICES='0,1,2,3'" in r0 and "export CUDA_VISIBLE_DEVICES='4,5,6,7'" in r1
    assert "--monokernel" in r0 and "  --port 8002" in r1
    router = (tmp_path / "v41-router.sh").read_text()
    assert "exec vllm-router --policy round_robin --worker-urls http://127.0.0.1:8001 http://127.0.0.1:8002" in router
    assert any("then v41-router.sh" in n for n in got["next"])
    assert [t.address for t in targets(plan, c)] == ["127.0.0.1:8001", "127.0.0.1:8002"]  # Prometheus: each replica
