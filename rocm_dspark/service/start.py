"""Start the service for one command and wait until it serves: one model load (the checkpoint read, the KV cache
sized, the graphs captured), recorded (why, which command, seconds to ready, the compile cache) for the summary,
`status` and the tests that count vLLM starts. `up`'s start and prove steps and the canary's switch to block load
through here, each a Start that `up` built and recorded with the service.
"""

from __future__ import annotations

import time
import typing
from pathlib import Path
from typing import NamedTuple

from rocm_dspark.launch import launch_state as reader
from rocm_dspark.launch.compile_cache import classify
from rocm_dspark.launch.launchers import LaunchFiles, install_argvs
from rocm_dspark.runtime.actions import Action, Failed, Run, Wait, execute, run_all
from rocm_dspark.runtime.client import base_url
from rocm_dspark.runtime.readiness import poll_until
from rocm_dspark.service import control
from rocm_dspark.service.state import utc_now
from rocm_dspark.service.trust import inside

STATE_ENV = "ROCM_DSPARK_LAUNCH_STATE_DIR"  # where a detached launcher writes its launch-state


class Start(NamedTuple):
    command: str  # block | adaptive
    launcher: str  # the launcher `up` wrote for it
    unit: str | None  # systemd mode: the unit file beside it; None: the launcher runs detached
    user: str  # the unit's user (its install commands make sure it exists)
    env: dict  # the detached launcher's environment: STATE_ENV, its ready timeout, its compile cache
    host: str
    port: int
    window_s: int  # how long the launcher may take to report ready (launch_facts.start_window_s)


def recorded(data, up_dir: Path) -> Start:
    """The Start `up` recorded (the canary's switch runs it), believed only in the shape `up` writes, its files
    inside up/launch/ (docs/trust.md); else Failed."""
    types, fix = typing.get_type_hints(Start), "run `rocm-dspark up` again"
    shaped = isinstance(data, dict) and data.keys() == types.keys() and all(isinstance(data[k], types[k]) for k in data)
    if not shaped or not all(isinstance(v, str) for v in data["env"].values()):
        raise Failed("the service record holds no start in the shape `up` writes", fix)
    s = Start(**data)
    if not all(inside(f, up_dir / "launch") for f in (s.launcher, s.unit or s.launcher)):
        raise Failed(f"the recorded start names a file outside {up_dir / 'launch'}", fix)
    return s


def actions(s: Start) -> list[Action]:
    """What a start does (and --dry-run prints): the unit's install commands (launchers.install_argvs, what `launch`
    prints), or the launcher; then the wait until it serves."""
    wait = Wait(f"{base_url(s.host, s.port)}/health", s.window_s, "and /v1/models")
    if s.unit is None:
        return [Run((s.launcher,), env=tuple(s.env.items()), detach=True), wait]
    launcher, name = Path(s.launcher), Path(s.unit).stem  # write_launchers puts <name>.env beside the launcher
    files = LaunchFiles("systemd", name, launcher, Path(s.unit), launcher.with_name(f"{name}.env"))
    return [*(Run(a, root=True) for a in install_argvs(files, s.user)), wait]


def load(state, display, s: Start, why: str, *, facts: dict, launchers, loads: list, on_record=None, phase="starting"):
    """Start `s` and wait until it serves; the load goes into `loads` and the state. Not ready from before the old
    service stops (`phase`: "starting", or "proving" for the adaptive start); the caller says what the start is
    once it serves. Recorded with the service: `launchers`, the digest of the files it runs, and `facts`, per
    command what the canary and /metrics read; `on_record` gets the record once there is a service to stop."""
    starting = f"{s.command} verification is starting ({why})"
    proving = f"the adaptive start is being proved: not a finished endpoint ({why})"
    state.set_readiness(False, phase, starting if phase == "starting" else proving)
    before = (state.service or {}).get("command")
    if control.alive(state.service):
        control.stop_recorded(state)
    t0 = time.monotonic()
    entry = {"n": len(loads) + 1, "command": s.command, "why": why, "at": utc_now()}
    loads.append(entry)

    def record(extra: dict) -> dict:
        rec = {"host": s.host, "port": s.port, "command": s.command, "launchers": launchers, **extra}
        state.set_service({**rec, **facts.get(s.command, {}), "facts": facts})
        if on_record:
            on_record(state.service)
        return state.service

    try:
        out = _start_systemd(display, s, record) if s.unit else _start_process(state, display, s, record)
    finally:
        entry["seconds"] = round(time.monotonic() - t0, 1)
        state.add_load(entry)
    mode = out["launch_state"].get("mode")
    entry.update(ready_s=out["ready_s"], cache=cache_state(out["log"]), **({"launcher_mode": mode} if mode else {}))
    state.add_load(entry, replace=True)
    if before and before != s.command:
        state.add_mode_change({"at": utc_now(), "from": before, "to": s.command, "why": why})
    return out


def _start_process(state, display, s: Start, record) -> dict:
    log = state.path.parent / "logs" / f"server-{s.command}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.log"
    srv, rec = control.start_process(Path(s.launcher), s.env, host=s.host, port=s.port, log_path=log)
    record(rec)
    # Ready is the launcher's word: it says serving only once its warm-up requests passed (launcher.sh.tmpl
    # warm_up); /health answers before that.
    states = Path(s.env[STATE_ENV])
    warming = "/health answers, the launcher is warming up"
    check = srv.ready_check(gate=lambda: None if launcher_phase(states) == "serving" else warming)
    ready, _phase, seconds = display.wait(f"  start ({s.command})", log, check, deadline_s=s.window_s)
    ready = ready or check.timed_out()
    if not ready.ready:
        tail = srv.log_tail(30)
        control.stop_recorded(state)
        fix = f"read the log {log}; fix what it says and run `rocm-dspark up` again"
        raise Failed(f"start: {ready.reason()}", fix, tail)
    ls = launch_state(states)
    mode = f", {ls['mode']} verification" if ls.get("mode") else ""
    display.say(f"  ready after {seconds:.0f} s at {srv.base_url}{mode}")
    out = {"base_url": srv.base_url, "ready_s": round(seconds, 1), "log": str(log), "launch_state": ls}
    return {**out, "pid": rec["pid"], "command": s.command}


def _start_systemd(display, s: Start, record) -> dict:
    fix = "fix what it says (root or sudo is needed to install a unit) and run `rocm-dspark up` again"
    run_all([a for a in actions(s) if isinstance(a, Run)], display.say, "start", fix, timeout=600)
    unit = Path(s.unit or "").name
    url, log = base_url(s.host, s.port), f"/var/lib/rocm-dspark/{Path(unit).stem}/{s.command}.log"
    client = control.attach(record({"kind": "systemd", "unit": unit, "base_url": url, "log": log})).client
    t0 = time.monotonic()

    def poll():
        # A Type=notify unit is "activating" until the launcher's READY=1, which it sends once warmed
        # (launcher.sh.tmpl warm_up): only then is it "active"; /health answers before that.
        state = control.unit_state(unit)
        try:
            if state == "active" and client.get("/health", timeout_s=5).status == 200 and client.models(timeout_s=5):
                return "ready"
        except Exception:  # noqa: BLE001 - not up yet
            pass
        return "failed" if state in ("failed", "inactive") and time.monotonic() - t0 > 10 else None

    result, _phase, seconds = display.wait(f"  start ({s.command})", log, poll, poll_s=2.0, deadline_s=s.window_s)
    if result != "ready":
        _code, tail = execute(Run(("journalctl", "-u", unit, "-n", "30", "--no-pager")))
        why = "not active" if result == "failed" else "not ready in time"
        raise Failed(
            f"start: the unit {unit} is {why}", f"journalctl -u {unit}; fix and run `rocm-dspark up` again", tail
        )
    out = {"base_url": url, "ready_s": round(seconds, 1), "log": log, "launch_state": launch_state(Path(log).parent)}
    return {**out, "unit": unit, "command": s.command}


def cache_state(log: str | None, limit: int = 32 * 2**20) -> str:
    """The start's compile cache as vLLM's own log tells it (compile_cache.classify), "unknown" without a log."""
    try:
        with open(log or "", "rb") as f:
            return classify(f.read(limit).decode("utf-8", "replace"))
    except OSError:
        return "unknown"


def launcher_phase(directory: Path) -> str | None:
    """The phase the launcher last wrote (starting, warming, serving, failed, ...), None before it wrote one."""
    return reader.read(directory).get("phase")


def launch_state(directory: Path, wait_s: float = 10.0) -> dict:
    """The launcher's state once it says serving (it writes it just after readiness)."""

    def serving():
        data = reader.read(directory)  # bounded, non-blocking: a FIFO or a huge file there must not hang `up`
        return data if data.get("phase") == "serving" else None

    data = poll_until(serving, wait_s, max_s=0.5) or reader.read(directory)
    return {k: data.get(k) for k in ("phase", "mode", "fell_back", "pid", "attempts", "monokernel") if k in data}


def why_not_kept(svc: dict | None, which: str | None, launchers) -> str | None:
    """Why the recorded service cannot be kept for `which` (None: it serves it, healthy, from the launchers whose
    digest is `launchers`)."""
    if not svc or not control.alive(svc):
        return "the service is not running"
    if which is not None and svc.get("command") != which:
        return f"the service runs the {svc.get('command') or 'an older'} command, not {which}"
    if svc.get("launchers") != launchers:
        return "the service was started from launchers that were rewritten since"
    health = control.vllm_health(svc, timeout_s=5)
    return None if health == 200 else f"vLLM's /health: {health}"
