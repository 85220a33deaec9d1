"""PlanResult -> a readable table, a JSON-ready dict, or a PNG."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from rocm_dspark.errors import UsageError


def _sim(result) -> dict:
    d = asdict(result)
    d["policy"] = result.policy.label
    return d


def to_dict(plan) -> dict:
    return {
        "title": plan.title,
        "cost": plan.cost_label,
        "acceptance": plan.acceptance_label,
        "conditional_rates": plan.rates,
        "num_speculative_tokens_drafted": plan.gamma,
        "data_parallel_size": plan.dp,
        "best_fixed_k": plan.fixed_k,
        "num_speculative_tokens_per_batch_size": [list(r) for r in plan.schedule] if plan.schedule else None,
        "scores": plan.scores,
        "recommended": plan.recommended,
        "speculative_config": plan.speculative_config,
        "recommendation": plan.recommendation,
        "rows": [
            {
                "concurrency": r.concurrency,
                "batch": r.batch,
                "best_k": r.best_k,
                "no_spec": _sim(r.no_spec),
                "fixed": {str(k): _sim(v) for k, v in r.fixed.items()},
                "per_batch_size": _sim(plan.per_batch_result(r)),
                "adaptive": _sim(r.adaptive),
            }
            for r in plan.rows
        ],
        "notes": list(plan.notes),
    }


def table_lines(plan) -> list[str]:
    k = plan.fixed_k
    head = (f"{'conc':>5} {'batch':>5} | {'no-spec':>8} | {f'fixed K={k}':>10} {'AL':>5} | "
            f"{'per-batch K':>11} {'tok/s':>8} {'AL':>5} | {f'adaptive K<={plan.gamma}':>13} {'AL':>5} {'drafts':>6}")
    lines = [f"rocm-dspark plan: {plan.title}", f"cost: {plan.cost_label}", head, "-" * len(head)]
    for r in plan.rows:
        fixed, per, ad = r.at_k(k), plan.per_batch_result(r), r.adaptive
        lines.append(
            f"{r.concurrency:>5} {r.batch:>5} | {r.no_spec.expected_tokens_per_s:>8.0f} | {fixed.expected_tokens_per_s:>10.0f} "
            f"{fixed.mean_acceptance_length:>5.2f} | {r.best_k:>11} {per.expected_tokens_per_s:>8.0f} "
            f"{per.mean_acceptance_length:>5.2f} | {ad.expected_tokens_per_s:>13.0f} {ad.mean_acceptance_length:>5.2f} "
            f"{ad.verified_drafts_per_request:>6.2f}")
    lines.append("tok/s: expected output tokens/s of the whole server; AL: simulated tokens per request per step "
                 "(accepted drafts + 1); drafts: verified drafts per request")
    lines.append(f"recommendation: {plan.recommendation}")
    if plan.speculative_config:
        lines.append(f"  --speculative-config keys: {json.dumps(plan.speculative_config, separators=(',', ':'))}")
    lines.extend(f"note: {n}" for n in plan.notes)
    return lines


def write_plot(plans, path) -> None:
    """One panel per plan: tok/s against concurrency for each candidate; written atomically."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib; install it with `pip install matplotlib`") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    if not out.parent.exists():
        raise UsageError(f"--plot {path}: folder {out.parent} does not exist")
    fig, axes = plt.subplots(1, len(plans), figsize=(5.5 * len(plans), 4.2), squeeze=False)
    for ax, plan in zip(axes[0], plans):
        xs = [r.concurrency for r in plan.rows]
        series = {
            "no speculation": [r.no_spec.expected_tokens_per_s for r in plan.rows],
            f"fixed K={plan.fixed_k}": [r.at_k(plan.fixed_k).expected_tokens_per_s for r in plan.rows],
            "per-batch-size K": [plan.per_batch_result(r).expected_tokens_per_s for r in plan.rows],
            f"adaptive K<={plan.gamma}": [r.adaptive.expected_tokens_per_s for r in plan.rows],
        }
        for (label, ys), marker in zip(series.items(), "osD^"):
            ax.plot(xs, ys, marker=marker, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tokens/s (model)")
        ax.set_title(plan.title.rsplit(", profile", 1)[0], fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("rocm-dspark plan (a model, not a measurement)", fontsize=10)
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(prefix=".plot-", suffix=".png", dir=out.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=110)
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
