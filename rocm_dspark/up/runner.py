"""Run the steps in order, resumably: the library behind `rocm-dspark up`.

A step is skipped when the state file says it finished with the same inputs (and, for the launchers and the
server, that they are still there). A failed step is recorded with its fix and stops the run; Ctrl-C stops the
server this run started, records the step as interrupted and stops. Nothing an earlier step wrote is removed.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rocm_dspark.errors import UsageError
from rocm_dspark.inputs import parse_json, read_text
from rocm_dspark.recipe.secret_env import redact_argv
from rocm_dspark.service import control
from rocm_dspark.service.state import DONE, FAILED, INTERRUPTED, SKIPPED, UpState, digest, up_dir, utc_now
from rocm_dspark.up import prereq
from rocm_dspark.up.steps import STEPS, StepFailed
from rocm_dspark.up.target import TARGETS, target_for

MODES = ("systemd", "foreground", "container")


@dataclass
class UpOptions:
    selection: dict                       # the selection flags, as cli.options gives them
    target: str = "node"
    mode: str | None = None               # None: systemd if usable, else container if a runtime exists, else foreground
    concurrency: tuple[int, ...] | None = None
    dry_run: bool = False
    yes: bool = False
    quick: bool = False
    name: str | None = None
    service_user: str | None = None
    vllm_bin: str | None = None           # local-cpu: the vllm executable (default: next to this Python, then PATH)
    ready_timeout_s: float = 3600.0
    request_timeout_s: float = 120.0
    probe_levels: tuple[str, ...] = ("static", "kernel")
    kernel_python: str | None = None
    ready_port: int | None = None        # the readiness server's port (rocm_dspark.up.ready_server), None: none
    state_dir: Path = field(init=False)  # resolved in __post_init__
    state_dir_flag: str | None = None

    def __post_init__(self):
        from rocm_dspark.probe.store import state_dir

        target = target_for(self.target)
        if self.mode is not None and self.mode not in MODES:
            raise UsageError(f"--mode {self.mode!r}: use one of {', '.join(MODES)}")
        target.check_options(self)
        if self.name is not None:  # the rule the launchers step applies, checked before anything (dry run included)
            from rocm_dspark.launch.launchers import check_name

            check_name(self.name)
        self.state_dir_flag = self.selection.get("state_dir")  # shown in --dry-run's commands only when given
        self.state_dir = Path(state_dir(self.selection.get("state_dir"))).absolute()
        self.selection = {**self.selection, "state_dir": str(self.state_dir)}


class UpRun:
    """What the steps share: options, state, display, and the plan once chosen."""

    def __init__(self, options: UpOptions, display, state: UpState):
        self.options, self.display, self.state = options, display, state
        self.target = TARGETS[options.target]  # chosen once: the steps ask it wherever the targets differ
        self.dir = up_dir(options.state_dir)
        self.outputs: dict = {}
        self.started: dict | None = None   # the service record of a server started by this run
        self._resolved: tuple | None = None
        self.software_note: str | None = None  # why the gate could not read the image's software
        self._software: dict = {}              # image -> image_software(), once per run
        self.loads: list[dict] = []            # the model loads this run made (rocm_dspark.up.serve.load)
        self.replanned: set = set()            # the steps whose new evidence already made this run choose again

    # -- helpers the steps use ----------------------------------------------------------------------
    def say(self, line: str) -> None:
        self.display.say(line)

    def out_hash(self, step: str) -> str | None:
        out = self.outputs.get(step)
        return digest(out) if out is not None else None

    def write_json(self, name: str, data) -> Path:
        from rocm_dspark.atomic import write_atomic

        self.dir.mkdir(parents=True, exist_ok=True)
        return write_atomic(self.dir / name, json.dumps(data, indent=1, default=str) + "\n", mode=0o600)

    def confirm(self, what: str) -> None:
        if self.options.yes:
            return
        if not sys.stdin.isatty():
            raise StepFailed(f"need confirmation to {what.splitlines()[0]}", "rerun with --yes (or from a terminal)")
        sys.stderr.write(f"  {what}\n  go ahead? [y/N] ")
        sys.stderr.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            raise StepFailed("not confirmed", "rerun and answer yes, or pass --yes")

    def selection_opts(self) -> dict:
        opts = dict(self.options.selection)
        if self.options.concurrency and not opts.get("concurrency"):
            # The heaviest validated load is the one the plan's workload rules size for.
            opts["concurrency"] = max(self.options.concurrency)
        detected = (self.outputs.get("detect") or {}).get("gpu")
        if not opts.get("gpu") and detected:
            opts["gpu"] = detected
        return self.target.selection_defaults(opts)

    def resolve_plan(self):
        """The recipe's plan and why its verification mode is what it is (the library path `recipe` uses).
        In the container modes the gate fingerprints the image's software, not this Python's (image_software)."""
        if self._resolved is None:
            from rocm_dspark.usecase.launch_plan import plan_for

            opts = self.selection_opts()
            catalog, selection, plan = plan_for(opts)
            soft = self.image_software(plan.image)
            if soft is not None:  # the image's own vLLM decides the build the plan is for (resolve: --image)
                catalog, selection, plan = plan_for({**opts, "image_software": soft["facts"]}, catalog,
                                                    soft=soft["facts"])
            why = next((n.text for n in plan.notes if n.topic.startswith("adaptive")), "")
            self._resolved = (catalog, selection, plan, why)
        return self._resolved[2], self._resolved[3]

    def evidence_changed(self) -> None:
        """New records were written (the probe step): the next plan is resolved through the gate again."""
        self._resolved, self._software = None, {}

    def gate_software(self) -> dict | None:
        """The software facts the gate read for this plan (an image's), or None (this Python's)."""
        found = self.image_software(self.plan.image)
        return found["facts"] if found else None

    def image_software(self, image: str | None) -> dict | None:
        """{"image", "id", "facts"} of the plan's image when vLLM runs in it (container modes) and it is pulled;
        cached by image ID in the up directory. None otherwise: the gate then reads this Python.
        --dry-run runs nothing, so it reads only the cache."""
        if image in self._software:
            return self._software[image]
        self._software[image] = found = self._read_image_software(image)
        return found

    def _read_image_software(self, image: str | None) -> dict | None:
        if self.mode() == "foreground" or not image:
            self.software_note = None
            return None
        from rocm_dspark.images import pull
        from rocm_dspark.probe import software

        cache = self.dir / "image-software.json"
        try:  # bounded, regular files only, strict JSON
            cached = parse_json(read_text(cache, "image software"), "image software")
        except UsageError:
            cached = {}
        tool = pull.runtime()
        if tool is None or self.options.dry_run:
            hit = cached if cached.get("image") == image else None
            self.software_note = None if hit else "the image's software is read after it is pulled"
            return hit
        ident, said = pull.image_id(tool, image)
        if ident is None:
            self.software_note = (f"{image} is not pulled yet ({tool}: {said}), so the gate reads this Python's "
                                  f"software; rerun `up` after the image step")
            return None
        if cached.get("id") == ident and cached.get("image") == image:
            self.software_note = None
            return cached
        try:
            facts = software.in_image(tool, image)
        except RuntimeError as exc:
            self.software_note = f"cannot read the image's software ({exc}); the gate reads this Python's"
            return None
        found = {"image": image, "id": ident, "facts": facts}
        self.write_json(cache.name, found)
        self.software_note = None
        return found

    @property
    def catalog(self):
        if self._resolved is None:
            from rocm_dspark.recipe.catalog import load_catalog

            return load_catalog()
        return self._resolved[0]

    @property
    def selection(self):
        self.resolve_plan()
        assert self._resolved is not None
        return self._resolved[1]

    @property
    def plan(self):
        return self.resolve_plan()[0]

    @property
    def model(self):
        return self.catalog.find_model(self.plan.model_key)

    def service_user(self) -> str:
        """The unit's user: --service-user, else whoever runs `up` (the launcher lives in their state dir,
        which a separate service user could not read)."""
        import getpass

        return self.options.service_user or getpass.getuser()

    def quick(self) -> bool:
        return self.target.quick(self.options)

    def name(self, plan) -> str:
        return self.options.name or self.target.default_name(plan)

    def mode(self) -> str:
        return self.options.mode or self.target.default_mode()[0]

    def mode_reason(self) -> str:
        return "--mode" if self.options.mode else self.target.default_mode()[1]

    def in_container(self) -> bool:
        """The local-cpu target's CPU image serves (rocm_dspark.up.container)."""
        return self.target.in_container(self.mode())

    def command_plans(self) -> dict:
        """The launch plan of each command `up` may serve: "block" always, "adaptive" where the plan has an adaptive
        command (not --adaptive off). Both are written by the launchers step, whatever the gate said, so a new
        verdict changes which one serves, never the files. The adaptive one falls back to block in the launcher."""
        return self.target.command_plans(self, self.plan, (self.outputs.get("image") or {}).get("pinned"))

    def serving_command(self) -> str:
        """Which command the gate chose to serve: "adaptive" or "block"."""
        return "adaptive" if self.plan.adaptive_verification and self.target.counts_for_gate else "block"

    def launch_plan(self, which: str | None = None):
        """The plan the launcher of `which` command runs (default: the one the gate chose); a pulled image
        replaces a tag-only one; local-cpu: the same launcher around the local command."""
        return self.command_plans()[which or self.serving_command()]

    def validate_context(self):
        from rocm_dspark.validate.context import Context, ValidateOptions

        opts = ValidateOptions(report_dir=self.dir, service_user=self.options.service_user, require_gpu=True,
                               require_gpu_why="`up` needs an AMD GPU",
                               host_root=prereq.host_root())
        return Context(opts, self.catalog, self.model, self.plan)

    def selection_argv(self, exclude: tuple[str, ...] = ()) -> list[str]:
        """The selection as command-line words (rocm_dspark.recipe.options); the state dir only when given."""
        from rocm_dspark.recipe.options import selection_argv

        return selection_argv(self.selection_opts(), exclude=exclude if self.options.state_dir_flag
                              else (*exclude, "state_dir"))

    def selection_flags(self, exclude: tuple[str, ...] = ()) -> str:
        """The same, quoted for the commands --dry-run prints."""
        import shlex

        return shlex.join(self.selection_argv(exclude))

    def stop_service(self) -> dict:
        return control.stop_recorded(self.state)


def _stop_started(run: UpRun) -> str:
    """After Ctrl-C: stop the server this run started; a second Ctrl-C during its drain kills it at once."""
    import signal

    if not (run.started and control.alive(run.started)):
        return ""
    run.say("rocm-dspark up: Ctrl-C: stopping the server this run started (Ctrl-C again kills it at once)")
    try:
        run.stop_service()
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
    the steps would make them later: the unit's user (launchers), the readiness port (start), the local check."""
    from rocm_dspark.up import ready_server
    from rocm_dspark.up.steps import unit_user

    if run.mode() == "systemd":
        unit_user(run)
    sel = run.options.selection  # vLLM's port as the resolver sets it (--port, else the model's), with no plan yet
    ready_server.check_port(run.options.ready_port, sel.get("port") or run.catalog.find_model(sel["model"]).serve["port"])
    run.target.refuse_early()


def _header(i: int, n: int, step) -> str:
    return f"[{i:2d}/{n}] {step.title}"


def run_up(options: UpOptions, display, steps=STEPS) -> int:
    """Run (or --dry-run) the steps. Returns the exit status: 0 done, 1 a step failed, 130 interrupted."""
    state = UpState.load(up_dir(options.state_dir))
    run = UpRun(options, display, state)
    from rocm_dspark.service.trust import check_usable, prepare, up_lock

    refuse_early(run)
    if options.dry_run:
        check_usable(run.dir)  # what prepare and up_lock below refuse, writing nothing
        return _render_plan(run, steps)

    prepare(run.dir)
    with up_lock(run.dir):  # one `up` per state dir: a second refuses and names the holder
        # Read again under the lock: the run that held it may have changed the state.
        run.state = state = UpState.load(up_dir(options.state_dir))
        return _run_steps(run, state, steps)


def _run_steps(run: UpRun, state: UpState, steps) -> int:
    display = run.display
    state.note_run({"at": utc_now(), "argv": redact_argv(sys.argv[1:]), "target": run.options.target})
    n = len(steps)
    i = 0
    while i < n:
        i += 1
        step = steps[i - 1]
        inputs = digest({"step": step.inputs(run), "before": run.out_hash(steps[i - 2].name) if i > 1 else None})
        rec = state.step(step.name)
        if not step.always and rec is not None and state.is_done(step.name, inputs):
            why = step.valid(run, rec.get("output") or {}) if step.valid else None
            if why is None:
                run.outputs[step.name] = rec.get("output") or {}
                display.say(f"{_header(i, n, step)}: done {rec['at']}, inputs unchanged")
                continue
            reason = why
        else:
            reason = ("first run" if rec is None else "always runs" if step.always
                      else f"last run {rec['status']}" if rec.get("status") != DONE else "its inputs changed")
        display.say(f"{_header(i, n, step)} ({reason})")
        t0 = time.monotonic()
        try:
            out = step.run(run)
        except StepFailed as exc:
            state.mark(step.name, FAILED, inputs, message=exc.message, fix=exc.fix, seconds=time.monotonic() - t0)
            if exc.log_tail:
                display.say("--- log tail ---\n" + exc.log_tail + "\n---")
            display.say(f"rocm-dspark up: step {step.name} failed: {exc.message}; fix: {exc.fix}")
            return 1
        except UsageError as exc:  # bad input (e.g. a tag the registry does not hold): exit 2, as the CLI's errors
            state.mark(step.name, FAILED, inputs, message=str(exc), seconds=time.monotonic() - t0)
            display.say(f"rocm-dspark up: step {step.name} failed: {exc}")
            return 2
        except KeyboardInterrupt:
            # Recorded before the server is stopped: a second Ctrl-C during its drain must not leave it unrecorded.
            state.mark(step.name, INTERRUPTED, inputs, message="Ctrl-C", fix="run `rocm-dspark up` again: it resumes "
                       "at this step", seconds=time.monotonic() - t0)
            stopped = _stop_started(run)
            display.say(f"rocm-dspark up: interrupted in step {step.name}{stopped}; run `rocm-dspark up` again to continue")
            return 130
        status = SKIPPED if isinstance(out, dict) and out.get("skipped") else DONE
        state.mark(step.name, status, inputs, output=out, seconds=time.monotonic() - t0,
                   message=out.get("skipped", "") if isinstance(out, dict) else "")
        run.outputs[step.name] = out
        if isinstance(out, dict) and out.get("replan") and step.name not in run.replanned:
            # New evidence (the image pulled: its own software) changes the plan: choose again, once per step; the
            # steps whose inputs did not change are skipped as usual.
            run.replanned.add(step.name)
            run.evidence_changed()
            i = 0
            display.say(f"rocm-dspark up: {out['replan']}: choosing again")
    return 0


def _render_plan(run: UpRun, steps) -> int:
    """--dry-run: every step's actions (up/actions.py), rendered; a bash script whose commands are what the run
    executes and whose every other line is a comment."""
    from rocm_dspark.up.actions import Say, render
    from rocm_dspark.up.prereq import FAIL
    from rocm_dspark.up.steps import mode_checks

    head = [Say(f"rocm-dspark up --dry-run: nothing below is run or written; state in {run.dir}")]
    head += [Say(f"the run would stop at step 3 on this host: {c.name}: {c.message}; fix: {c.fix}")
             for c in mode_checks(run) if c.status == FAIL]  # made now, as the run makes them
    lines = render(head, "")
    for i, step in enumerate(steps, 1):
        rec = run.state.step(step.name)
        done = f"  [state: {rec['status']} {rec['at']}]" if rec else ""
        lines += render([Say(f"{_header(i, len(steps), step)}{done}")], "") + render(step.actions(run))
    for line in lines:
        run.display.say(line)
    return 0


def status(state_dir, sizes: bool = True) -> dict:
    """`rocm-dspark status` (rocm_dspark.service.status), with `up`'s steps named in order."""
    from rocm_dspark.service.status import status as of

    return of(state_dir, [(s.name, s.title) for s in STEPS], sizes)
