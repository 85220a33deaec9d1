"""One line per multi-node strategy for `rocm-dspark plan --nodes N`: what N nodes buy.

Only layouts the cost model describes are predicted: data-parallel replicas of the profile's TP group
(multi_node_tp_dp with the profile's TP), through plan_grid's `dp` (concurrency split across ranks, each rank
capped at max_num_seqs, ranks in lockstep paying the largest rank's token count). Every other strategy changes the rank itself (TP across nodes, TP1 ranks with expert
all-to-all, pipeline stages, prefill/decode pools), which the per-TP-group roofline does not model: those lines
say so instead of printing a number.
"""

from __future__ import annotations

NOT_MODELLED = {
    "multi_node_tp": "one TP{all} group across nodes: the cost model is one TP{tp} group (no inter-node all-reduce)",
    "multi_node_tep": "one TP{all} group with expert parallel across nodes: not in the cost model",
    "multi_node_dep": "TP1 ranks with expert-parallel all-to-all: not in the cost model (per TP group, no EP)",
    "multi_node_tp_pp": "pipeline stages across nodes: not in the cost model",
    "pd_cluster": "prefill and decode pools: the planner models steady decode of one pool only",
    "replicas": "independent servers within a node, not across nodes: price one with `plan --tp` at its share of "
    "the concurrency",
}


def strategy_lines(catalog, model, gpu_key: str, nodes: int, base, **plan_kw) -> list[tuple[dict, str]]:
    from rocm_dspark.errors import UsageError
    from rocm_dspark.planner.profile import plan_profile
    from rocm_dspark.planner.recommend import CANDIDATE_LABELS
    from rocm_dspark.recipe.strategies import STRATEGY_NAMES

    if nodes < 1:
        raise UsageError(f"--nodes must be at least 1, got {nodes}")
    gpu = catalog.find_gpu(gpu_key)
    profile = model.profiles[gpu.key]
    g, tp = gpu.gpus_per_node, profile.tp
    out: list[tuple[dict, str]] = [
        (
            {},
            f"Strategies at {nodes} node(s) x {g} {gpu.key} (DP ranks step together, each paying the largest rank's tokens; base: "
            f"{base.title}):",
        )
    ]

    def best(res):
        row = res.rows[-1]
        r = res.candidate_result(res.recommended, row)
        return row.concurrency, r.tokens_per_s, CANDIDATE_LABELS[res.recommended]

    _, base_tps, _ = best(base)
    for name in STRATEGY_NAMES[1:]:
        if name == "multi_node_tp_dp" and g % tp == 0:
            dp = nodes * (g // tp)
            res = plan_profile(catalog, model, gpu.key, dp=dp, **plan_kw)
            c, tps, label = best(res)
            # recipe --strategy multi_node_tp_dp runs TP = the node's GPUs unless --tp is given
            # (rocm_dspark/recipe/strategies.py layout_for); this line prices the profile's TP, so say the flag.
            flag = [] if tp == g else ["--tp", str(tp)]
            row = {
                "strategy": name,
                "dp": dp,
                "tp": tp,
                "concurrency": c,
                "tokens_per_s": tps,
                "recommended": label,
                "single_node_tokens_per_s": base_tps,
                "speedup": tps / base_tps if base_tps else None,
                "recipe": ["rocm-dspark", "recipe", "--strategy", name, "--nodes", str(nodes), *flag],
            }
            same = f"; recipe emits TP{g} x DP{nodes} unless given --tp {tp}, the layout priced here" if flag else ""
            out.append(
                (
                    row,
                    f"  {name:<17} DP{dp} x TP{tp}: {tps:,.0f} tok/s at c={c} ({label}); "
                    f"{row['speedup']:.2f}x the profile's one TP{tp} group ({base_tps:,.0f} tok/s); "
                    f"{' '.join(row['recipe'][1:])}{same}",
                )
            )
        else:
            why = NOT_MODELLED.get(name, "not modelled").format(all=nodes * g, tp=tp)
            out.append(({"strategy": name, "tokens_per_s": None, "why": why}, f"  {name:<17} not predicted: {why}"))
    return out
