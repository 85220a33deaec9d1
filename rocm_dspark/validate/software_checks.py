"""Software checks: ROCm, torch + HIP, vLLM version and commit, aiter, the rocm-dspark plugin, the probe.

torch/vLLM/aiter/plugin are read inside the Python environment vLLM runs in (`--python`, else the
interpreter of the `vllm` the server command names, else of `vllm` on PATH), in one subprocess, so this
process never imports them. They are non-blocking: a server in a container has its own stack, and the
server checks catch what actually breaks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

from rocm_dspark.errors import UsageError
from rocm_dspark.inputs import parse_json, read_text
from rocm_dspark.recipe.catalog import release_tuple
from rocm_dspark.runtime import inventory
from rocm_dspark.usecase.verdict import judge
from rocm_dspark.validate.result import NOT_APPLICABLE, PASS, WARN, Outcome

# Runs inside the server's interpreter; prints one JSON object. Every import is guarded.
FACTS_SCRIPT = r"""
import importlib.util, json, sys
out = {"python": sys.executable, "python_version": sys.version.split()[0]}
try:
    import torch
    out["torch"] = torch.__version__
    out["hip"] = getattr(torch.version, "hip", None)
    out["cuda"] = getattr(torch.version, "cuda", None)
except Exception as e:
    out["torch_error"] = f"{type(e).__name__}: {e}"
try:
    from vllm import _version as v
    out["vllm"] = v.__version__
    out["vllm_commit"] = getattr(v, "__commit_id__", None)
except Exception as e:
    if importlib.util.find_spec("vllm") is None:
        out["vllm_error"] = "vllm is not installed"
    else:
        out["vllm_error"] = f"{type(e).__name__}: {e}"
out["aiter"] = importlib.util.find_spec("aiter") is not None
try:
    from rocm_dspark.vllm_plugin.status import plugin_status
    status = plugin_status(force_platform=None)  # this host's platform, as vLLM will see it
    out["plugin"] = {"summary": status.get("summary"), "entry_point": status.get("entry_point"),
                     "decision": status.get("decision_here"), "error": status.get("error")}
except Exception as e:
    out["plugin_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out, default=str))
"""


def _shebang_python(script: str | None) -> str | None:
    """The interpreter a console script (like a venv's `vllm`) runs with."""
    if not script:
        return None
    path = shutil.which(script) if os.sep not in script else script
    try:
        first = read_text(path, "script", max_bytes=1 << 20).split("\n", 1)[0] if path else ""
    except UsageError:
        return None
    if first.startswith("#!") and "python" in first:
        return first[2:].strip().split()[0]
    return None


def server_python(ctx) -> str:
    if ctx.options.python:
        return ctx.options.python
    argv = ctx.target.argv if ctx.target and ctx.target.argv else ()
    if argv and Path(argv[0]).name.startswith("python"):
        return argv[0]
    for script in (*argv[:1], "vllm"):  # the server command's own script first
        py = _shebang_python(script)
        if py and os.path.exists(py):
            return py
    return sys.executable


def facts(ctx) -> dict:
    if ctx.software is None:
        py = server_python(ctx)
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
        try:
            proc = subprocess.run([py, "-c", FACTS_SCRIPT], capture_output=True, text=True, timeout=300, env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            ctx.software = (
                parse_json(lines[-1], "the software facts")
                if lines
                else {"error": f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}"}
            )
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            ctx.software = {"error": f"{type(exc).__name__}: {exc}"}
        ctx.software.setdefault("python", py)
    return ctx.software


def rocm(ctx) -> Outcome:
    """ROCm version on the host (/opt/rocm/.info/version, amd-smi version)."""
    version_file = Path(ctx.path("/opt/rocm/.info/version"))
    evidence: dict = {}
    version = None
    if version_file.exists():
        version = version_file.read_text().strip()
        evidence[str(version_file)] = version
    if shutil.which("amd-smi"):
        try:
            out = subprocess.run(["amd-smi", "version"], capture_output=True, text=True, timeout=60).stdout
            evidence["amd-smi version"] = inventory.parse_amdsmi_version(out)
            version = version or evidence["amd-smi version"].get("rocm")
        except (OSError, subprocess.TimeoutExpired):
            pass
    if version:
        return Outcome(PASS, f"ROCm {version}", value=version, evidence=evidence)
    if not ctx.host().amd_host:
        return Outcome(
            NOT_APPLICABLE,
            "no ROCm on this host: /opt/rocm/.info/version and amd-smi absent (no AMD GPU)",
            evidence=evidence,
        )
    return Outcome(
        WARN,
        "no ROCm version found on the host (/opt/rocm/.info/version, amd-smi version); fine only if "
        "vLLM runs in a container image",
        evidence=evidence,
    )


def torch(ctx) -> Outcome:
    """torch in the server's Python is a ROCm build (torch.version.hip)."""
    f = facts(ctx)
    amd_host = ctx.host().amd_host
    out = partial(Outcome, value={"torch": f.get("torch"), "hip": f.get("hip"), "python": f.get("python")}, evidence=f)
    if "torch" not in f:
        why = f.get("torch_error") or f.get("error") or "not importable"
        return out(WARN if amd_host else NOT_APPLICABLE, f"torch not importable in {f.get('python')}: {why}")
    if not amd_host:
        return out(
            NOT_APPLICABLE,
            f"torch {f['torch']} (HIP {f.get('hip') or 'none'}) in {f.get('python')}: no AMD "
            "GPU here, so no ROCm build is required",
        )
    if not f.get("hip"):
        return out(
            WARN,
            f"torch {f['torch']} in {f.get('python')} is not a ROCm build (torch.version.hip is None): "
            "vLLM there cannot use the GPUs; fine only if vLLM runs in a container",
        )
    return out(PASS, f"torch {f['torch']}, HIP {f['hip']}")


def vllm(ctx) -> Outcome:
    """vLLM version and commit in the server's Python, against the plan's."""
    f = facts(ctx)
    planned = ctx.plan.vllm_version
    value = {"vllm": f.get("vllm"), "commit": f.get("vllm_commit"), "python": f.get("python")}
    out = partial(Outcome, value=value, threshold=planned, evidence=f)
    if "vllm" not in f:
        why = f.get("vllm_error") or f.get("error") or "not importable"
        hint = (
            "the --python given: is it the server's environment?"
            if ctx.options.python
            else "pass --python for the server's environment"
        )
        if not ctx.host().amd_host and ctx.target is None:
            return out(
                NOT_APPLICABLE,
                f"vLLM not importable in {f.get('python')} ({why}); no AMD GPU and no server here ({hint})",
                evidence=None,
            )
        return out(WARN, f"vLLM not importable in {f.get('python')}: {why} ({hint}; a container image has its own)")
    commit = f.get("vllm_commit") or "commit unknown"
    if ctx.target is not None and not ctx.target.recipe_model:
        return out(PASS, f"vLLM {f['vllm']} ({commit}); the recipe's pin ({planned}) applies to its own model only")
    try:
        same = release_tuple(ctx.catalog.vllm_version_of(planned))[:2] == release_tuple(f["vllm"])[:2]
    except Exception:  # an unparsable build tag: report it, do not guess
        same = False
    if not same:
        return out(
            WARN, f"vLLM {f['vllm']} ({commit}) but the plan is for {planned}: the profile's evidence may not hold"
        )
    return out(PASS, f"vLLM {f['vllm']} ({commit}), as planned")


def aiter(ctx) -> Outcome:
    """the aiter kernel library is importable (the plan enables AITER kernels)."""
    f = facts(ctx)
    if f.get("aiter"):
        return Outcome(PASS, f"aiter importable in {f.get('python')}", value=True, evidence=f)
    if not ctx.host().amd_host:
        return Outcome(NOT_APPLICABLE, "aiter absent; it is a ROCm-only library (no AMD GPU here)", value=False)
    return Outcome(
        WARN,
        f"aiter is not importable in {f.get('python')}: the plan's VLLM_ROCM_USE_AITER kernels need it "
        "(fine only if vLLM runs in a container image)",
        value=False,
        evidence=f,
    )


def plugin(ctx) -> Outcome:
    """the rocm-dspark vLLM plugin's status, where it is installed."""
    f = facts(ctx)
    if "plugin" in f:
        p = f["plugin"]
        ep = p.get("entry_point") or {}
        summary = " / ".join(line for line in (p.get("summary") or "").splitlines() if line)
        if ep.get("registered") and ep.get("loads", True):
            return Outcome(PASS, f"rocm-dspark vLLM plugin: {summary}", value=p.get("decision"), evidence=f)
        return Outcome(
            WARN,
            f"rocm-dspark vLLM plugin entry point not usable in {f.get('python')}: {summary or p.get('error')}",
            value=ep,
            evidence=f,
        )
    return Outcome(
        NOT_APPLICABLE,
        f"plugin status not available in {f.get('python')}: {f.get('plugin_error', 'unknown')}",
        evidence={"python": f.get("python")},
    )


def probe(ctx) -> Outcome:
    """the probe gate's verdict: a matching record proving adaptive verification, or why not.

    The verdict for this selection (usecase.verdict): is adaptive verification proven here, and does it pay?"""
    try:
        verdict = judge(
            ctx.catalog,
            ctx.plan,
            state_dir=ctx.data.get("state_dir"),
            concurrency=ctx.plan.concurrency,
            soft=ctx.options.gate_software,
        ).verdict
    except Exception as exc:  # the probe store is another module's: report, never crash validation
        return Outcome(WARN, f"the probe gate failed: {type(exc).__name__}: {exc}")
    value = {
        "state": verdict.outcome,
        "adaptive_proven": verdict.adaptive_proven,
        "plan_adaptive_verification": ctx.plan.adaptive_verification,
    }
    return Outcome(
        PASS, f"probe verdict: {verdict.outcome} ({verdict.reason})", value=value, evidence=verdict._asdict()
    )
