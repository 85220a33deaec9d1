"""Issue 32 in Kubernetes: no pod is ever "proving", so the readinessProbe vLLM's /v1/models gives is the finished
endpoint's readiness (docs/up.md, "Readiness while proving").

The manifests run the plan's block command even where the gate proved adaptive verification (the adaptive start
and its fallback live in the bash launcher, which pods do not run), so nothing is proved in a pod. Checked on a
plan the gate switched to adaptive, with the real schemas of tests/test_k8s.py (kubernetes-validate, strict, and
the vendored LeaderWorkerSet CRD).
"""

from __future__ import annotations

import shlex

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.plan import Verdict
from rocm_dspark.recipe.resolve import Selection, resolve
from rocm_dspark.recipe.strategies import ClusterSpec
from tests.helpers.k8s_cluster import k8s_manifests

k8s = pytest.importorskip("tests.test_k8s")  # its validators skip without kubernetes-validate / jsonschema


@pytest.mark.parametrize("strategy", ("single_node", "multi_node_tp", "pd_cluster"))
def test_a_gate_proven_adaptive_plan_still_runs_block_in_pods_and_readiness_waits_for_the_model(strategy):
    cat = load_catalog()
    proven = Verdict(adaptive_proven=True, reason="planted for this test", record="none")
    plan = resolve(cat, Selection(model="V4.1-Flash", gpu="mi300x"), proven)
    assert plan.adaptive_verification and '"enable_adaptive_verification":true' in " ".join(map(str, plan.argv))
    spec = ClusterSpec(strategy=strategy, nodes=1 if strategy == "single_node" else 2, iface="eth0")
    objs = k8s_manifests(plan, spec, cat.find_model("V4.1-Flash").query_heads)
    for obj in objs:
        k8s.validate(obj)
    served = 0
    for pod in k8s._pods(objs):
        c = pod["containers"][0]
        if c["name"] == "vllm-router":
            continue
        argv = shlex.split(k8s._script(c))
        sc = argv[argv.index("--speculative-config") + 1]
        assert '"enable_adaptive_verification":false' in sc, sc
        if "readinessProbe" in c:  # every pod that serves HTTP: ready only once the model is listed
            served += 1
            assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models"
            assert c["startupProbe"]["httpGet"]["path"] == "/health"
    assert served >= 1
