"""The report: report.json (every check, machine-diffable), report.md (for a person) and PNG plots.

Nothing already in the report directory is overwritten unless the caller passes force; files are written to
a temp file in the same directory and renamed, so a crash never leaves a half-written report.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from functools import partial
from pathlib import Path

from rocm_dspark import atomic
from rocm_dspark.errors import UsageError
from rocm_dspark.validate.result import FAIL, NOT_APPLICABLE, PASS, SKIPPED, STATUSES, WARN

REPORT_JSON, REPORT_MD = "report.json", "report.md"
PLOT_ACCEPTANCE = "acceptance_per_position.png"
PLOT_SWEEP = "sweep_throughput_latency.png"
COST_TABLE = "cost_table.json"  # the sweep's step costs, for `rocm-dspark plan --cost-table`
LAUNCH_DIR = "launch"  # the generated launcher, its state and the server log, with --launch
OUTPUTS = (REPORT_JSON, REPORT_MD, PLOT_ACCEPTANCE, PLOT_SWEEP, COST_TABLE, LAUNCH_DIR)
INCOMPLETE = "incomplete"  # a run-level result only: a blocking check was skipped
MARK = {PASS: "PASS", FAIL: "FAIL", WARN: "WARN", SKIPPED: "skipped", NOT_APPLICABLE: "n/a"}


def prepare_dir(report_dir: Path, force: bool) -> Path:
    """Create the report directory, or refuse (one line) when it already holds report files and not force."""
    report_dir = Path(report_dir)
    if report_dir.exists() and not report_dir.is_dir():
        raise UsageError(f"--report {str(report_dir)!r} is a file; give a directory")
    existing = [name for name in OUTPUTS if (report_dir / name).exists()]
    if existing and not force:
        raise UsageError(
            f"--report {str(report_dir)!r} already holds {', '.join(existing)}: pass --force to "
            "overwrite them or choose another directory"
        )
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --report {str(report_dir)!r}: {exc.strerror}") from None
    if not os.access(report_dir, os.W_OK | os.X_OK):
        raise UsageError(f"--report {str(report_dir)!r} is not writable by this user")
    if force:
        for name in existing:  # a previous run's files must not pass for this run's
            target = report_dir / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
    return report_dir


write_atomic = partial(atomic.write_atomic, mode=0o644)  # a report is for people to read (mkstemp's 0600 is not)


# What the field breaks on, side by side, so that a good GSM8K cannot hide request errors or a cut capture size:
# (row, the checks it reads). A row's status is its worst check's; "sweep.concurrency_" is every sweep level.
FIELD_ROWS = (
    ("accuracy", ("sweep.gsm8k", "server.deterministic")),
    ("tool calls", ("server.tool_calls",)),
    ("request errors", ("sweep.concurrency_",)),
    ("graph capture", ("server.capture",)),
    ("JIT after warm-up", ("sweep.jit",)),
    ("acceptance", ("spec_decode.acceptance",)),
    ("throughput", ("sweep.concurrency_",)),
)
_WORST = (FAIL, WARN, PASS, SKIPPED, NOT_APPLICABLE)  # most telling first


def field_table(checks: list[dict], sweep: list[dict] | None) -> list[dict]:
    """One row per field concern: its status (the worst of its checks), which check decides it, and what it says."""
    rows = []
    for label, names in FIELD_ROWS:
        mine = [
            c for c in checks if any(c["name"] == n or (n.endswith("_") and c["name"].startswith(n)) for n in names)
        ]
        if not mine:
            continue
        worst = min(mine, key=lambda c: _WORST.index(c["status"]))
        detail = worst["message"]
        if label == "request errors" and sweep:
            failed, total = sum(lv["failed"] for lv in sweep), sum(lv["requests"] for lv in sweep)
            per = ", ".join(f"{lv['failed']} at c={lv['concurrency']}" for lv in sweep)
            detail = f"{failed} of {total} requests failed ({per})" + (f": {worst['message']}" if failed else "")
        if label == "throughput" and sweep:
            detail = ", ".join(f"c={lv['concurrency']}: {lv['output_throughput_tok_s']} tok/s" for lv in sweep)
        rows.append({"row": label, "status": worst["status"], "check": worst["name"], "detail": detail})
    return rows


def summary(checks: list[dict]) -> dict:
    counts = {s: sum(1 for c in checks if c["status"] == s) for s in STATUSES}
    stopper = next((c for c in checks if c["blocking"] and c["status"] == FAIL), None)
    # A blocking check that did not run proves nothing: the run is not a PASS (exit 1, as a failure is).
    unrun = None if stopper else next((c for c in checks if c["blocking"] and c["status"] == SKIPPED), None)
    hardware = any(c["category"] == "host" and c["status"] not in (NOT_APPLICABLE, SKIPPED) for c in checks)
    result = FAIL if stopper else INCOMPLETE if unrun else PASS
    unrun_reason = f"blocking check {unrun['name']} was skipped: {unrun['message']}" if unrun else None
    return {
        "result": result,
        "exit_status": 0 if result == PASS else 1,
        "counts": counts,
        "stopped_at": stopper["name"] if stopper else None,
        "reason": stopper["message"] if stopper else unrun_reason,
        "hardware_checked": hardware,
        "first_warning": next((c["name"] for c in checks if c["status"] == WARN), None),
    }


def _fmt(value, limit: int = 60) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, (dict, list)):
        text = json.dumps(value, default=str, separators=(", ", ": "))
    else:
        text = str(value)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_markdown(report: dict, descriptions: dict[str, str]) -> str:
    s = report["summary"]
    lines = [f"# rocm-dspark validation: {s['result'].upper()}", ""]
    plan, server = report["plan"], report["server"]
    lines += [
        f"- Model / profile: {plan['model_key']} / {plan['profile']} ({plan['status']}, planned vLLM {plan['vllm_version']})",
        f"- Server: {server['mode']}"
        + (f" at {server['base_url']}, serving `{server['served_name']}`" if server.get("base_url") else "")
        + (
            ""
            if server.get("recipe_model", True)
            else f" (not the recipe's model: {server.get('description') or 'custom server'})"
        ),
        f"- Host: {report['host']['hostname']}; started {report['started_at']}, took {report['duration_s']:.1f} s",
        "- Checks: " + ", ".join(f"{n} {st}" for st, n in s["counts"].items() if n),
        "",
    ]
    if not s["stopped_at"] and s["reason"]:
        lines += [f"**Not a PASS**: {s['reason']}", ""]
    if s["stopped_at"]:
        lines += [
            f"**Stopped at `{s['stopped_at']}`** (blocking): {s['reason']}",
            "",
            "Every check after it is `skipped`.",
            "",
        ]
    if not s["hardware_checked"]:
        lines += [
            "**No AMD GPU was checked**: the host checks are not applicable here, so this report does not "
            "validate an MI300-class node. Run it on the node itself (not yet run on MI300-class hardware "
            "by this project).",
            "",
        ]
    field = field_table(report["checks"], (report.get("measurements") or {}).get("sweep"))
    if field:
        first = s["stopped_at"] or s.get("first_warning")
        lines += [
            f"**Verdict: {s['result'].upper()}**"
            + (f", first {'failing' if s['stopped_at'] else 'warning'} check `{first}`" if first else ""),
            "",
            "| concern | status | decided by | details |",
            "|---|---|---|---|",
        ]
        lines += [f"| {r['row']} | {MARK[r['status']]} | `{r['check']}` | {_fmt(r['detail'], 200)} |" for r in field]
        lines.append("")
    lines += ["| status | check | blocking | value | threshold | details |", "|---|---|---|---|---|---|"]
    for c in report["checks"]:
        lines.append(
            f"| {MARK[c['status']]} | `{c['name']}` | {'yes' if c['blocking'] else 'no'} | {_fmt(c['value'])} | "
            f"{_fmt(c['threshold'], 40)} | {_fmt(c['message'], 200)} |"
        )
    lines += _failing_tool_call(report["checks"])
    if report.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    if report.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in report["plots"]]
    meas = report.get("measurements") or {}
    if meas.get("sweep"):
        lines += [
            "",
            "## Load sweep",
            "",
            "| concurrency | requests | failed | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | TPOT mean ms |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for lv in meas["sweep"]:
            lines.append(
                f"| {lv['concurrency']} | {lv['requests']} | {lv['failed']} | {_fmt(lv['output_throughput_tok_s'])} | "
                f"{_fmt(lv['ttft_ms']['p50'])} | {_fmt(lv['ttft_ms']['p99'])} | {_fmt(lv['itl_ms']['p50'])} | "
                f"{_fmt(lv['tpot_ms']['mean'])} |"
            )
        # The exact command of each row, so that an operator can rerun it and set it beside a public table.
        lines += [""] + [
            f"- concurrency {lv['concurrency']}: `{lv['bench_command']}`"
            for lv in meas["sweep"]
            if lv.get("bench_command")
        ]
    lines += ["", "## What each check means", ""]
    lines += [f"- `{name}`: {text}" for name, text in descriptions.items()]
    return "\n".join(lines) + "\n"


def _failing_tool_call(checks: list[dict]) -> list[str]:
    """The first failing tool-call request and the response it got, as sent and received (JSON, cut at 4000)."""
    check = next((c for c in checks if c["name"] == "server.tool_calls" and c["status"] == FAIL), None)
    failing = ((check or {}).get("evidence") or {}).get("failing") if check else None
    if not failing:
        return []
    first = failing[0]
    lines = ["", f"## Failing tool call: {first['case']}", ""] + [f"- {p}" for p in first["problems"]]
    for title, sent in (("Request:", first["request"]), ("Response:", first["response"])):
        lines += ["", title, "", "```json", json.dumps(sent, indent=1, ensure_ascii=False, default=str)[:4000], "```"]
    return lines


def run_label(report: dict) -> str:
    """Which server, build and run a plot shows: one line under every plot."""
    server = report.get("server") or {}
    version = next((c.get("value") for c in report.get("checks", []) if c.get("name") == "server.version"), None)
    what = server.get("description") or server.get("mode") or "no server"
    return (
        f"server: {what}; vLLM {version or 'version unknown'}; run: {report.get('host', {}).get('hostname', '?')} "
        f"{report.get('started_at', '')}"
    )


def _subplots(*args, **kw):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, dpi=100, **kw)


def plot_acceptance(path: Path, acceptance: dict, label: str = "") -> None:
    rates = acceptance["per_position"]
    fig, ax = _subplots(figsize=(6.4, 3.9))
    ax.bar([str(i + 1) for i in range(len(rates))], rates, color="#3b6ea5")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafts")
    title = f"Acceptance per position (AL {acceptance['al']:.2f}"
    title += f", floor {acceptance['threshold']:g})" if acceptance.get("threshold") is not None else ")"
    ax.set_title(title)
    for i, r in enumerate(rates):
        ax.text(i, r + 0.02, f"{r:.2f}", ha="center", fontsize=8)
    _save(fig, path, label)


def plot_sweep(path: Path, levels: list[dict], label: str = "") -> None:
    """Three panels: throughput (from zero), TTFT (hundreds of ms) and TPOT/ITL (a few ms) on their own axes,
    so the small lines are not flattened; the x ticks are the measured levels themselves."""
    conc = [lv["concurrency"] for lv in levels]
    fig, (thr, ttft, tpot) = _subplots(1, 3, figsize=(13, 4.0))

    def values(key, stat):
        return [lv[key][stat] if lv[key][stat] is not None else float("nan") for lv in levels]

    thr.plot(conc, [lv["output_throughput_tok_s"] or 0 for lv in levels], marker="o")
    thr.set_ylabel("output tokens / s")
    thr.set_title("Throughput")
    thr.set_ylim(bottom=0)
    for stat, style in (("p50", "-o"), ("p99", "--s")):
        ttft.plot(conc, values("ttft_ms", stat), style, label=f"TTFT {stat}")
    ttft.set_ylabel("ms")
    ttft.set_title("Time to first token")
    tpot.plot(conc, values("tpot_ms", "mean"), "-o", label="TPOT mean (per output token)")
    tpot.plot(conc, values("itl_ms", "p50"), "--s", label="ITL p50 (gap between chunks)")
    tpot.set_ylabel("ms")
    tpot.set_title("Per-token latency")
    for ax in (ttft, tpot):
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    wide = len(conc) > 1 and max(conc) / max(min(conc), 1) >= 8
    for ax in (thr, ttft, tpot):
        if wide:
            ax.set_xscale("log", base=2)
        ax.set_xticks(conc, [str(c) for c in conc])  # the measured levels, as plain numbers
        ax.minorticks_off()
        ax.set_xlabel("concurrency (measured levels)")
        ax.grid(True, alpha=0.3)
    _save(fig, path, label)


def cost_table(levels: list[dict], report: dict) -> dict | None:
    """The sweep's step costs as a `plan --cost-table` file, or None when no level yielded one."""
    samples = [
        {
            "concurrency": lv["concurrency"],
            "tokens_per_step": lv.get("tokens_per_step"),
            "step_ms": lv.get("step_ms"),
            "output_tok_s": lv.get("output_throughput_tok_s"),
            "acceptance_length": lv.get("acceptance_length"),
        }
        for lv in levels
        if lv.get("tokens_per_step") and lv.get("step_ms") and not lv.get("failed")
    ]
    if not samples:
        return None
    drafted = any((lv.get("drafted_per_step") or 0) > 0 for lv in levels)
    return {
        "schema": "rocm-dspark/cost-table/1",
        "source": run_label(report),
        "note": (
            "measured by rocm-dspark validate: step_ms is the median gap between streamed chunks (one per "
            "engine step), tokens the running requests x (1 + drafts verified per step from /metrics); "
            "prefill interleaves with decode, so steps are those of this workload"
        ),
        "includes_draft": drafted,
        "verify": [[round(smp["tokens_per_step"]), smp["step_ms"]] for smp in samples],
        "samples": samples,
    }


def _save(fig, path: Path, label: str) -> None:
    """Under the plot, the run it shows (run_label); written as a PNG."""
    import matplotlib.pyplot as plt

    if label:
        fig.text(0.01, 0.01, label, fontsize=7, color="#444444")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    write_atomic(path, buf.getvalue())


def write_report(report_dir: Path, report: dict, descriptions: dict[str, str], data: dict) -> list[str]:
    """Write plots, report.json and report.md; returns the file names written. Plots need matplotlib: without
    it they are left out and the report says why."""
    written, plots, notes = [], [], []
    label = run_label(report)
    table = cost_table(data.get("sweep") or [], report)
    if table:
        write_atomic(report_dir / COST_TABLE, (json.dumps(table, indent=1) + "\n").encode())
        written.append(COST_TABLE)
        notes.append(
            f"{COST_TABLE}: step costs at {len(table['samples'])} concurrencies; plan from them with "
            f"`rocm-dspark plan --cost-table {report_dir / COST_TABLE}`"
        )
    try:
        if data.get("acceptance"):
            plot_acceptance(report_dir / PLOT_ACCEPTANCE, data["acceptance"], label)
            plots.append(PLOT_ACCEPTANCE)
        if data.get("sweep"):
            plot_sweep(report_dir / PLOT_SWEEP, data["sweep"], label)
            plots.append(PLOT_SWEEP)
    except ImportError as exc:
        notes.append(f"plots not drawn: {exc} (pip install matplotlib)")
    report["plots"] = plots
    report["notes"] = report.get("notes", []) + notes
    write_atomic(report_dir / REPORT_JSON, (json.dumps(report, indent=2, default=str) + "\n").encode())
    write_atomic(report_dir / REPORT_MD, render_markdown(report, descriptions).encode())
    written += plots + [REPORT_JSON, REPORT_MD]
    return written
