"""The canary's timer, `up`'s part of the canary (the check, its record and its switch to block are
rocm_dspark.service.canary's): in the systemd mode `up` installs a timer that runs `rocm-dspark canary` every few
minutes (its units: launch/aux_units.py); in the other modes scheduling it is the operator's.
"""

from __future__ import annotations

import getpass
import sys

from rocm_dspark.launch import aux_units
from rocm_dspark.launch.launch_facts import CANARY_EVERY_MIN
from rocm_dspark.runtime.actions import Action, Run, Say, Write
from rocm_dspark.service.canary import TIMEOUT_S
from rocm_dspark.up import serve


def unit_files(run) -> dict[str, str]:
    """{file name: text} of the canary's service and timer for `up`'s systemd mode."""
    state_dir = str(run.options.state_dir)
    words = [sys.executable, "-m", "rocm_dspark", "canary", "--timeout", str(int(TIMEOUT_S)), "--state-dir", state_dir]
    # Two checks and, between them, a block start (the switch): all bounded.
    block = serve.start_of(run, "block", serve.command_plans(run)["block"])
    timeout = int(2 * TIMEOUT_S + block.window_s)
    return aux_units.canary_units(run.name, run.dir, getpass.getuser(), words, timeout, CANARY_EVERY_MIN)


def actions(run) -> list[Action]:
    """systemd mode: the canary's units and the timer's start (what `up`'s summary step runs); else a note."""
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
        *[Run(a, root=True) for a in aux_units.install_argvs([d / u for u in units], units[1])],
    ]


def ensure_timer(run) -> list[str]:
    """systemd mode: write the units and enable the timer (what `up`'s summary step runs); the lines it says."""
    if run.mode != "systemd":
        return []
    d, files = run.dir / "launch" / "canary", unit_files(run)
    d.mkdir(parents=True, exist_ok=True)
    for file, text in files.items():
        (d / file).write_text(text)
    commands = [a for a in actions(run) if isinstance(a, Run)]
    serve.run_all(run, commands, "canary timer", "fix what it says and run `rocm-dspark up` again")
    return [f"canary: every {CANARY_EVERY_MIN} minutes ({list(files)[1]}); `rocm-dspark status` names the last"]
