"""Option values -> one node's LaunchPlan -> every node's commands (a strategies.Cluster).

The library behind `recipe --strategy` and `launch --strategy`: it resolves ONE node's plan with the layout
the strategy gives a node (its GPUs as one TP group, expert parallel where the strategy has it), so the
resolver's per-node rules (memory, Engram offload by TP, capture size) apply, and then lets
rocm_dspark.recipe.strategies set the group's parallel flags on every node. No click here.
"""

from __future__ import annotations

from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.options import CLUSTER_KEYS


def pop_cluster(kwargs: dict) -> dict:
    return {k: kwargs.pop(k) for k in CLUSTER_KEYS if k in kwargs}


def refuse_without_strategy(copts: dict) -> None:
    """A one-node plan has no node rank, interface, ports or pools: such a flag without --strategy would be
    silently ignored, so it is refused (recipe and launch alike)."""
    if copts.get("node_rank") is not None:
        raise UsageError("--node-rank needs --strategy (which node of which layout?)")
    for key in CLUSTER_KEYS:
        value = copts.get(key)
        if key in ("strategy", "node_rank") or value is None or key == "backend" and value == "mp":
            continue
        flag = "--" + key.replace("_", "-")
        if key == "replicas":
            raise UsageError("--replicas needs --strategy replicas (N servers on this node behind vllm-router)")
        raise UsageError(f"{flag} applies to a multi-node layout: add --strategy NAME, or drop {flag}")


def _addresses(raw) -> tuple[str, ...]:
    if not raw:
        return ()
    if isinstance(raw, str):
        raw = raw.split(",")
    return tuple(a.strip() for a in raw if a.strip())


def cluster_for(opts: dict, copts: dict, *, k8s: bool = False, plan_for):
    """(plan, cluster): `plan` is node 0's one-node plan, `cluster` every node's commands.

    k8s: addresses come from the cluster (LWS_LEADER_ADDRESS, pod IPs), so none is needed here.
    plan_for: option values -> (catalog, selection, plan), gate included (rocm_dspark.usecase.launch_plan)."""
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.recipe.selection import build_selection
    from rocm_dspark.recipe.strategies import INDEPENDENT, LEADER_PLACEHOLDER, ClusterSpec, expand, layout_for

    strategy = copts.get("strategy") or "single_node"
    catalog = load_catalog()
    sel = build_selection(opts, catalog)
    model = catalog.find_model(sel.model)
    gpu = catalog.find_gpu(sel.gpu or model.default_gpu)
    g = opts.get("gpus_per_node") or gpu.gpus_per_node
    nodes = opts.get("nodes") or 1
    if copts.get("replicas") is not None and strategy != "replicas":
        raise UsageError(
            f"--replicas applies to --strategy replicas, not {strategy}; drop it or pass --strategy replicas"
        )
    if strategy == "replicas" and k8s:
        raise UsageError(
            "--strategy replicas has no Kubernetes form (the device plugin already gives each pod its own "
            "GPUs): use --format k8s with --tp 4 and scale that Deployment (kubectl scale --replicas 2), "
            "or --format shell/systemd for this node"
        )
    if strategy not in ("single_node", "pd_cluster"):
        for flag in ("dp", "ep"):
            if opts.get(flag) is not None:
                raise UsageError(f"--{flag} is set by --strategy {strategy}; drop it (use --tp for the TP of one rank)")
    head = opts.get("head_address")
    addresses = _addresses(copts.get("node_addresses"))
    if k8s:
        if addresses:
            raise UsageError(
                "--node-addresses does not apply to --format k8s: each pod's address comes from the cluster "
                "(the LeaderWorkerSet's LWS_LEADER_ADDRESS and the pods' own IPs); drop it"
            )
        head = LEADER_PLACEHOLDER  # a pod learns the leader's address from LWS (LWS_LEADER_ADDRESS)
        if strategy == "pd_cluster":  # the manifests name the pods' own addresses; the check needs some
            addresses = tuple(f"pd-node-{i}.invalid" for i in range(nodes))
    spec = ClusterSpec(
        strategy=strategy,
        nodes=nodes,
        gpus_per_node=g,
        head_address=head,
        iface=copts.get("iface"),
        backend=copts.get("backend") or "mp",
        dp_lb=copts.get("dp_lb"),
        rank_tp=opts.get("tp") if strategy not in ("single_node", "pd_cluster") else None,
        replicas=copts.get("replicas"),
        rpc_port=copts.get("rpc_port"),
        prefill_nodes=copts.get("prefill_nodes"),
        node_addresses=addresses,
        connector=copts.get("connector"),
        router_port=copts.get("router_port"),
    )
    moe = bool(model.architecture.get("routed_experts"))
    layout = layout_for(spec, model.query_heads, moe)
    rank = copts.get("node_rank")
    if rank is not None and not 0 <= rank < nodes:
        raise UsageError(f"--node-rank {rank} is out of range: with --nodes {nodes} use 0..{nodes - 1}")
    node_opts = dict(opts, nodes=1, head_address=None)
    extra_notes: dict[str, str] = {}  # topic -> text, after the strategy's own
    if strategy == "replicas":
        # Each replica is the single-node plan at TP g/N (memory, capture, mono: its own), sized for the share of
        # the requests the router gives it, ceil(C/N) at most (round robin); mono is then decided per replica from
        # ceil(C/N) x (1+K) rows.
        n, c = layout["replicas"], opts.get("concurrency")
        node_opts.update(tp=layout["tp"], concurrency=None if c is None else -(-c // n))
        if c is not None:
            extra_notes["concurrency"] = (
                f"--concurrency {c} over {n} replicas: each replica's plan (batch "
                f"sizes, mono decode) is for ceil({c}/{n}) = {node_opts['concurrency']} "
                "requests; round robin keeps each near that, a replica briefly holding "
                "more runs those steps on vLLM's path"
            )
    grouped = strategy not in INDEPENDENT
    if grouped:
        # Resolved for one node, its GPUs as one TP group (EP as the group's): memory, Engram and capture rules are
        # per node, the group's own sizes are set afterwards. The per-rank memory check runs for the group's own
        # layout below, not for this one-node TP group.
        g = layout["gpus_per_node"]
        node_opts.update(tp=g, dp=1, ep=g if layout.get("ep") else 1, memory_override=True)
    try:
        catalog, _, plan = plan_for(node_opts, catalog)
    except UsageError as exc:
        if strategy != "replicas":
            raise
        raise UsageError(f"--replicas {layout['replicas']}: each TP-{layout['tp']} replica: {exc}") from None
    if strategy == "replicas":
        # --env values (plan.env or the env file) would pin every replica to the same GPUs
        pinned = sorted(
            {*plan.secret_env, *plan.env} & {"HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}
        )
        if pinned:
            raise UsageError(f"--strategy replicas pins each replica to its GPUs itself; drop --env {pinned[0]}")
    argv, fallback = plan.argv, (plan.block_argv if plan.adaptive_verification else None)
    if layout.get("pp", 1) > 1 and plan.adaptive_verification and (opts.get("adaptive") or "auto") != "on":
        # vLLM 0.33 refuses adaptive verification with PP; `--adaptive on` is refused by expand() instead.
        argv, fallback = plan.block_argv, None
        extra_notes["adaptive verification"] = "OFF: not compatible with pipeline parallel in vLLM; block verification"
    cluster = expand(spec, argv, plan.env, query_heads=model.query_heads, block_argv=fallback, port=plan.port, moe=moe)
    if strategy == "replicas" and '"cpu_offload":true' in (plan.flag("engram_config") or "").replace(" ", ""):
        # The host is shared: every replica keeps its own offloaded Engram tables in host memory.
        gib = (model.memory or {}).get("engram_tables_gib")
        extra_notes["host memory"] = (
            f"each of the {layout['replicas']} replicas offloads its own Engram tables "
            f"to host memory{f' ({gib:g} GiB of tables per server)' if gib else ''}: "
            "the node needs that much host RAM per replica"
        )
    if grouped:  # after expand(): its usage errors (a missing --head-address) come first
        plan = _group_memory(model, gpu, plan, layout, bool(opts.get("memory_override")))
        extra_notes["node plan"] = (
            f"resolved for one node as TP {layout['gpus_per_node']} (Engram offload and capture "
            "rules per node); the group's parallel flags come from the strategy, and the "
            "memory note is per rank of the group's layout"
        )
    return plan, cluster._replace(notes=cluster.notes + tuple(extra_notes.items()))


def _group_memory(model, gpu, plan, layout: dict, override: bool):
    """The node plan with its memory budget redone per rank of the group's layout (rocm_dspark.recipe.memory): at
    TP1 x DP16 a rank holds what TP8 splits eight ways, except the parts vLLM splits over DP too."""
    if plan.memory is None or not model.memory:
        return plan
    from rocm_dspark.recipe.memory import RankLayout, plan_memory, rank_budget, short_text
    from rocm_dspark.recipe.plan import Note

    util = float(
        plan.flag("gpu_memory_utilization") or 0.9
    )  # the plan's typed flags (recipe/plan.py), as resolve set them
    builds = (model.memory.get("layout") or {}).get("engram_dp_shard_builds") or ()
    ranks = RankLayout(
        tp=layout["tp"],
        dp=layout["dp"],
        pp=layout.get("pp") or 1,
        nodes=layout["nodes"],
        gpus_per_node=layout["gpus_per_node"],
        ep=bool(layout.get("ep")),
    )
    budget = rank_budget(
        model,
        gpu,
        ranks,
        util=util,
        max_num_batched_tokens=plan.max_num_batched_tokens,
        engram_resident=plan.memory.engram_gib > 0,
        engram_dp_shard=plan.build is not None and plan.build.name in builds and plan.argv.flags.has("engram_config"),
    )
    memory, text = plan_memory(model, gpu, ranks, budget, override=override)
    notes = tuple(Note("memory", text, short_text(memory, ranks)) if n.topic == "memory" else n for n in plan.notes)
    return plan._replace(memory=memory, notes=notes)
