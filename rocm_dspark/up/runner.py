"""Run the steps in order, resumably: the library behind `rocm-dspark up`.

A step is skipped when the state file says it finished with the same inputs (and, for the launchers and the
server, that they are still there). A failed step is recorded with its fix and stops the run; Ctrl-C stops the
server this run started, records the step as interrupted and stops. Nothing an earlier step wrote is removed.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocm_dspark.errors import UsageError
from rocm_dspark.launch.launchers import check_name, default_name
from rocm_dspark.probe import store
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.secret_env import redact_argv
from rocm_dspark.runtime import actions
from rocm_dspark.service import control
from rocm_dspark.service import status as service_status
from rocm_dspark.service.state import DONE, FAILED, INTERRUPTED, SKIPPED, UpState, digest, up_dir, utc_now
from rocm_dspark.service.trust import check_usable, prepare, up_lock
from rocm_dspark.up import choice, ready_server
from rocm_dspark.up.steps import STEPS, StepFailed, mode_checks, unit_user
from rocm_dspark.up.steps_common import out_hash
from rocm_dspark.up.target import TARGETS, target_for
from rocm_dspark.validate.result import FAIL

MODES = ("systemd", "foreground", "container")


@dataclass
class UpOptions:
    selection: dict  # the selection flags, as cli.options gives them
    target: str = "node"
    mode: str | None = None  # None: systemd if usable, else container if a runtime exists, else foreground
    concurrency: tuple[int, ...] | None = None
    dry_run: bool = False
    yes: bool = False
    quick: bool = False
    name: str | None = None
    service_user: str | None = None
    vllm_bin: str | None = None  # local-cpu: the vllm executable (default: next to this Python, then PATH)
    ready_timeout_s: float = 3600.0
    request_timeout_s: float = 120.0
    probe_levels: tuple[str, ...] = ("static", "kernel")
    kernel_python: str | None = None
    ready_port: int | None = None  # the readiness server's port (rocm_dspark.up.ready_server), None: none
    state_dir: Path = field(init=False)  # resolved in __post_init__
    state_dir_flag: str | None = None

    def __post_init__(self):
        """Refuse what no step would accept (before anything is printed, the dry run's first line included)."""
        if self.mode is not None and self.mode not in MODES:
            raise UsageError(f"--mode {self.mode!r}: use one of {', '.join(MODES)}")
        target = target_for(self.target)
        target.check_options(self)
        self.quick = self.quick or target.quick_only
        if self.name is not None:  # the rule the launchers step applies
            check_name(self.name)
        self.state_dir_flag = self.selection.get("state_dir")  # shown in --dry-run's commands only when given
        self.state_dir = Path(store.state_dir(self.state_dir_flag)).absolute()
        self.selection = {**self.selection, "state_dir": str(self.state_dir)}


@dataclass
class UpRun:
    """The values the steps share: the options, the target and mode chosen once, the state, the display, what
    the steps produced, and the plan once chosen (up/choice.py: `plan` and `selection` read it, choosing first)."""

    options: UpOptions
    display: Any
    state: UpState
    outputs: dict = field(default_factory=dict)
    started: dict | None = None  # the service record of a server started by this run
    loads: list[dict] = field(default_factory=list)  # the model loads this run made (rocm_dspark.up.serve.load)
    replanned: set = field(default_factory=set)  # the steps whose new evidence already made this run choose again
    chosen: Any = None  # choice.Chosen, once chosen; None again after new evidence

    def __post_init__(self):
        self.target = TARGETS[self.options.target]  # the steps ask it wherever the targets differ
        self.dir = up_dir(self.options.state_dir)
        self.mode, self.mode_reason = (self.options.mode, "--mode") if self.options.mode else self.target.default_mode()
        self.catalog = load_catalog()

    @property
    def plan(self):
        return choice.chosen(self).plan

    @property
    def selection(self):
        return choice.chosen(self).selection

    @property
    def name(self) -> str:
        return self.options.name or self.target.fixed_name or default_name(self.plan)


def _stop_started(run: UpRun) -> str:
    """After Ctrl-C: stop the server this run started; a second Ctrl-C during its drain kills it at once."""
    import signal

    if not (run.started and control.alive(run.started)):
        return ""
    run.display.say("rocm-dspark up: Ctrl-C: stopping the server this run started (Ctrl-C again kills it at once)")
    try:
        control.stop_recorded(run.state)
        return "; stopped the server this run started"
    except KeyboardInterrupt:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a third must not leave it half-stopped
        try:
            control.stop_recorded(run.state, grace_s=0)
        finally:
            signal.signal(signal.SIGINT, previous)
        return "; killed the server this run started (Ctrl-C again: no drain)"


def refuse_early(run: UpRun) -> None:
    """The refusals that need no step's result, made before anything is printed or written (the dry run's too);
    the steps would make them later: the unit's user (launchers), the readiness port (start)."""
    if run.mode == "systemd":
        unit_user(run)
    sel = run.options.selection  # vLLM's port as the resolver sets it (--port, else the model's), with no plan yet
    ready_server.check_port(
        run.options.ready_port, sel.get("port") or run.catalog.find_model(sel["model"]).serve["port"]
    )


def _header(i: int, n: int, step) -> str:
    return f"[{i:2d}/{n}] {step.title}"


def run_up(options: UpOptions, display, steps=STEPS) -> int:
    """Run (or --dry-run) the steps. Returns the exit status: 0 done, 1 a step failed, 130 interrupted."""
    state = UpState.load(up_dir(options.state_dir))
    run = UpRun(options, display, state)

    refuse_early(run)
    if options.dry_run:
        check_usable(run.dir)  # what prepare and up_lock below refuse, writing nothing
        return _render_plan(run, steps)

    prepare(run.dir)
    with up_lock(run.dir):  # one `up` per state dir: a second refuses and names the holder
        # Read again under the lock: the run that held it may have changed the state.
        run.state = state = UpState.load(up_dir(options.state_dir))
        return _run_steps(run, state, steps)


def _why_run(run: UpRun, step, rec: dict | None, done: bool) -> str | None:
    """Why `step` runs now; None where it finished on these inputs and what it left is still there."""
    if rec is None:
        return "first run"
    if step.always:
        return "always runs"
    if done:
        return step.valid(run, rec.get("output") or {}) if step.valid else None
    return f"last run {rec['status']}" if rec.get("status") != DONE else "its inputs changed"


def _run_steps(run: UpRun, state: UpState, steps) -> int:
    display = run.display
    state.note_run({"at": utc_now(), "argv": redact_argv(sys.argv[1:]), "target": run.options.target})
    n = len(steps)
    i = 0
    while i < n:
        i += 1
        step = steps[i - 1]
        inputs = digest({"step": step.inputs(run), "before": out_hash(run, steps[i - 2].name) if i > 1 else None})
        rec = state.step(step.name)
        reason = _why_run(run, step, rec, state.is_done(step.name, inputs))
        if rec is not None and reason is None:
            run.outputs[step.name] = rec.get("output") or {}
            display.say(f"{_header(i, n, step)}: done {rec['at']}, inputs unchanged")
            continue
        display.say(f"{_header(i, n, step)} ({reason})")
        if (code := _execute(run, step, inputs)) is not None:
            return code
        out = run.outputs[step.name]
        if isinstance(out, dict) and out.get("replan") and step.name not in run.replanned:
            # New evidence (the image pulled: its own software) changes the plan: choose again, once per step; the
            # steps whose inputs did not change are skipped as usual.
            run.replanned.add(step.name)
            run.chosen = None
            i = 0
            display.say(f"rocm-dspark up: {out['replan']}: choosing again")
    return 0


def _execute(run: UpRun, step, inputs: str) -> int | None:
    """Run one step (or say why it skips) and record it; the exit status where the run stops there."""
    display, t0 = run.display, time.monotonic()

    def mark(status: str, **record) -> None:
        run.state.mark(step.name, status, inputs, seconds=time.monotonic() - t0, **record)

    try:
        if why := step.skip and step.skip(run):
            display.say(f"  {why}")
        out = {"skipped": why} if why else step.run(run)
    except StepFailed as exc:
        mark(FAILED, message=exc.message, fix=exc.fix)
        if exc.log_tail:
            display.say("--- log tail ---\n" + exc.log_tail + "\n---")
        display.say(f"rocm-dspark up: step {step.name} failed: {exc.message}; fix: {exc.fix}")
        return 1
    except UsageError as exc:  # bad input (e.g. a tag the registry does not hold): exit 2, as the CLI's errors
        mark(FAILED, message=str(exc))
        display.say(f"rocm-dspark up: step {step.name} failed: {exc}")
        return 2
    except KeyboardInterrupt:
        # Recorded before the server is stopped: a second Ctrl-C during its drain must not leave it unrecorded.
        mark(INTERRUPTED, message="Ctrl-C", fix="run `rocm-dspark up` again: it resumes at this step")
        display.say(
            f"rocm-dspark up: interrupted in step {step.name}{_stop_started(run)}; run `rocm-dspark up` again to "
            "continue"
        )
        return 130
    skipped = out.get("skipped", "") if isinstance(out, dict) else ""
    mark(SKIPPED if skipped else DONE, output=out, message=skipped)
    run.outputs[step.name] = out
    return None


def _render_plan(run: UpRun, steps) -> int:
    """--dry-run: every step's actions (runtime/actions.py), rendered; a bash script whose commands are what the run
    executes and whose every other line is a comment."""
    head = [actions.Say(f"rocm-dspark up --dry-run: nothing below is run or written; state in {run.dir}")]
    head += [
        actions.Say(f"the run would stop at step 3 on this host: {name}: {c.message}; fix: {c.fix}")
        for name, c in mode_checks(run).items()
        if c.status == FAIL
    ]  # made now, as the run makes them
    lines = actions.render(head, "")
    for i, step in enumerate(steps, 1):
        rec = run.state.step(step.name)
        done = f"  [state: {rec['status']} {rec['at']}]" if rec else ""
        why = step.skip and step.skip(run)
        lines += actions.render([actions.Say(f"{_header(i, len(steps), step)}{done}")], "")
        lines += actions.render([actions.Say(why)] if why else step.actions(run))
    for line in lines:
        run.display.say(line)
    return 0


def status(state_dir, sizes: bool = True) -> dict:
    """`rocm-dspark status` (rocm_dspark.service.status), with `up`'s steps named in order."""
    return service_status.status(state_dir, [(s.name, s.title) for s in STEPS], sizes)
