"""Kubernetes manifests for a plan a test made: the cluster is expanded as `--format k8s` expands it
(rocm_dspark/recipe/cluster.py cluster_for with k8s=True: the leader's address is LEADER_PLACEHOLDER, a
prefill/decode node's a .invalid name), then rendered by rocm_dspark.launch.k8s.manifests_for."""

from __future__ import annotations

from rocm_dspark.launch.k8s import manifests_for
from rocm_dspark.recipe.strategies import LEADER_PLACEHOLDER, ClusterSpec, expand


def k8s_manifests(plan, spec: ClusterSpec, query_heads: int, name: str = "v41") -> list[dict]:
    spec = spec._replace(head_address=LEADER_PLACEHOLDER)
    if spec.strategy == "pd_cluster":
        spec = spec._replace(node_addresses=tuple(f"pd-node-{i}.invalid" for i in range(spec.nodes)))
    fallback = plan.block_argv if plan.adaptive_verification else None
    cluster = expand(spec, plan.argv, plan.env, query_heads=query_heads, block_argv=fallback, port=plan.port)
    return manifests_for(plan, cluster, name=name)
