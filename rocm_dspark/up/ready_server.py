"""`up --ready-port P`: the readiness server (rocm_dspark.service.readiness, GET /ready) run beside the service.

It is `rocm-dspark status --ready --listen HOST:P`, so the HTTP answer and the exit status of `status --ready` are
one function on one state file. It outlives the loads (it answers 503 "starting" or "proving" while one runs),
starts before the first one, and `down` stops it. systemd mode: its own unit `<name>-ready.service`
(launch/aux_units.py), so it comes back after a reboot, as the service does; the other modes: a detached process,
recorded with its start time as the service is, so `down` never signals a recycled pid.
"""

from __future__ import annotations

import getpass
import sys
from pathlib import Path

from rocm_dspark.launch import aux_units
from rocm_dspark.runtime.actions import Action, Run, Say, Wait, Write
from rocm_dspark.runtime.client import base_url
from rocm_dspark.service import control, readiness
from rocm_dspark.up.serve import run_all


def check_port(port: int | None, vllm_port: int) -> None:
    if port and int(port) == int(vllm_port):
        from rocm_dspark.errors import UsageError

        raise UsageError(
            f"--ready-port {port} is vLLM's port: give the readiness server a port of its own (e.g. {port + 1})"
        )


def listen(run) -> tuple[str, int] | None:
    port = run.options.ready_port
    check_port(port, run.plan.port)
    return (run.plan.host, int(port)) if port else None


def argv(run) -> list[str]:
    host, port = listen(run)
    listen_at, state_dir = f"{host}:{port}", str(run.options.state_dir)
    return [sys.executable, "-m", "rocm_dspark", "status", "--ready", "--listen", listen_at, "--state-dir", state_dir]


def unit_name(run) -> str:
    return f"{run.name}-ready.service"


def unit_path(run) -> Path:
    return run.dir / "launch" / "ready" / unit_name(run)


def unit_text(run) -> str:
    return aux_units.ready_unit(run.name, run.dir, getpass.getuser(), argv(run), listen(run)[1], readiness.PATH)


def actions(run) -> list[Action]:
    """What ensure() does (nothing when --ready-port is not given)."""
    if not (where := listen(run)):
        return []
    host, port = where
    head = Say(
        f"readiness for a load balancer: GET http://{host}:{port}{readiness.PATH} (200 ready, 503 while starting, "
        "proving, validating or down)"
    )
    if run.mode == "systemd":
        install = aux_units.install_argvs([unit_path(run)], unit_name(run))
        return [head, Write(str(unit_path(run)), 0o644, "readiness unit"), *(Run(a, root=True) for a in install)]
    url = base_url(host, port) + readiness.PATH
    detached: list[Action] = [Say("detached; `rocm-dspark down` stops it:"), Run(tuple(argv(run)), detach=True)]
    return [head, *detached, Wait(url, readiness.START_WAIT_S, "(any HTTP status)")]


def ensure(run) -> dict | None:
    """Start the readiness server if --ready-port asks for one and it is not already running with these words."""
    rec, where = run.state.data.get("ready_server") or {}, listen(run)
    if where and control.alive(rec) and rec.get("argv") == argv(run):
        run.display.say(f"  readiness server already answers {rec['url']}")
        return rec
    if control.alive(rec):
        control.stop_ready_server(run.state)
        if not where:
            run.display.say("  stopped the readiness server an earlier run started (no --ready-port now)")
    if not where:
        return None
    url = base_url(*where) + readiness.PATH  # the one wildcard -> loopback rule (runtime.client)
    rec = {"host": where[0], "port": where[1], "url": url, "argv": argv(run)}
    if run.mode == "systemd":
        unit_path(run).parent.mkdir(parents=True, exist_ok=True)
        unit_path(run).write_text(unit_text(run))
        fix = "fix what it says and run `rocm-dspark up` again (or leave out --ready-port)"
        run_all(run, [a for a in actions(run) if isinstance(a, Run)], "readiness server", fix)
        rec.update(kind="systemd", unit=unit_name(run))
    rec = readiness.start_server(run.state, rec, run.dir / "logs" / "ready-server.log")
    run.display.say(f"  readiness server answers {url} (503 until the served command is validated)")
    return rec
