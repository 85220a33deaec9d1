"""Cluster (every node's commands) -> text: shell blocks per node, JSON, or Kubernetes YAML."""

from __future__ import annotations

import json
import shlex

from rocm_dspark.launch.render import EXPLAIN_HINT, _argv_lines, _comment, header_lines, note_lines
from rocm_dspark.recipe.plan import Note


def render_cluster_shell(plan, cluster, node_rank: int | None = None, explain: bool = False) -> str:
    """The layout line, every node's commands, then the plan's header and notes (short unless `explain`)."""
    out = _comment(
        f"strategy {cluster.strategy}: {cluster.nodes} node(s), backend {cluster.backend}, layout "
        + ", ".join(f"{k} {v}" for k, v in cluster.layout.items() if v is not None)
    )
    for cmd in cluster.commands if node_rank is None else cluster.for_node(node_rank):
        where = f" ({cmd.address})" if cmd.address else ""
        role = (
            f"replica {cmd.pool_rank} on GPUs {cmd.env.get('HIP_VISIBLE_DEVICES', '?')}"
            if cmd.role == "replica"
            else cmd.role
        )
        out += [
            "",
            *_comment(
                f"--- node {cmd.node}{where}: {role}"
                + (f", serves HTTP on :{cmd.port}" if cmd.serves_http else ", no HTTP (headless)")
            ),
        ]
        for step in cmd.setup:
            out.append(" ".join(shlex.quote(w) for w in step))
        lines = [f"{k}={shlex.quote(v)}" for k, v in cmd.env.items()]
        lines += _argv_lines(
            cmd.argv, 3 if cmd.argv[:2] == ("vllm", "serve") else 2 if cmd.argv[:2] == ("ray", "start") else 1
        )
        out.append(" \\\n".join(lines))
    out += ["", *header_lines(plan)]
    if cluster.status:
        out += _comment(f"prefill/decode status: {cluster.status}")
    if plan.secret_env:  # values never printed (rocm_dspark/recipe/secret_env.py)
        out += _comment(f"set on every node first (given by --env, not printed): {' '.join(plan.secret_env)}")
    notes = [*plan.notes, *(n if isinstance(n, Note) else Note(*n) for n in cluster.notes)]
    out += note_lines(notes, explain)
    if not explain:
        out.append(EXPLAIN_HINT)
    return "\n".join(out) + "\n"


def render_cluster_json(plan, cluster, node_rank: int | None = None) -> str:
    d = cluster.to_json_dict()
    if node_rank is not None:
        d["node_rank"] = node_rank
        d["commands"] = [c for c in d["commands"] if c["node"] == node_rank]
    d["plan"] = {k: v for k, v in plan.to_json_dict().items() if k not in ("argv", "block_argv", "adaptive_argv")}
    return json.dumps(d, indent=2) + "\n"


__all__ = ["render_cluster_shell", "render_cluster_json"]
