"""Step 3's prerequisite checks, each failure with its fix.

The GPU-host checks (device access and groups, NUMA balancing, free disk for the checkpoint) are
validate's own (rocm_dspark.validate.host_checks), run on the same context validate builds; this module adds
what only a start needs: where the Hugging Face cache is, a token for the download, and a free port.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from rocm_dspark.launch.launch_facts import hf_home
from rocm_dspark.runtime.process import listening

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skipped"


class Prereq(NamedTuple):
    name: str
    status: str  # ok | warn | fail | skipped
    message: str
    fix: str = ""

    def line(self) -> str:
        fix = f" -> fix: {self.fix}" if self.fix and self.status in (WARN, FAIL) else ""
        return f"{self.name:<14} {self.status:<7} {self.message}{fix}"


HOST_ROOT_VAR = "ROCM_DSPARK_HOST_ROOT"  # the generated launcher reads it too (launcher.sh.tmpl)


def host_root() -> str:
    """A prefix for the /dev and /proc paths of the host checks: tests lay out a host in a directory."""
    return os.environ.get(HOST_ROOT_VAR, "")


def hf_cache() -> Path:
    from rocm_dspark.validate.host_checks import hf_cache

    return hf_cache()


def hf_token_present() -> str | None:
    """Where a Hugging Face token comes from ($HF_TOKEN or the file `hf auth login` writes), or None."""
    if os.environ.get("HF_TOKEN"):
        return "$HF_TOKEN"
    path = Path(os.environ.get("HF_TOKEN_PATH") or Path(hf_home()) / "token")
    return str(path) if path.is_file() and path.stat().st_size > 0 else None


def from_outcome(name: str, outcome, fix: str) -> Prereq:
    from rocm_dspark.validate.result import FAIL as V_FAIL
    from rocm_dspark.validate.result import NOT_APPLICABLE
    from rocm_dspark.validate.result import WARN as V_WARN

    status = {V_FAIL: FAIL, V_WARN: WARN, NOT_APPLICABLE: SKIP}.get(outcome.status, OK)
    return Prereq(name, status, outcome.message, fix if status in (FAIL, WARN) else "")


def gpu_host_checks(ctx) -> list[Prereq]:
    """validate's device, NUMA, disk and compute-partition checks on a validate Context (rocm_dspark.validate.context)."""
    from rocm_dspark.validate import host_checks as h

    user = ctx.options.service_user or "the service user"
    return [
        from_outcome("devices", h.devices(ctx), f"sudo usermod -aG video,render {user}, then log in again"),
        from_outcome("numa", h.numa_balancing(ctx), "sudo sysctl -w kernel.numa_balancing=0"),
        from_outcome(
            "disk", h.disk(ctx), "free space where the checkpoint goes, or pass --model-path on a bigger disk"
        ),
        from_outcome(
            "partition",
            h.compute_partition(ctx),
            "none needed: the launcher drops --monokernel (or "
            "`sudo amd-smi set --gpu all --compute-partition SPX` while no GPU work runs, to use it)",
        ),
    ]


def download_checks(plan, model_path: str | None, needs_download: bool) -> list[Prereq]:
    if model_path:
        if not Path(model_path).exists():
            return [
                Prereq(
                    "model path", FAIL, f"{model_path} does not exist", "pass the directory that holds the checkpoint"
                )
            ]
        if Path(model_path).is_dir() and not (Path(model_path) / "config.json").is_file():  # vLLM reads it first
            return [
                Prereq(
                    "model path",
                    FAIL,
                    f"{model_path} has no config.json: not a Hugging Face checkpoint",
                    "pass the directory that holds the checkpoint (config.json and the weights)",
                )
            ]
        return [Prereq("model path", OK, f"serving from {model_path}; no download, no token needed")]
    cache = hf_cache()
    out = [Prereq("hf cache", OK, f"the checkpoint goes to {cache} (HF_HUB_CACHE / HF_HOME move it)")]
    token = "--env HF_TOKEN (the 0600 env file)" if "HF_TOKEN" in (plan.secret_env or {}) else hf_token_present()
    if token:
        out.append(Prereq("hf token", OK, f"Hugging Face token from {token}"))
    elif needs_download:
        out.append(
            Prereq(
                "hf token",
                WARN,
                f"no HF_TOKEN: {plan.model_id} is downloaded anonymously (rate limited; a gated repository fails)",
                "export HF_TOKEN=hf_... (for systemd: put it in the unit's env file)",
            )
        )
    else:
        out.append(Prereq("hf token", OK, "checkpoint already in the cache: no token needed"))
    return out


def port_check(host: str, port: int, ours: bool) -> Prereq:
    if not listening(host, port):
        return Prereq("port", OK, f"{host}:{port} is free")
    if ours:
        return Prereq("port", OK, f"{host}:{port} is served by the service this `up` started before")
    return Prereq(
        "port",
        FAIL,
        f"something already listens on {host}:{port}",
        f"stop it (ss -ltnp 'sport = :{port}' shows what) or pass --port",
    )
