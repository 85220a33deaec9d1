"""Start and stop `up`'s service for one command ("block" or "adaptive"), and count the model loads.

A model load is the expensive unit of `up` (one DeepSeek-V4.1-Flash start reads the checkpoint, sizes the KV
cache and captures the graphs). Every start goes through `load()`, which records it (why, which command, seconds
to ready) in the run and the state file, so the summary shows them and a test can compare them with the vLLM
starts it counts from outside.

The actions a start runs come from `start_actions()`, the one list that both the run executes (up/actions.py)
and --dry-run prints.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from rocm_dspark.launch.launch_facts import start_window_s
from rocm_dspark.runtime.client import base_url
from rocm_dspark.runtime.readiness import poll_until
from rocm_dspark.service import control
from rocm_dspark.service.state import utc_now
from rocm_dspark.up.actions import Action, Run, Wait, argv_of, execute, render
from rocm_dspark.up.steps_common import StepFailed


def service_user(run) -> str:
    """The unit's user: --service-user, else whoever runs `up` (the launcher lives in their state dir, which a
    separate service user could not read)."""
    import getpass

    return run.options.service_user or getpass.getuser()


def command_plans(run) -> dict:
    """The launch plan of each command `up` may serve: "block" always, "adaptive" where the plan has an adaptive
    command (not --adaptive off). Both are written by the launchers step, whatever the gate said, so a new
    verdict changes which one serves, never the files. The adaptive one falls back to block in the launcher."""
    return run.target.command_plans(run, run.plan, (run.outputs.get("image") or {}).get("pinned"))


def serving_command(run) -> str:
    """Which command the gate chose to serve: "adaptive" or "block"."""
    return "adaptive" if run.plan.adaptive_verification and run.target.counts_for_gate else "block"


def launch_plan(run, which: str | None = None):
    """The plan the launcher of `which` command runs (default: the one the gate chose); a pulled image replaces a
    tag-only one; local-cpu: the same launcher around the local command. The canary's restart (up/canary.py, no
    target) starts the one plan `up` recorded."""
    if run.target is None:
        return run.plan
    return command_plans(run)[which or serving_command(run)]


def confirm(run, what: str) -> None:
    if run.options.yes:
        return
    if not sys.stdin.isatty():
        raise StepFailed(f"need confirmation to {what.splitlines()[0]}", "rerun with --yes (or from a terminal)")
    sys.stderr.write(f"  {what}\n  go ahead? [y/N] ")
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise StepFailed("not confirmed", "rerun and answer yes, or pass --yes")


def bench_container(run) -> tuple[str, str] | None:
    """Where `vllm bench serve` runs (validate's sweep, the A/B arms): in the serving image (container modes), else
    on the host."""
    from rocm_dspark.images.pull import runtime

    tool, image = runtime(), (run.outputs.get("image") or {}).get("pinned") or run.plan.image
    return (tool, image) if run.mode != "foreground" and tool and image else None


def launch_dir(run, which: str) -> Path:
    return run.dir / "launch" / which


def files_of(run, which: str) -> dict:
    """The launcher files of `which`, as the launchers step wrote them (or, in a dry run, will write them)."""
    sets = (run.outputs.get("launchers") or {}).get("sets") or {}
    if which in sets:
        return sets[which]
    name = run.name
    d = launch_dir(run, which)
    unit = d / f"{name}.service" if run.mode == "systemd" else None
    return {"launcher": str(d / f"{name}.sh"), "unit": str(unit) if unit else None}


def install_actions(run, which: str) -> list[Run]:
    """The root commands that install and start the unit of `which` (launch.launchers.install_argvs, what
    `launch` prints)."""
    from rocm_dspark.launch.launchers import LaunchFiles, install_argvs

    f, name = files_of(run, which), run.name
    launcher = Path(f["launcher"])  # write_launchers puts the env file beside it (<name>.env)
    files = LaunchFiles(
        fmt="systemd", name=name, launcher=launcher, unit=Path(f["unit"]), env_file=launcher.with_name(f"{name}.env")
    )
    return [Run(a, root=True) for a in install_argvs(files, service_user(run))]


def cache_root(run) -> Path:
    """Where `up`'s compile cache keeps its keys (one root for both commands): the unit's CacheDirectory, else
    the up directory's compile-cache/ (rocm_dspark.launch.compile_cache)."""
    from rocm_dspark.launch import compile_cache

    return Path(compile_cache.UNIT_ROOT) / run.name if run.mode == "systemd" else run.dir / "compile-cache"


def probe_cache(run, image: str, check: bool = True) -> str | None:
    """The key directory the in-image probe mounts, or None (said in one line): it then compiles cold."""
    from rocm_dspark.launch import compile_cache

    key = compile_cache.image_key(image, run.plan.arch)
    why = (
        "the image has no digest"
        if key is None
        else "the unit's cache belongs to its user"
        if run.mode == "systemd"
        else None
    )
    directory = cache_root(run) / key if key else None
    if why is None and directory is not None and check:
        why = compile_cache.usable(directory)
    if why:
        if check:  # not in --dry-run's listing
            run.display.say(f"  compile cache: {why}; the probe compiles cold")
        return None
    return str(directory)


def process_env(run, which: str) -> dict:
    return {
        "ROCM_DSPARK_LAUNCH_STATE_DIR": str(run.dir / "launch-state" / which),
        "ROCM_DSPARK_READY_TIMEOUT_S": str(int(run.options.ready_timeout_s)),
        "ROCM_DSPARK_COMPILE_CACHE_DIR": str(cache_root(run)),
    }


def start_actions(run, which: str) -> list[Action]:
    """What a start of `which` does, in order: the unit's install commands (systemd), or the launcher; then the
    wait until it serves."""
    plan = launch_plan(run, which)
    wait = Wait(
        f"{base_url(plan.host, plan.port)}/health", start_window_s(plan, run.options.ready_timeout_s), "and /v1/models"
    )
    if run.mode == "systemd":
        return [*install_actions(run, which), wait]
    return [Run((files_of(run, which)["launcher"],), env=tuple(process_env(run, which).items()), detach=True), wait]


def load(run, which: str, why: str, phase: str = "starting") -> dict:
    """Start the service for `which` command and wait until it serves: one model load, recorded. Not ready from
    before the old service stops (`phase`: "starting", or "proving" for the adaptive start); the caller says
    what the start is once it serves."""
    run.state.set_readiness(
        False,
        phase,
        f"{which} verification is starting ({why})"
        if phase == "starting"
        else f"the adaptive start is being proved: not a finished endpoint ({why})",
    )
    before = (run.state.service or {}).get("command")
    if control.alive(run.state.service):
        control.stop_recorded(run.state)
    t0 = time.monotonic()
    entry = {"n": len(run.loads) + 1, "command": which, "why": why, "at": utc_now()}
    run.loads.append(entry)
    try:
        out = _start_systemd(run, which) if run.mode == "systemd" else _start_process(run, which)
    finally:
        entry["seconds"] = round(time.monotonic() - t0, 1)
        run.state.add_load(entry)
    entry["ready_s"] = out["ready_s"]
    entry["cache"] = cache_state(out.get("log"))
    mode = (out.get("launch_state") or {}).get("mode")
    if mode:
        entry["launcher_mode"] = mode
    run.state.add_load(entry, replace=True)
    if before and before != which:
        run.state.add_mode_change({"at": utc_now(), "from": before, "to": which, "why": why})
    return out


def cache_state(log: str | None, limit: int = 32 * 2**20) -> str:
    """The start's compile cache as vLLM's own log tells it (compile_cache.classify), "unknown" without a log."""
    from rocm_dspark.launch.compile_cache import classify

    try:
        with open(log or "", "rb") as f:
            return classify(f.read(limit).decode("utf-8", "replace"))
    except OSError:
        return "unknown"


def files_digest(run) -> str | None:
    from rocm_dspark.service.state import digest

    files = (run.outputs.get("launchers") or run.state.output("launchers") or {}).get("files")
    return digest(files) if files else None


def served_facts(run, which: str) -> dict:
    """What the canary (rocm_dspark.service.canary) and the readiness server's /metrics need of the served command, recorded with
    the service: the plan hash the observability files label it with, the image digest a container runs, the
    served name, K, and the sizes the re-scoring reference is padded past."""
    from rocm_dspark.launch.launch_facts import runs_mono
    from rocm_dspark.launch.observability import plan_hash
    from rocm_dspark.probe.live import capture_of, int_flag
    from rocm_dspark.recipe.plan import Command

    plan = launch_plan(run, which)
    k = (Command.from_words(plan.argv).spec_config() or {}).get("num_speculative_tokens")
    image = plan.image if run.mode != "foreground" else ""
    return {
        "plan_hash": plan_hash(run.plan),
        "image_digest": image.partition("@")[2] or "none",
        "served_name": plan.served_name,
        "k": k if isinstance(k, int) else None,
        "capture_size": capture_of(plan.argv, plan.capture_size),
        "max_num_batched_tokens": int_flag(plan.argv, "max_num_batched_tokens"),
        "ready_timeout_s": int(run.options.ready_timeout_s),
        "monokernel": runs_mono(plan.argv),
    }


def _record(run, which: str, extra: dict) -> dict:
    plan = launch_plan(run, which)
    record = {"host": plan.host, "port": plan.port, "command": which, "launchers": files_digest(run), **extra}
    if run.target is not None:  # `up`'s own run: the facts of every command it may serve
        facts = {w: served_facts(run, w) for w in command_plans(run)}
    else:  # the canary's switch (up/canary.py): the facts `up` recorded
        facts = (run.state.service or {}).get("facts") or {}
    record.update({**facts.get(which, {}), "facts": facts})
    run.started = record
    run.state.set_service(record)
    return record


def _start_process(run, which: str) -> dict:
    plan = launch_plan(run, which)
    launcher = Path(files_of(run, which)["launcher"])
    log = run.dir / "logs" / f"server-{which}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.log"
    srv, rec = control.start_process(launcher, process_env(run, which), host=plan.host, port=plan.port, log_path=log)
    _record(run, which, rec)
    # Ready is the launcher's word: it says serving only once its warm-up requests passed (launcher.sh.tmpl
    # warm_up); /health answers before that.
    check = srv.ready_check(
        gate=lambda: (
            None
            if launcher_phase(run.dir / "launch-state" / which) == "serving"
            else "/health answers, the launcher is warming up"
        )
    )
    ready, _phase, seconds = run.display.wait(
        f"  start ({which})", log, check, deadline_s=start_window_s(plan, run.options.ready_timeout_s)
    )
    ready = ready or check.timed_out()
    if not ready.ready:
        tail = srv.log_tail(30)
        control.stop_recorded(run.state)
        raise StepFailed(
            f"start: {ready.reason()}",
            f"read the log {log}; fix what it says and run `rocm-dspark up` again",
            log_tail=tail,
        )
    ls = launch_state(run.dir / "launch-state" / which)
    run.display.say(
        f"  ready after {seconds:.0f} s at {srv.base_url}"
        + (f", {ls.get('mode')} verification" if ls.get("mode") else "")
    )
    return {
        "base_url": srv.base_url,
        "ready_s": round(seconds, 1),
        "log": str(log),
        "launch_state": ls,
        "pid": rec["pid"],
        "command": which,
    }


def _start_systemd(run, which: str) -> dict:
    commands = [a for a in start_actions(run, which) if isinstance(a, Run)]
    confirm(run, "install and start the systemd unit with:\n" + "\n".join(render(commands)))
    run_all(
        run,
        commands,
        "start",
        "fix what it says (root or sudo is needed to install a unit) and run `rocm-dspark up` again",
        timeout=600,
    )
    unit = Path(files_of(run, which)["unit"]).name
    plan = launch_plan(run, which)
    record = _record(
        run,
        which,
        {
            "kind": "systemd",
            "unit": unit,
            "base_url": base_url(plan.host, plan.port),
            "log": f"/var/lib/rocm-dspark/{Path(unit).stem}/"
            f"{'adaptive' if plan.adaptive_verification else 'block'}.log",
        },
    )
    client = control.attach(record).client
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

    result, _phase, seconds = run.display.wait(
        f"  start ({which})",
        record["log"],
        poll,
        poll_s=2.0,
        deadline_s=start_window_s(plan, run.options.ready_timeout_s),
    )
    if result != "ready":
        _code, tail = execute(Run(("journalctl", "-u", unit, "-n", "30", "--no-pager")))
        raise StepFailed(
            f"start: the unit {unit} is {'not active' if result == 'failed' else 'not ready in time'}",
            f"journalctl -u {unit}; fix and run `rocm-dspark up` again",
            log_tail=tail,
        )
    return {
        "base_url": record["base_url"],
        "ready_s": round(seconds, 1),
        "unit": unit,
        "command": which,
        "log": record["log"],
        "launch_state": launch_state(Path(record["log"]).parent),
    }


def run_all(run, commands: list[Run], what: str, fix: str, timeout: float = 120.0) -> None:
    """Execute each command, said as --dry-run prints it; the first that fails stops the step."""
    for c in commands:
        run.display.say(f"  $ {shlex.join(argv_of(c))}")
        code, text = execute(c, timeout=timeout)
        if code != 0:
            raise StepFailed(
                f"{what}: `{shlex.join(c.argv)}` failed (exit {code}): "
                f"{text.splitlines()[-1] if text else 'no output'}",
                fix,
            )


def launcher_phase(directory: Path) -> str | None:
    """The phase the launcher last wrote (starting, warming, serving, failed, ...), None before it wrote one."""
    from rocm_dspark.launch import launch_state as reader

    return reader.read(directory).get("phase")


def launch_state(directory: Path, wait_s: float = 10.0) -> dict:
    """The launcher's state (rocm_dspark.launch.launch_state) once it says serving (it writes it just after readiness)."""
    from rocm_dspark.launch import launch_state as reader

    data: dict = {}

    def serving():
        nonlocal data
        data = reader.read(directory)  # bounded, non-blocking: a FIFO or a huge file there must not hang `up`
        return data if data.get("phase") == "serving" else None

    poll_until(serving, wait_s, max_s=0.5)
    return {k: data.get(k) for k in ("phase", "mode", "fell_back", "pid", "attempts", "monokernel") if k in data}


def serving(run, which: str | None = None) -> str | None:
    """Why the recorded service cannot be kept for `which` (None: it serves it, healthy, from unchanged files)."""
    svc = run.state.service
    if not control.alive(svc):
        return "the service is not running"
    if which is not None and svc.get("command") != which:
        return f"the service runs the {svc.get('command') or 'an older'} command, not {which}"
    if svc.get("launchers") != files_digest(run):
        return "the service was started from launchers that were rewritten since"
    try:
        res = control.attach(svc).client.get("/health", timeout_s=5)
    except Exception as exc:  # noqa: BLE001 - any failure means: not serving
        return f"the service does not answer /health ({exc})"
    return None if res.status == 200 else f"the service answers /health with HTTP {res.status}"
