"""The strategy flags shared by `recipe` and `launch` (rocm_dspark.recipe.strategies, rocm_dspark.recipe.cluster)."""

from __future__ import annotations

import click

from rocm_dspark.cli import bounds

STRATEGY_HELP = ("single_node | multi_node_tp | multi_node_tep | multi_node_dep | multi_node_tp_dp | multi_node_tp_pp | "
                 "pd_cluster (vllm-project/recipes' names; see recipes/strategies.yaml).")


def cluster_options(fn):
    opts = [
        click.option("--strategy", default=None, metavar="NAME", help=STRATEGY_HELP),
        click.option("--node-rank", type=bounds.NODE_RANK, default=None, help="Print only this node's commands (0 = head)."),
        click.option("--iface", default=None, help="Inter-node network interface: sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME."),
        click.option("--backend", type=click.Choice(["mp", "ray"]), default="mp", show_default=True,
                     help="mp: vLLM's own rendezvous; ray: a Ray cluster (node 0 runs the Ray head)."),
        click.option("--dp-lb", type=click.Choice(["hybrid", "internal"]), default=None,
                     help="DP strategies: hybrid (every node serves HTTP; the recipes' default) or internal (one endpoint on node 0, workers headless)."),
        click.option("--rpc-port", type=bounds.PORT, default=None, help="--data-parallel-rpc-port (default 13345)."),
        click.option("--prefill-nodes", type=bounds.PREFILL_NODES, default=None, help="pd_cluster: nodes in the prefill pool (default: half)."),
        click.option("--node-addresses", default=None, metavar="A,B,...",
                     help="Every node's address in node order (pd_cluster: prefill nodes first; other strategies: "
                          "node 0 is the --head-address), named in each node's commands and install lines."),
        click.option("--connector", type=click.Choice(["nixl", "moriio"]), default=None,
                     help="pd_cluster KV connector: nixl (RIXL/UCX, default) or moriio (ROCm-native)."),
        click.option("--router-port", type=bounds.PORT, default=None, help="pd_cluster: vllm-router's port (default 8000)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn
