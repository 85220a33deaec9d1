"""Option values -> Selection -> LaunchPlan -> Verdict (usecase.verdict): the one path `recipe`, `launch`, `up` and
`validate` take. It sits above recipe/ (the pure resolver) and probe/ (the gate that reads this host's records), so
neither imports the other's layer. Light imports only: this is on the `rocm-dspark recipe` path.
"""

from __future__ import annotations

from rocm_dspark.errors import UsageError, warn
from rocm_dspark.recipe.plan import LaunchPlan, Verdict
from rocm_dspark.recipe.selection import ADAPTIVE_MODES, build_selection


def verdict_for(opts: dict, catalog, plan: LaunchPlan, soft: dict | None = None) -> Verdict:
    """--adaptive off: not proven by choice; auto/on: the verdict for this plan (usecase.verdict.judge).
    `soft`: the software the plan runs on when that is not this Python's (an image's, rocm_dspark.probe.software)."""
    mode = opts.get("adaptive") or "auto"
    if mode not in ADAPTIVE_MODES:
        raise UsageError(f"--adaptive {mode!r}: use one of {', '.join(ADAPTIVE_MODES)}")
    if mode == "off":
        return Verdict.not_proven("--adaptive off forces block verification")
    if plan.adaptive_argv is None:
        why = next((n.text for n in plan.notes if n.topic in ("speculation", "per-batch-size K")), None)
        return Verdict.not_proven(why or "synthetic benchmark mode")
    from rocm_dspark.usecase.verdict import judge

    got = judge(catalog, plan, state_dir=opts.get("state_dir"), concurrency=plan.concurrency, mode=mode, soft=soft)
    if mode == "on" and not got.proof.adaptive_proven:
        raise UsageError(
            f"--adaptive on needs a probe record proving adaptive verification on this host: "
            f"{got.proof.reason}; run `rocm-dspark probe`"
        )
    if got.warning:
        warn(got.warning)
    return got.verdict


def plan_for(opts: dict, catalog=None, *, soft: dict | None = None) -> tuple:
    """Option values -> (catalog, selection, plan): resolve once, then the gate's verdict, applied last.
    `soft`: see verdict_for."""
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.recipe.resolve import apply_verdict, resolve_plan

    catalog = catalog or load_catalog()
    selection = build_selection(opts, catalog)
    plan = resolve_plan(catalog, selection)
    return catalog, selection, apply_verdict(plan, verdict_for(opts, catalog, plan, soft))


def plan_from_options(opts: dict) -> LaunchPlan:
    """Option values -> LaunchPlan (the one path every command uses)."""
    return plan_for(opts)[2]


def cluster_for(opts: dict, copts: dict, *, k8s: bool = False):
    """(plan, cluster) for `--strategy`: node 0's one-node plan through this path, then every node's commands
    (rocm_dspark.recipe.cluster)."""
    from rocm_dspark.recipe.cluster import cluster_for as group

    return group(opts, copts, k8s=k8s, plan_for=plan_for)
