"""The selection and cluster flags, declared once. The click options
(rocm_dspark.cli.options builds them from these records), the keys the library takes (SELECTION_KEYS,
CLUSTER_KEYS) and the words that give a selection back to a command (`selection_argv`: the commands `up`
prints and runs) all come from here. No click: this is on the `rocm-dspark recipe` path."""

from __future__ import annotations

from typing import NamedTuple


class Opt(NamedTuple):
    key: str  # the keyword the command receives, and the library's key
    flags: tuple[str, ...]  # the first, a long flag, is the one selection_argv writes
    help: str
    type: str | None = None  # a rocm_dspark.cli.bounds name; None: text
    default: object = None  # selection_argv leaves a value equal to it out
    switch: bool = False
    multiple: bool = False
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    envvar: str | None = None
    required: bool = False
    callback: str | None = None  # a rocm_dspark.cli.options function run on the value
    show_default: bool = False


SELECTION_OPTIONS = (
    Opt("model", ("--model", "-m"), "Model name or alias, e.g. V4.1-Flash.", required=True),
    Opt(
        "gpu",
        ("--gpu",),
        "GPU: a recipes/gpus.yaml key (see `rocm-dspark list`); detected with amd-smi/rocminfo when omitted.",
    ),
    Opt("gpus_per_node", ("--gpus-per-node",), "GPUs per node (default: the GPU's usual 8).", "GPUS_PER_NODE"),
    Opt("nodes", ("--nodes",), "Number of nodes (data parallel across nodes).", "NODES", 1, show_default=True),
    Opt("head_address", ("--head-address",), "IP of node 0, needed with --nodes > 1."),
    Opt("tp", ("--tp",), "Tensor parallel size (default: the profile's).", "RANKS"),
    Opt("dp", ("--dp",), "Data parallel size (default: the profile's).", "RANKS"),
    Opt("ep", ("--ep",), "Expert parallel size: 1 (off) or tp x dp.", "RANKS"),
    Opt("max_num_seqs", ("--max-num-seqs",), "Max concurrent sequences (default: the profile's).", "SEQS"),
    Opt(
        "max_num_batched_tokens",
        ("--max-num-batched-tokens",),
        "Token budget per step (default: the profile's).",
        "TOKENS",
    ),
    Opt(
        "num_speculative_tokens",
        ("--num-speculative-tokens", "-k"),
        "DSpark draft length K, 1..block size (default: the block size, 5).",
    ),
    Opt(
        "k_schedule",
        ("--k-per-batch-size",),
        "Per-batch-size K (vLLM num_speculative_tokens_per_batch_size), e.g. "
        "1-16:5,17-64:4,65-128:2: what `plan` prints when it recommends one.",
        metavar="LO-HI:K[,...]",
    ),
    Opt(
        "no_speculation",
        ("--no-speculation",),
        "Serve the target model without a DSpark draft (what `plan` prints when drafting does not pay).",
        default=False,
        switch=True,
    ),
    Opt(
        "capture_cap",
        ("--capture-cap",),
        "Upper bound for the graph capture size (default: the profile's, 2048).",
        "SEQS",
    ),
    Opt(
        "vllm_version",
        ("--vllm-version",),
        "vLLM release (e.g. 0.33.0) or build name to plan for; maps onto a build in recipes/vllm.yaml.",
    ),
    Opt(
        "build",
        ("--build",),
        "vLLM build to plan for (recipes/vllm.yaml; default: the GPU arch's release there, the "
        "first tag the registry holds per `rocm-dspark images`).",
    ),
    Opt(
        "concurrency",
        ("--concurrency",),
        "Expected concurrent requests: drives the workload rules in the recipe "
        "(batch tokens, Engram offload). A list (as plan and up take) sizes the plan for its largest level.",
        metavar="C[,C...]",
        callback="largest_level",
    ),
    Opt(
        "memory_override",
        ("--memory-override",),
        "Emit the plan even when the memory model finds no room for KV cache (recorded in the notes).",
        default=False,
        switch=True,
    ),
    Opt(
        "adaptive",
        ("--adaptive",),
        "auto: on only with a matching, complete probe record; off: block verification; on: require a record.",
        default="auto",
        choices=("auto", "off", "on"),
        show_default=True,
    ),
    Opt(
        "state_dir",
        ("--state-dir",),
        "Where rocm-dspark keeps its state: probe and A/B records, registry answers, "
        "up's steps (default: $ROCM_DSPARK_STATE_DIR or the XDG state dir).",
    ),
    Opt(
        "benchmark_synthetic",
        ("--benchmark-synthetic",),
        "Benchmark only: synthetic acceptance length AL instead of real rejection. Never for serving.",
        "ACCEPTANCE",
        metavar="AL",
    ),
    Opt("model_path", ("--model-path",), "Serve from this local path instead of the Hugging Face id."),
    Opt("served_name", ("--served-model-name",), "Name clients use (default: the HF id)."),
    Opt("host", ("--host",), "Address to bind (default: 0.0.0.0)."),
    Opt("port", ("--port",), "Port (default: 8000).", "PORT"),
    Opt(
        "extra_args",
        ("--vllm-arg",),
        "Extra vLLM flag, applied last (repeatable).",
        multiple=True,
        metavar="--FLAG[=VALUE]",
    ),
    Opt("extra_env", ("--env",), "Extra environment variable (repeatable).", multiple=True, metavar="KEY=VALUE"),
    Opt(
        "image",
        ("--image",),
        "Run this image instead of the build's; the plan follows the vLLM the image reports.",
        metavar="REF",
    ),
    Opt(
        "registry",
        ("--registry",),
        "A mirror: every image maps to the same repository and tag there ($ROCM_DSPARK_REGISTRY).",
        metavar="HOST[:PORT]",
        envvar="ROCM_DSPARK_REGISTRY",
    ),
)

CLUSTER_OPTIONS = (
    Opt(
        "strategy",
        ("--strategy",),
        "single_node | multi_node_tp | multi_node_tep | multi_node_dep | "
        "multi_node_tp_dp | multi_node_tp_pp | pd_cluster (vllm-project/recipes' names) | replicas (N servers on one "
        "node behind vllm-router); see recipes/strategies.yaml.",
        metavar="NAME",
    ),
    Opt("node_rank", ("--node-rank",), "Print only this node's commands (0 = head).", "NODE_RANK"),
    Opt("iface", ("--iface",), "Inter-node network interface: sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME."),
    Opt(
        "backend",
        ("--backend",),
        "mp: vLLM's own rendezvous; ray: a Ray cluster (node 0 runs the Ray head).",
        default="mp",
        choices=("mp", "ray"),
        show_default=True,
    ),
    Opt(
        "dp_lb",
        ("--dp-lb",),
        "DP strategies: hybrid (every node serves HTTP; the recipes' default) or internal (one "
        "endpoint on node 0, workers headless).",
        choices=("hybrid", "internal"),
    ),
    Opt("rpc_port", ("--rpc-port",), "--data-parallel-rpc-port (default 13345).", "PORT"),
    Opt(
        "prefill_nodes", ("--prefill-nodes",), "pd_cluster: nodes in the prefill pool (default: half).", "PREFILL_NODES"
    ),
    Opt(
        "node_addresses",
        ("--node-addresses",),
        "Every node's address in node order (pd_cluster: prefill nodes "
        "first; other strategies: node 0 is the --head-address), named in each node's commands and install lines.",
        metavar="A,B,...",
    ),
    Opt(
        "connector",
        ("--connector",),
        "pd_cluster KV connector: nixl (RIXL/UCX, default) or moriio (ROCm-native).",
        choices=("nixl", "moriio"),
    ),
    Opt("router_port", ("--router-port",), "pd_cluster, replicas: vllm-router's port (default 8000).", "PORT"),
    Opt(
        "replicas",
        ("--replicas",),
        "replicas: independent servers on the node, TP = GPUs / N each (default 2).",
        "REPLICAS",
    ),
)

SELECTION_KEYS = tuple(o.key for o in SELECTION_OPTIONS)
CLUSTER_KEYS = tuple(o.key for o in CLUSTER_OPTIONS)


def selection_argv(values: dict, *, exclude: tuple[str, ...] = (), options=SELECTION_OPTIONS) -> list[str]:
    """The words that give `values` back to a command taking these options (the command `up` prints, the probe
    it runs in the image): set values only, in declaration order, each repeatable one once per value. `--env`
    is written as its name alone, which the command reads from its environment, so no secret is printed."""
    words: list[str] = []
    for o in options:
        value = values.get(o.key)
        if (
            o.key in exclude
            or value is None
            or value is False
            or value == o.default
            or (isinstance(value, (str, tuple, list)) and not value)
        ):
            continue
        if o.switch:
            words.append(o.flags[0])
            continue
        for item in value if o.multiple else (value,):
            words += [o.flags[0], str(item).partition("=")[0] if o.key == "extra_env" else str(item)]
    return words
