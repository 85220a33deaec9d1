"""The service `up` starts and `down`, `status` and the canary find: the generated launcher run as a detached
process, or a systemd unit. A detached launcher runs in its own session (rocm_dspark.runtime.process.VllmServer
starts it that way), so it outlives `up` and Ctrl-C in the terminal does not reach it; `up` stops it itself when
interrupted. The pid is recorded with its start time from /proc, so a later `down` never signals a recycled pid.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import cast

from rocm_dspark.launch import launch_facts
from rocm_dspark.runtime.actions import Run, execute
from rocm_dspark.runtime.process import VllmServer, is_alive, stop_group
from rocm_dspark.runtime.procfs import start_ticks
from rocm_dspark.service.state import utc_now
from rocm_dspark.service.trust import int_in


def same_process(service: dict | None) -> bool:
    """The recorded process is still the one we started (alive, same start time)."""
    if not service or service.get("kind") != "process" or not service.get("pid"):
        return False
    pid = int(service["pid"])
    return is_alive(pid) and start_ticks(pid) == service.get("start_ticks")


class _Handle:
    """Enough of subprocess.Popen for VllmServer to watch a service another `up` started: its pid (a unit has
    none) and poll(), None while it runs (alive: the same process, or the unit active)."""

    def __init__(self, service: dict):
        self.service, self.pid = service, service.get("pid")

    def poll(self):
        return None if alive(self.service) else 0


def attach(service: dict) -> VllmServer:
    """A VllmServer for a running service (for readiness, requests and the probe's live level)."""
    srv = VllmServer(
        ["(service started by rocm-dspark up)"],
        host=service["host"],
        port=int(service["port"]),
        log_path=service.get("log") or None,
    )
    if service.get("kind") in ("process", "systemd"):
        # duck-typed: pid and poll() are all VllmServer uses of a server it did not start
        srv.proc = cast(subprocess.Popen, _Handle(service))
    return srv


HEALTH_TIMEOUT_S = 3.0  # vLLM's /health, once per check: a load balancer polls every few seconds


def vllm_health(service: dict, timeout_s: float = HEALTH_TIMEOUT_S):
    """vLLM's /health status code on the recorded service, or a short string saying why there is none."""
    try:
        return attach(service).client.get("/health", timeout_s=timeout_s).status
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"no answer ({exc})"


def start_process(launcher: Path, env: dict, *, host: str, port: int, log_path: Path) -> tuple[VllmServer, dict]:
    """Run the launcher detached; returns the server handle and the service record."""
    srv = VllmServer([str(launcher)], env, host=host, port=port, log_path=log_path).start()
    assert srv.pid is not None  # started
    record = {
        "kind": "process",
        "pid": srv.pid,
        "start_ticks": start_ticks(srv.pid),
        "host": srv.host,
        "port": port,
        "log": str(log_path),
        "launcher": str(launcher),
        "base_url": srv.base_url,
        # how long the launcher drains vLLM after SIGTERM, so that `down` waits for it
        "stop_timeout_s": int(env.get("ROCM_DSPARK_STOP_TIMEOUT_S") or launch_facts.STOP_TIMEOUT_S),
    }
    return srv, record


def stop_grace_s(service: dict) -> int:
    """How long `down` waits for a launcher after SIGTERM: its drain (stop timeout), then its own SIGKILL and last
    state write (launch_facts.stop_window_s, as the unit's TimeoutStopSec)."""
    recorded = service.get("stop_timeout_s")
    return launch_facts.stop_window_s(recorded if int_in(recorded, 1, 86400) else launch_facts.STOP_TIMEOUT_S)


def stop_process(service: dict, grace_s: float | None = None) -> dict:
    """SIGTERM the launcher's process group (it stops vLLM and exits 143), SIGKILL what is left after grace_s
    (default: stop_grace_s, long enough for the launcher's drain)."""
    grace_s = stop_grace_s(service) if grace_s is None else grace_s
    pid = int(service["pid"])
    if not same_process(service):
        return {"stopped": False, "why": f"process {pid} is not running (already stopped)"}
    res = stop_group(pid, grace_s, term_strays=False)  # the launcher drains vLLM itself
    return {"stopped": True, "killed": res.killed, "leftover_pids": list(res.leftover)}


# -- systemd ----------------------------------------------------------------------------------------


def systemd_usable() -> str | None:
    """Why a systemd unit cannot be installed here, or None when it can."""
    if not shutil.which("systemctl"):
        return "systemctl is not installed"
    if not Path("/run/systemd/system").is_dir():
        return "systemd is not the init system here (/run/systemd/system is absent)"
    if os.geteuid() != 0 and not shutil.which("sudo"):
        return "installing a unit needs root (or sudo)"
    return None


def unit_state(unit: str) -> str:
    """The unit's ActiveState (active, activating, failed, inactive, ...), "unknown" when systemctl does not say.
    `is-active` alone cannot tell a unit still starting from a stopped one: both exit 3 (systemd/systemd#18949)."""
    try:
        proc = subprocess.run(
            ["systemctl", "show", "--property=ActiveState", "--value", "--", unit],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (proc.stdout.strip() or "unknown") if proc.returncode == 0 else "unknown"


def stop_unit(unit: str) -> dict:
    # "--": a unit name is never read as an option (the state file's shape check refuses a leading "-" too).
    try:
        code, output = execute(Run(("systemctl", "disable", "--now", "--", unit), root=True), timeout=600)
    except subprocess.TimeoutExpired as exc:
        return {"stopped": False, "output": str(exc)}
    return {"stopped": code == 0, "output": output[-500:]}


def alive(service: dict | None) -> bool:
    if not service:
        return False
    if service.get("kind") == "systemd":  # `systemctl is-active`'s states (systemd src/systemctl/systemctl-is-active.c)
        return unit_state(service["unit"]) in ("active", "reloading", "refreshing")
    return same_process(service)


def stop_recorded(state, grace_s: float | None = None) -> dict:
    """Stop the service the `up` state records, and record that it was stopped (the record stays). grace_s: how
    long a process may drain before SIGKILL (default: its launcher's stop window)."""
    svc = state.service
    if not svc:
        return {"stopped": False, "why": "no service recorded"}
    res = stop_unit(svc["unit"]) if svc.get("kind") == "systemd" else stop_process(svc, grace_s)
    state.set_service({**svc, "stopped_at": utc_now(), "stop": res})
    return res


def stop_ready_server(state) -> dict | None:
    """Stop the recorded readiness server (`down`, or `up` without --ready-port now); the record goes."""
    rec = state.data.get("ready_server")
    if not rec:
        return None
    res = stop_unit(rec["unit"]) if rec.get("kind") == "systemd" else stop_process(rec, grace_s=5)
    state.data["ready_server"] = None
    state.save()
    return res
