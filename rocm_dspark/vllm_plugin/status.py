"""`rocm-dspark plugin status`: what vLLM is installed, whether vLLM will load our plugin, what it
would patch, and vLLM's own adaptive-verification checks with and without it."""

from __future__ import annotations

import os
import subprocess
import sys

from rocm_dspark.vllm_plugin.checks import CALLER_PLUGINS, ROLES


def plugin_status(
    *,
    force_platform: str | None = "rocm",
    num_speculative_tokens: int = 5,
    gpu: str | None = None,
    model: str | None = None,
    python: str | None = None,
    timeout: float = 300.0,
) -> dict:
    """Everything `plugin status` prints, computed by checks.py in a child `python` (default: this one),
    which is also the interpreter whose vLLM and entry points are inspected. force_platform='rocm'
    evaluates vLLM's ROCm classes even on a host that is not ROCm (the notes say so); None
    evaluates the host platform only. Keys: python, vllm_distributions, entry_point, vllm_version,
    host_platform, platform, forced, capability, decision_here, decision_on_rocm, patched (one line per
    declaration the backport adds, patch.py), k1, shipped, with_plugin (lists of check dicts: name, passed,
    detail, refusal), notes, error, summary. Never raises for a missing or broken vLLM: `error` says what
    went wrong."""
    argv = [python or sys.executable, "-m", "rocm_dspark.vllm_plugin.checks", "-k", str(num_speculative_tokens)]
    for flag, value in (("--gpu", gpu), ("--force-platform", force_platform), ("--model", model)):
        if value:
            argv += [flag, value]
    report = _child_report(argv, timeout)
    report["summary"] = summarize(report)
    return report


def _child_report(argv: list[str], timeout: float) -> dict:
    env = dict(os.environ)
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    # Plugins must not run inside the child: the point is to see vLLM as shipped first. The
    # caller's VLLM_PLUGINS still decides whether vLLM would load ours (status reports that).
    if "VLLM_PLUGINS" in os.environ:
        env[CALLER_PLUGINS] = os.environ["VLLM_PLUGINS"]
    env["VLLM_PLUGINS"] = ""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"could not run the checks: {type(exc).__name__}: {exc}"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the checks process exited {proc.returncode}: {tail}"}
    from rocm_dspark.inputs import parse_json

    try:  # evidence a probe record keeps: no NaN, no duplicate key
        return parse_json(lines[-1], "the checks process's result")
    except ValueError as exc:
        return {"error": str(exc)}


def role_states(checks: list[dict] | None) -> str:
    """One line: each target's state, e.g. 'sliding-window (SWA): ALWAYS via rocm-dspark; indexer:
    refuses (supports_device_cpu_query_lens_mismatch() False)'."""
    parts = []
    for role in ROLES:
        mine = [c for c in checks or [] if c["name"].startswith(role + ":")]
        failing = [c for c in mine if not c["passed"]]
        if failing:
            method = failing[0]["name"].split(".", 1)[-1].replace("(AV config)", "")
            value = failing[0]["detail"].split(";")[0].split(" (needs")[0]
            parts.append(f"{role}: refuses ({method} {value})")
        elif mine:
            parts.append(f"{role}: {mine[-1]['detail']}")
    return "; ".join(parts)


def summarize(report: dict) -> str:
    ep = report.get("entry_point") or {}
    lines = []
    if report.get("error"):
        lines.append(report["error"])
    if ep:
        excluded = "" if ep.get("allowed_by_VLLM_PLUGINS", True) else " but excluded by VLLM_PLUGINS"
        lines.append(f"entry point: {'registered' if ep.get('registered') else 'NOT registered'}{excluded}")
    if "decision_here" in report:
        lines.append(f"here ({report['host_platform']}): {report['decision_here']['reason']}")
        lines.append(f"on ROCm: {report['decision_on_rocm']['reason']}")
    if report.get("patched"):
        lines.append(
            f"with rocm-dspark on ROCm: {len(report['patched'])} declaration(s) patched; {report.get('k1', '')}"
        )
    for label, key in (("vLLM as shipped", "shipped"), ("with rocm-dspark", "with_plugin")):
        verdict = next((c for c in report.get(key) or [] if c["name"].startswith("vLLM verdict")), None)
        if verdict is not None:
            said = f": {verdict['refusal']}" if verdict.get("refusal") else ""
            lines.append(f"{label}: vLLM {'accepts' if verdict['passed'] else 'refuses'} adaptive verification{said}")
            lines.append(f"  {role_states(report.get(key))}")
    return "\n".join(lines)


def format_table(report: dict) -> str:
    """Human-readable report: facts, then one row per check (PASS/FAIL), then the summary."""
    out = [f"python:       {report.get('python', '?')}"]
    dists = report.get("vllm_distributions")
    if dists is not None:
        out.append("vLLM:         " + (", ".join(f"{d['name']} {d['version']}" for d in dists) or "not installed"))
    if report.get("vllm_version"):
        out.append(f"vllm.__version__: {report['vllm_version']}")
    ep = report.get("entry_point")
    if ep:
        out.append(
            f"entry point:  {ep['group']}: {ep['name']} = {ep['value'] or '-'} "
            f"({'registered' if ep['registered'] else 'not registered'}, "
            f"{'loads' if ep['loads'] else 'does not load'}, "
            f"VLLM_PLUGINS {'allows' if ep['allowed_by_VLLM_PLUGINS'] else 'excludes'} it)"
        )
    if report.get("capability"):
        cap = report["capability"]
        out.append(f"capability:   recipes/vllm.yaml '{cap['versions']}': {cap['note']}")
    if "decision_here" in report:
        out.append(f"here:         {report['decision_here']['reason']}")
        out.append(f"on ROCm:      {report['decision_on_rocm']['reason']}")
        if "patched" in report:
            out.append("on ROCm it patches:" + ("".join(f"\n  {line}" for line in report["patched"]) or " nothing"))
        if report.get("k1"):
            out.append(f"K=1:          {report['k1']}")
    for note in report.get("notes", []) + ([report["note"]] if report.get("note") else []):
        out.append(f"note:         {note}")
    for label, key in (("vLLM as shipped", "shipped"), ("with rocm-dspark", "with_plugin")):
        checks = report.get(key)
        if not checks:
            continue
        out += ["", f"adaptive-verification checks, {label} (K={report['num_speculative_tokens']}):"]
        for c in checks:
            out += [f"  {'PASS' if c['passed'] else 'FAIL'}  {c['name']}", f"        {c['detail']}"]
            if c.get("refusal"):
                out.append(f"        vLLM says: {c['refusal']}")
    if report.get("summary"):
        out += ["", report["summary"]]
    return "\n".join(out)
