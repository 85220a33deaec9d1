"""PlanResult -> a readable table, a JSON-ready dict, or a PNG."""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from pathlib import Path

from rocm_dspark.atomic import write_atomic
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
        "error": {"tok_s_pct": plan.error_pct, "adaptive_gain_pp": plan.payoff_error_pp, "source": plan.error_source},
        "rows": [
            {
                "concurrency": r.concurrency,
                "batch": r.batch,
                "best_k": r.best_k,
                "no_spec": _sim(r.no_spec),
                "fixed": {str(k): _sim(v) for k, v in r.fixed.items()},
                "per_batch_size": _sim(r.at_k(r.best_k)),
                "adaptive": _sim(r.adaptive),
                "adaptive_vs_block_pct": round(plan.adaptive_gain_pct(r), 2),
                "adaptive_payoff": plan.payoff(r),
                "mono": next((m for m in plan.mono if m["concurrency"] == r.concurrency), None),
            }
            for r in plan.rows
        ],
        "capture_overruns": list(plan.capture_overruns),
        "notes": list(plan.notes),
    }


def _range(plan, row) -> str:
    """The recommended setting's prediction at this row with its stated error: 'tok/s (low-high)'."""
    tps = plan.candidate_result(plan.recommended, row).expected_tokens_per_s if plan.recommended else 0.0
    e = plan.error_pct / 100.0
    return f"{tps:.0f} ({tps * (1 - e):.0f}-{tps * (1 + e):.0f})"


def table_lines(plan) -> list[str]:
    k = plan.fixed_k
    err = f"within +-{plan.error_pct:g}%" if plan.error_pct is not None else "not stated"
    perr = f"+-{plan.payoff_error_pp:g}" if plan.payoff_error_pp is not None else ""
    head = (
        f"{'conc':>5} {'batch':>5} | {'no-spec':>8} | {f'fixed K={k}':>10} {'AL':>5} | "
        f"{'per-batch K':>11} {'tok/s':>8} {'AL':>5} | {f'adaptive K<={plan.gamma}':>13} {'AL':>5} {'drafts':>6} | "
        f"{f'AV vs block {perr}':>17} {'verdict':>9}"
        + (f" | {'recommended, range':>19}" if plan.error_pct is not None else "")
    )
    lines = [
        f"rocm-dspark plan: {plan.title}",
        f"cost: {plan.cost_label}",
        f"error: every tok/s below: {err} ({plan.error_source})",
        head,
        "-" * len(head),
    ]
    over = {}
    for cell in plan.capture_overruns:  # capture_term: verify batches past the captured graphs
        over.setdefault(cell["concurrency"], []).append(cell["k"])
    for r in plan.rows:
        fixed, per, ad = r.at_k(k), r.at_k(r.best_k), r.adaptive
        lines.append(
            f"{r.concurrency:>5} {r.batch:>5} | {r.no_spec.expected_tokens_per_s:>8.0f} | {fixed.expected_tokens_per_s:>10.0f} "
            f"{fixed.mean_acceptance_length:>5.2f} | {r.best_k:>11} {per.expected_tokens_per_s:>8.0f} "
            f"{per.mean_acceptance_length:>5.2f} | {ad.expected_tokens_per_s:>13.0f} {ad.mean_acceptance_length:>5.2f} "
            f"{ad.verified_drafts_per_request:>6.2f} | {plan.adaptive_gain_pct(r):>+16.1f}% {plan.payoff(r):>9}"
            + (f" | {_range(plan, r):>19}" if plan.error_pct is not None else "")
        )
        mono = next((m for m in plan.mono if m["concurrency"] == r.concurrency), None)
        if mono and any(m["on"] for m in plan.mono):  # its own line, as the overrun's; all off: the note says why
            lines.append(
                f"{'':>11} mono decode: "
                + (
                    f"ON ({mono['rows']} rows): fixed K={k} {mono['tok_s'][0]:.0f}-{mono['tok_s'][1]:.0f} tok/s "
                    + (
                        f"(x{mono['speedup'][0]:.2f}; this host's fit, +-{mono['error_pct']:g}%)"
                        if mono.get("source") == "host"
                        else f"(x{mono['speedup'][0]:.2f}-{mono['speedup'][1]:.2f}; public, uncalibrated)"
                    )
                    if mono["on"]
                    else mono["why"].rsplit(" (", 1)[0]
                )
            )
        if r.concurrency in over:  # its own line: the row is already as wide as a table may be (textwidth.MAX_TABLE)
            lines.append(
                f"{'':>11} [capture overrun K{min(over[r.concurrency])}-{max(over[r.concurrency])}]: past the "
                "largest captured graph (eager term priced)"
            )
    lines.append(
        "tok/s: predicted output tokens/s of the whole server; AL: simulated tokens per request per step "
        "(accepted drafts + 1); drafts: verified drafts per request; AV vs block: adaptive against all "
        f"{plan.gamma} drafts verified, 'pays'/'loses' only when the stated error cannot flip the sign; "
        "recommended, range: the recommended setting's tok/s with the stated error"
    )
    lines.append(f"recommendation: {plan.recommendation}")
    if plan.speculative_config:
        lines.append(f"  --speculative-config keys: {json.dumps(plan.speculative_config, separators=(',', ':'))}")
    lines.extend(f"note: {n}" for n in plan.notes)
    return lines


def write_plot(plans, path) -> None:
    """One panel per plan: predicted tok/s against concurrency for each candidate the build can run, the
    recommended one drawn heavy with its stated error as a band; written atomically."""
    from rocm_dspark.atomic import check_target

    out = Path(path)
    check_target(out, "--plot")
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib; install it with `pip install matplotlib`") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(plans), figsize=(6.2 * len(plans), 4.8), squeeze=False)
    styles = {
        "none": ("no speculation", "o", "-", "#555555"),
        "fixed": (None, "s", "--", "#1f77b4"),
        "per_batch_size": ("per-batch-size K", "D", ":", "#2ca02c"),
        "adaptive": (None, "^", "-.", "#d62728"),
    }
    for ax, plan in zip(axes[0], plans):
        xs = [r.concurrency for r in plan.rows]
        for c in plan.offered:
            label, marker, line, color = styles[c]
            label = label or (f"fixed K={plan.fixed_k}" if c == "fixed" else f"adaptive K<={plan.gamma}")
            ys = [plan.candidate_result(c, r).expected_tokens_per_s for r in plan.rows]
            best = c == plan.recommended
            ax.plot(
                xs,
                ys,
                marker=marker,
                linestyle=line,
                color=color,
                linewidth=2.8 if best else 1.3,
                markersize=7 if best else 5,
                label=label + (" (recommended)" if best else ""),
                zorder=3 if best else 2,
            )
            if best and plan.error_pct:
                e = plan.error_pct / 100.0
                ax.fill_between(
                    xs,
                    [y * (1 - e) for y in ys],
                    [y * (1 + e) for y in ys],
                    color=color,
                    alpha=0.12,
                    label=f"stated error +-{plan.error_pct:g}%",
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_xlabel("concurrency (planned levels)")
        ax.set_ylabel("output tokens/s (predicted)")
        title = plan.title.rsplit(", profile", 1)[0]
        cost = plan.cost_label if len(plan.cost_label) <= 60 else plan.cost_label[:57] + "..."
        ax.set_title(f"{title}\nbuild: {plan.build}\ncost: {cost}", fontsize=8)
        ax.grid(True, alpha=0.3)
        if not plan.adaptive_available:
            ax.text(
                0.99,
                0.02,
                "adaptive verification: not available\non this build (not drawn)",
                ha="right",
                transform=ax.transAxes,
                fontsize=7,
                color="#d62728",
            )
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(
        "rocm-dspark plan: model predictions, not measurements\n(not yet run on MI300-class hardware)", fontsize=9
    )
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=110)
    finally:
        plt.close(fig)
    try:
        write_atomic(out, buf.getvalue(), 0o644, "--plot")
    except OSError as exc:
        raise UsageError(f"--plot {path}: {exc.strerror or exc}") from None
