"""Level `static`: the host, the software versions, the plugin, and vLLM's own adaptive-verification checks.

What passes and what counts: docs/probe.md's level table. vLLM's checks (the V4.1 indexer's
`supports_device_cpu_query_lens_mismatch()`, each target builder's `get_cudagraph_support()` under an adaptive
config) run as vLLM will run them, in a child Python (vllm_plugin.status): with our plugin when vLLM will load it
on this version, as shipped otherwise. Without an AMD GPU they run with vLLM's ROCm platform forced, which answers
the class-level questions truthfully but is not evidence about this host: such a result never counts.
"""

from __future__ import annotations

import sys
import time

from rocm_dspark.probe.fingerprint import base_arch
from rocm_dspark.probe.record import LevelResult
from rocm_dspark.probe.store import iso, utc_now


def vllm_mismatch(
    version: str | None, commit: str | None, plan_version: str, label: str, build: dict | None
) -> str | None:
    """Why the installed vLLM is not the one the plan pins, or None when it is."""
    if version is None:
        return (
            f"vLLM is not installed in {sys.executable}: run the probe where vLLM serves (e.g. inside the plan's image)"
        )
    public = version.split("+")[0]
    want = (build or {}).get("commit")
    if want:
        if not commit:
            return (
                f"vLLM {version} carries no commit id, so it cannot be shown to be the plan's build {label} "
                f"(commit {want[:12]})"
            )
        n = min(len(commit), len(want))
        if n < 7 or commit[:n].lower() != want[:n].lower():
            return f"vLLM {version} (commit {commit[:12]}) is not the plan's build {label} (commit {want[:12]})"
        return None
    if public != plan_version:
        return (
            f"vLLM {version} is installed but the plan is for vLLM {plan_version}: probe where the plan's vLLM "
            f"is installed, or pass --vllm-version {public}"
        )
    return None


def effective_checks(report: dict) -> tuple[str, list[dict]]:
    """Which of the report's check lists vLLM will actually run here: with our plugin only if vLLM will
    load it (entry point registered, loadable, allowed by VLLM_PLUGINS) and it patches this version."""
    ep = report.get("entry_point") or {}
    loads = bool(ep.get("registered") and ep.get("loads") and ep.get("allowed_by_VLLM_PLUGINS"))
    patches = bool((report.get("decision_on_rocm") or {}).get("patch"))
    if loads and patches and report.get("with_plugin") is not None:
        return "with_plugin", report["with_plugin"]
    return "shipped", report.get("shipped") or []


def _gpu_problem(host_fp: dict, plan, needed: int) -> str | None:
    count = host_fp.get("gpu_count") or 0
    if count == 0:
        return "no AMD GPU detected (amd-smi and rocminfo are absent or list none)"
    archs = (host_fp.get("gpu_arch") or "").split(",")
    if base_arch(plan.arch) not in archs:
        return f"detected {host_fp.get('gpu_name')} ({host_fp.get('gpu_arch')}), but the plan is for {plan.gpu} ({plan.arch})"
    if count < needed:
        return f"{count} AMD GPU(s) detected; the plan's layout needs {needed} on this node"
    return None


# What the record keeps of vllm_plugin.status's report: all of it but the child's python and its k1 checks.
_REPORT_KEYS = (
    "vllm_version vllm_distributions entry_point host_platform platform forced capability decision_here "
    "decision_on_rocm patched shipped with_plugin notes note error summary"
).split()


def run_static(plan, host_fp: dict, *, progress=lambda msg: None) -> LevelResult:
    from rocm_dspark.vllm_plugin.status import plugin_status

    started, t0 = utc_now(), time.monotonic()
    needed = plan.gpus_per_node_used
    gpu_problem = _gpu_problem(host_fp, plan, needed)
    torch_problem = (
        f"torch is not installed in {sys.executable}"
        if host_fp.get("torch_version") is None
        else f"torch {host_fp['torch_version']} is not a ROCm build (torch.version.hip is None)"
        if host_fp.get("hip_version") is None
        else None
    )
    label = plan.build.name if plan.build else plan.vllm_version
    vllm_problem = vllm_mismatch(
        host_fp.get("vllm_version"),
        host_fp.get("vllm_commit"),
        plan.vllm_version,
        label,
        {"commit": plan.build.vllm_commit} if plan.build else None,
    )
    problems = [p for p in (gpu_problem, torch_problem, vllm_problem) if p]

    installed = host_fp.get("vllm_version") is not None
    force = "rocm" if (host_fp.get("gpu_count") or 0) == 0 else None
    if not installed:
        report = {"error": "vLLM is not installed here (nothing to check)"}
    else:
        progress(
            "static: running vLLM's adaptive-verification checks in a child process"
            + (" (ROCm platform forced: no AMD GPU here)" if force else "")
        )
        report = plugin_status(force_platform=force, num_speculative_tokens=plan.k, gpu=plan.gpu, timeout=600.0)
    which, checks = effective_checks(report)
    forced = report.get("forced") is True or (force is not None and installed)
    if not installed:
        pass  # already a problem above; the checks need vLLM
    elif report.get("error"):
        problems.append(f"vLLM's adaptive-verification checks could not run: {report['error']}")
    elif not checks:
        problems.append(
            "vLLM's adaptive-verification checks were not evaluated: " + (report.get("note") or "no check results")
        )
    else:
        failing = [c for c in checks if c.get("passed") is not True and not c["name"].startswith("vLLM verdict")]
        refusal = next((c.get("refusal") for c in checks if c.get("refusal")), None)
        if refusal or any(c.get("passed") is not True for c in checks):
            who = (
                "with the rocm-dspark plugin"
                if which == "with_plugin"
                else "as shipped (the rocm-dspark plugin is not applied)"
            )
            short = "; ".join(f"{c['name']} -> {c['detail'].split(';')[0].split(' (')[0]}" for c in failing)
            problems.append(
                f"vLLM {report.get('vllm_version')} {who} refuses adaptive verification"
                + (f" ({short})" if short else "")
                + (f"; vLLM says: {refusal}" if refusal else "")
            )

    evidence = {
        "python": sys.executable,
        "needed_gpus": needed,
        "plan_vllm": {"label": label, "version": plan.vllm_version},
        "forced_platform": forced,
        "checks_used": which,
        "checks": checks,
        "plugin_report": {key: report.get(key) for key in _REPORT_KEYS},
    }
    # Without vLLM or a ROCm torch here, the probe ran beside vLLM, not where it serves: that proves nothing
    # either way (a container host's own Python), so it must not count as a refusal.
    elsewhere = (
        f"vLLM is not installed in {sys.executable}"
        if not installed
        else f"torch in {sys.executable} is not a ROCm build"
        if host_fp.get("hip_version") is None
        else None
    )
    if gpu_problem:
        note = "not valid for gating: " + gpu_problem
    elif forced:
        note = "not valid for gating: vLLM's ROCm platform was forced (vLLM does not see this host as ROCm)"
    elif elsewhere:
        note = f"not valid for gating: {elsewhere}; run the probe where vLLM serves (e.g. inside the plan's image)"
    else:
        note = "valid for gating: checks ran on this host's ROCm platform"
    reason = "; ".join(problems) or (
        f"{host_fp.get('gpu_count')}x {host_fp.get('gpu_name')} ({host_fp.get('gpu_arch')}), torch "
        f"{host_fp.get('torch_version')} (HIP {host_fp.get('hip_version')}), vLLM {host_fp.get('vllm_version')}; "
        f"vLLM's adaptive-verification checks pass "
        + ("with the rocm-dspark plugin" if which == "with_plugin" else "as shipped")
    )
    valid = not forced and gpu_problem is None and elsewhere is None
    return LevelResult(
        "static", not problems, valid, reason, note, iso(started), round(time.monotonic() - t0, 3), evidence
    )
