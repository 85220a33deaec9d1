"""`rocm-dspark canary` on `up`'s service: one check (rocm_dspark.service.canary) under the `up` lock, so a
second canary (or an `up`) refuses at once; a violation on an adaptive service switches it to block verification
(one restart through up/serve.load, counted as a model load, the mode change recorded), then the same check on
block decides whether it is ready. In the systemd mode `up` installs a timer that runs it every few minutes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

from rocm_dspark.launch.launch_facts import CANARY_EVERY_MIN
from rocm_dspark.service.canary import TIMEOUT_S, Served, check, check_service, save
from rocm_dspark.service.state import UpState, up_dir, utc_now


def run_canary(
    state_dir,
    *,
    timeout_s: float = TIMEOUT_S,
    endpoint: tuple[str, int] | None = None,
    sizes: dict | None = None,
    say=print,
    display=None,
) -> tuple[int, dict]:
    """Check the service `up` runs (or `endpoint`, checked only) and record it; returns (exit status, the run):
    0 pass, 1 violation or error."""
    from rocm_dspark.service.trust import prepare, up_lock

    d = up_dir(Path(state_dir))
    prepare(d)
    with up_lock(d, "rocm-dspark canary"):
        t0, at = time.monotonic(), utc_now()
        state: UpState | None = None
        found: dict | None
        if endpoint is not None:
            found = check(Served(*endpoint, "unknown", **(sizes or {})), t0 + timeout_s)
        else:
            state = UpState.load(d)
            found = check_service(state, t0 + timeout_s)
            if found is None:
                say("canary: skipped: the service is stopped (`rocm-dspark down`); `up` starts it again")
                return 0, {}
        entry = {"at": at, "seconds": round(time.monotonic() - t0, 1), **found}
        say(
            f"canary: {entry['result'].upper()} ({entry['command']} verification at {entry['endpoint']}, "
            f"{entry['seconds']:g} s): {entry['why']}"
        )
        if state is not None and entry["result"] == "violation" and entry["command"] == "adaptive":
            entry["switch"] = _switch(state, entry, timeout_s, say, display)
        save(state_dir, entry)
    return (0 if entry["result"] == "pass" else 1), entry


def _switch(state: UpState, entry: dict, timeout_s: float, say, display) -> dict:
    """Adaptive emitted tokens the reference rejects: serve block (one restart, one model load, the mode change
    recorded), then check block the same way; ready only if it passes."""
    from rocm_dspark.runtime.progress import Display
    from rocm_dspark.service.state import digest
    from rocm_dspark.up import serve
    from rocm_dspark.up.steps_common import StepFailed

    why = f"canary violation at {entry['at']}: {entry['why']}"
    say("canary: switching the service to block verification (one restart)")
    run = _Restart(state, display or Display(say=say))
    state.note_run({"at": utc_now(), "argv": ["canary"], "target": "canary"})  # its load is its own run's
    probe = state.output("probe")
    state.data["canary_hold"] = {"at": entry["at"], "why": why, "probe": digest(probe) if probe is not None else None}
    try:
        serve.load(run, "block", why)
    except StepFailed as exc:
        state.set_readiness(False, "failed", f"the canary's switch to block failed: {exc.message}")
        return {"to": "block", "started": False, "why": exc.message, "fix": exc.fix}
    again = check_service(state, time.monotonic() + timeout_s, temperature=0.0) or {"result": "error", "why": "stopped"}
    if again["result"] == "pass":
        state.set_readiness(
            True,
            "serving",
            f"block verification serves: the canary switched from adaptive ({why}); block re-checked: {again['why']}",
        )
    else:
        state.set_readiness(False, "failed", f"block verification after the canary's switch: {again['why']}")
    say(f"canary: block verification serves; its check: {again['result'].upper()}: {again['why']}")
    return {"to": "block", "started": True, "loads": 1, "check": {k: again.get(k) for k in ("result", "why", "tokens")}}


class _Restart:
    """What up/serve.load reads of an `up` run, rebuilt from the state `up` left (the canary has no `up` options
    and no target): the launchers step's files, the mode and name the choose step recorded, the service's host
    and port."""

    class _Plan(NamedTuple):
        host: str
        port: int
        adaptive_verification: bool = False
        block_argv: tuple | None = None
        argv: tuple = ()  # only what launch_facts.starts reads: the block command's --monokernel

    class _Options(NamedTuple):
        ready_timeout_s: float
        yes: bool = True  # a timer has no terminal; `up` installed these units already
        service_user: str | None = (
            None  # the unit's install commands only make sure a user exists (its own User= stays)
        )

    target = None

    def __init__(self, state: UpState, display):
        from rocm_dspark.launch.launch_facts import READY_TIMEOUT_S

        self.state, self.display, self.dir = state, display, state.path.parent
        svc, choose = state.service or {}, state.output("choose") or {}
        self.loads: list = []
        self.started = None
        mono = ((svc.get("facts") or {}).get("block") or {}).get("monokernel") is True
        self.plan = self._Plan(
            svc.get("host", "127.0.0.1"), int(svc.get("port", 8000)), argv=("--monokernel",) if mono else ()
        )
        self.outputs = {"launchers": state.output("launchers") or {}}
        self.options = self._Options(float(svc.get("ready_timeout_s") or READY_TIMEOUT_S))
        self.mode, self.name = choose.get("mode") or "foreground", choose.get("name") or "rocm-dspark"


# -- the systemd form: a timer and its oneshot service, installed by `up` ------------------------------------

SERVICE_UNIT = """\
# {unit}: one canary run on {service}, started by {timer}
# Generated by `rocm-dspark up`; it reads and writes the `up` state in {state}, so it runs as the user that ran `up`.
# A violation on adaptive verification restarts the service with block (`sudo systemctl`, as `up` installs units).
[Unit]
Description=rocm-dspark canary of {service}
After=network-online.target {service}

[Service]
Type=oneshot
User={user}
ExecStart={exec_start}
TimeoutStartSec={timeout}
PrivateTmp=yes
"""

TIMER_UNIT = """\
# {unit}: the canary of {service} every {every} minutes (`rocm-dspark canary`); a run still going delays the next.
[Unit]
Description=rocm-dspark canary of {service} every {every} minutes

[Timer]
OnActiveSec={every}min
OnUnitInactiveSec={every}min
AccuracySec=30s

[Install]
WantedBy=timers.target
"""


def unit_files(run) -> dict[str, str]:
    """{file name: text} of the canary's service and timer for `up`'s systemd mode."""
    import getpass
    import sys

    from rocm_dspark.launch.launch_facts import start_window_s
    from rocm_dspark.up.ready_server import exec_start

    name = run.name
    service, unit, timer = f"{name}.service", f"{name}-canary.service", f"{name}-canary.timer"
    words = [
        sys.executable,
        "-m",
        "rocm_dspark",
        "canary",
        "--timeout",
        str(int(TIMEOUT_S)),
        "--state-dir",
        str(run.options.state_dir),
    ]
    # Two checks and, between them, a block start (the switch): all bounded.
    timeout = int(
        2 * TIMEOUT_S + start_window_s(run.plan._replace(adaptive_verification=False), run.options.ready_timeout_s)
    )
    fill = {"service": service, "timer": timer, "state": run.dir, "every": CANARY_EVERY_MIN}
    return {
        unit: SERVICE_UNIT.format(
            unit=unit, user=getpass.getuser(), exec_start=exec_start(words), timeout=timeout, **fill
        ),
        timer: TIMER_UNIT.format(unit=timer, **fill),
    }


def actions(run) -> list:
    """systemd mode: the canary's units and the timer's start (what `up`'s summary step runs); else a note."""
    from rocm_dspark.up.actions import Say, Write
    from rocm_dspark.up.ready_server import install_actions

    if run.mode != "systemd":
        return [
            Say(
                "the canary (`rocm-dspark canary`, which re-scores the served tokens) is yours to schedule "
                "(cron); the systemd mode installs a timer"
            )
        ]
    d, units = run.dir / "launch" / "canary", list(unit_files(run))
    return [
        Say(f"the canary every {CANARY_EVERY_MIN} minutes: its timer and service, enabled"),
        *[Write(str(d / u), 0o644, "canary unit") for u in units],
        *install_actions([d / u for u in units], units[1]),
    ]


def ensure_timer(run) -> list[str]:
    """systemd mode: write the units and enable the timer (what `up`'s summary step runs); the lines it says."""
    from rocm_dspark.up.actions import Run
    from rocm_dspark.up.serve import run_all

    if run.mode != "systemd":
        return []
    d = run.dir / "launch" / "canary"
    d.mkdir(parents=True, exist_ok=True)
    for file, text in unit_files(run).items():
        (d / file).write_text(text)
    run_all(
        run,
        [a for a in actions(run) if isinstance(a, Run)],
        "canary timer",
        "fix what it says and run `rocm-dspark up` again",
    )
    return [
        f"canary: every {CANARY_EVERY_MIN} minutes ({list(unit_files(run))[1]}); `rocm-dspark status` names the last"
    ]
