"""The per-rank HBM budget for a layout of TP x DP x PP ranks. Pure: numbers in, numbers out.

The parameters are the model file's `memory` block (fitted on single-node TP runs, recipes/models/*.yaml);
how each part lies over the ranks comes from vLLM's code, cited in that block's `layout` comment:

    fixed                      per rank, whatever the layout
    routed experts             / (TP x DP) per stage, with or without expert parallel, and / PP
    the other sharded weights  / TP, replicated on every DP rank, and / PP
    resident Engram tables     / (TP x the node-local Engram DP group), not / PP
    indexer buffers, KV        per rank

With DP = PP = 1 this is the single-node budget the resolver always had, to the digit.
"""

# No __future__ annotations: NamedTuple would compile each string annotation at import (benchmarks/recipe_latency.py).

from math import gcd
from typing import NamedTuple

from rocm_dspark.errors import UsageError


class RankLayout(NamedTuple):
    tp: int
    dp: int = 1
    pp: int = 1
    nodes: int = 1
    gpus_per_node: int = 8
    ep: bool = False  # expert parallel: whole experts per rank (same bytes per rank as flattened TP)

    def words(self, ep: str = " with EP") -> str:
        parts = [f"TP{self.tp}"] + [f"DP{self.dp}"] * (self.dp > 1) + [f"PP{self.pp}"] * (self.pp > 1)
        return " x ".join(parts) + (ep if self.ep else "")


def expert_share(model) -> float | None:
    """The routed experts' share of `sharded_weights_gib`, from the model's params (None: no layout data)."""
    lay = (model.memory or {}).get("layout") or {}
    if not lay:
        return None
    total = float(model.params["backbone_b"])
    active = float(model.params["active_output_token_b"])
    k, e = model.architecture.get("experts_per_token"), model.architecture.get("routed_experts")
    if not k or not e:
        return 0.0  # a dense model: nothing is split over DP
    experts = (total - active) / (1 - k / e)  # total = rest + experts; active = rest + experts * k / e
    rest = max(total - experts, 0.0)
    eb, db = lay["expert_bytes_per_param"], lay["dense_bytes_per_param"]
    return experts * eb / (experts * eb + rest * db)


def engram_dp_group(layout: RankLayout) -> int:
    """vLLM's node-local Engram DP shard size: gcd(DP, whole TP x PP replicas per node), 1 if they do not fit
    (vllm/distributed/parallel_state.py _engram_dp_shard_size)."""
    replica = layout.tp * layout.pp
    world = layout.tp * layout.dp * layout.pp
    per_node, rest = divmod(world, layout.nodes * replica)
    if rest or per_node == 0:
        return 1
    return gcd(layout.dp, per_node)


class Budget(NamedTuple):
    usable: float
    fixed: float
    weights: float
    experts: float | None  # None: the single-node form (no split shown)
    engram: float
    engram_group: int
    indexer: float
    kv: float
    error: float
    text: str
    max_num_batched_tokens: int


def rank_budget(
    model,
    gpu,
    layout: RankLayout,
    *,
    util: float,
    max_num_batched_tokens: int,
    engram_resident: bool,
    engram_dp_shard: bool,
    extra: tuple[str, float] | None = None,
) -> Budget:
    """The per-rank budget of `layout`, with its one-line text (the memory note and the refusal); `extra` is
    (what, GiB) more per rank (the gfx942 mono weight copies)."""
    m = model.memory
    usable = gpu.hbm_gb * util  # HBM capacities are binary: 192 GB HBM3 = 192 GiB
    fixed = m["fixed_gib"]
    sharded = m["sharded_weights_gib"]
    single = layout.dp == 1 and layout.pp == 1
    share = expert_share(model)
    if single or share is None:
        # No layout data: everything sharded by TP only, replicated per DP rank (the conservative side).
        experts = None
        weights = sharded / (layout.tp * layout.pp)
    else:
        experts = sharded * share / (layout.tp * layout.dp * layout.pp)
        weights = experts + sharded * (1 - share) / (layout.tp * layout.pp)
    group = engram_dp_group(layout) if engram_dp_shard and engram_resident else 1
    engram = m["engram_tables_gib"] / (layout.tp * group) if engram_resident else 0.0
    mnbt = max_num_batched_tokens
    indexer = mnbt * m["indexer_mib_per_batched_token"] / 1024
    kv = usable - fixed - weights - engram - indexer - (extra[1] if extra else 0.0)
    err = m["error_gib"]
    if single:
        head = f"per rank on {gpu.key} TP{layout.tp}"
        wtext = f"sharded weights {weights:.1f}"
    else:
        head = f"per rank on {gpu.key} {layout.words()} ({layout.nodes} node{'s' * (layout.nodes > 1)})"
        if experts is None:
            wtext = f"sharded weights {weights:.1f} (/ TP{' x PP' * (layout.pp > 1)}; no layout data: replicated per DP rank)"
        else:
            pp = f" x PP{layout.pp}" if layout.pp > 1 else ""
            wtext = (
                f"sharded weights {weights:.1f} (routed experts {experts:.1f} over {layout.tp * layout.dp} ranks"
                f"{pp}, the rest {weights - experts:.1f} over TP{layout.tp}{pp}"
                f"{', on every DP rank' if layout.dp > 1 else ''})"
            )
    if not engram_resident:
        etext = "Engram tables 0.0 (offloaded)"
    elif single or layout.dp == 1:
        etext = f"Engram tables {engram:.1f}"
    else:
        etext = (
            f"Engram tables {engram:.1f} (over TP{layout.tp} x node-local DP groups of {group})"
            if group > 1
            else f"Engram tables {engram:.1f} (over TP{layout.tp}, whole on every DP rank"
            f"{'' if engram_dp_shard else ': this build is not shown to shard them over DP'})"
        )
    text = (
        f"{head}: {usable:.1f} GiB usable ({gpu.hbm_gb:g} x {util:g}) - fixed {fixed:.1f} - {wtext} - {etext} "
        f"- indexer buffers {indexer:.1f} (max_num_batched_tokens {mnbt}) "
        + (f"- {extra[0]} {extra[1]:.1f} " if extra else "")
        + f"= KV {kv:.1f} GiB "
        f"(model error +-{err:g} GiB)"
    )
    return Budget(usable, fixed, weights, experts, engram, group, indexer, kv, err, text, mnbt)


def refusal(budget: Budget, model, *, single: bool) -> UsageError:
    m = model.memory
    hint = (
        f"; a smaller --max-num-batched-tokens frees {m['indexer_mib_per_batched_token']:.2f} MiB per token"
        if budget.max_num_batched_tokens > 4096
        else ""
    )
    more = "use a larger --tp"
    if not single:
        builds = (m.get("layout") or {}).get("engram_dp_shard_builds") or ()
        shard = (
            f", a build that shards Engram tables over DP (--build {' or '.join(builds)})"
            if builds and budget.engram and budget.engram_group == 1
            else ""
        )
        more = f"use a larger --tp per rank{shard} or another --strategy"
    return UsageError(f"no room for KV cache: {budget.text}; {more}{hint}, or --memory-override to emit it anyway")


def plan_memory(model, gpu, layout: RankLayout, b: Budget, *, override: bool):
    """(plan.Memory, the memory note's text) for budget `b` of `layout`; UsageError with the numbers when it leaves
    no KV room and `override` (--memory-override) is not given."""
    from rocm_dspark.recipe.plan import Memory

    m = model.memory
    max_len = int(
        next((a[1] for a in model.base_args if a[0] == "--max-model-len" and len(a) > 1), None)
        or model.architecture["context_length"]
    )
    tokens = int(b.kv / m["kv_gib_per_million_tokens"] * 1024 * 1024) if b.kv > 0 else None
    mem = Memory(
        hbm_gib=gpu.hbm_gb,
        usable_gib=round(b.usable, 2),
        weights_gib=round(b.weights, 2),
        engram_gib=round(b.engram, 2),
        indexer_gib=round(b.indexer, 2),
        margin_gib=round(b.fixed, 2),
        kv_gib=round(b.kv, 2),
        kv_tokens=tokens,
        kv_multiples=round(tokens / max_len, 2) if tokens else None,
        error_gib=b.error,
        sources=tuple(m["sources"]),
        override=False,
    )
    if b.kv + b.error <= 0:
        if not override:
            raise refusal(b, model, single=layout.dp == 1 and layout.pp == 1)
        return mem._replace(
            override=True
        ), f"OVERRIDDEN (--memory-override): {b.text}; vLLM will likely refuse to start"
    room = (
        f"about {tokens:,} tokens = {mem.kv_multiples:g} x max_model_len {max_len}"
        if tokens
        else "none by the estimate, within the model's error"
    )
    return mem, f"{b.text}: {room} (calibrated on InferenceX's published KV headroom: {m['sources'][0]})"


def short_text(mem, layout: RankLayout) -> str:
    """The memory note in a few words (the default output; the full budget stays in the note's text)."""
    return (
        ("OVERRIDDEN (--memory-override): " if mem.override else "")
        + f"KV {mem.kv_gib:.1f} GiB per rank (+-{mem.error_gib:g}) at {layout.words(ep=' EP')}"
        + (f": about {mem.kv_tokens:,} tokens = {mem.kv_multiples:g} x max_model_len" if mem.kv_tokens else "")
    )
