"""What `up` starts for each command it may serve ("block" or "adaptive"), built from its run; service/start.py
starts it, waits until it serves and records the load. start_actions() is the one list the run executes and
--dry-run prints.
"""

from __future__ import annotations

import getpass
import sys
from pathlib import Path

from rocm_dspark.launch.launch_facts import start_window_s
from rocm_dspark.runtime import actions
from rocm_dspark.service import start
from rocm_dspark.service.state import digest
from rocm_dspark.up.steps_common import StepFailed


def service_user(run) -> str:
    """The unit's user: --service-user, else whoever runs `up` (the launcher lives in their state dir, which a
    separate service user could not read)."""
    return run.options.service_user or getpass.getuser()


def command_plans(run) -> dict:
    """The launch plan of each command `up` may serve: "block" always, "adaptive" where the plan has an adaptive
    command (not --adaptive off). Both are written by the launchers step, whatever the gate said, so a new
    verdict changes which one serves, never the files. The adaptive one falls back to block in the launcher."""
    return run.target.command_plans(run, run.plan, (run.outputs.get("image") or {}).get("pinned"))


def serving_command(run) -> str:
    """Which command the gate chose to serve: "adaptive" or "block"."""
    return "adaptive" if run.plan.adaptive_verification and run.target.counts_for_gate else "block"


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


def cache_root(run) -> Path:
    """Where `up`'s compile cache keeps its keys (one root for both commands): the unit's CacheDirectory, else
    the up directory's compile-cache/ (rocm_dspark.launch.compile_cache)."""
    from rocm_dspark.launch import compile_cache

    return Path(compile_cache.UNIT_ROOT) / run.name if run.mode == "systemd" else run.dir / "compile-cache"


def probe_cache(run, image: str, check: bool = True) -> str | None:
    """The key directory the in-image probe mounts, or None (said in one line): it then compiles cold."""
    from rocm_dspark.launch import compile_cache

    key = compile_cache.image_key(image, run.plan.arch)
    directory = cache_root(run) / key if key else None
    why: str | None = None
    if directory is None:
        why = "the image has no digest"
    elif run.mode == "systemd":
        why = "the unit's cache belongs to its user"
    elif check:
        why = compile_cache.usable(directory)
    if why:
        if check:  # not in --dry-run's listing
            run.display.say(f"  compile cache: {why}; the probe compiles cold")
        return None
    return str(directory)


def start_of(run, which: str, plan) -> start.Start:
    """What a start of `which` (its launch plan `plan`) runs."""
    f = files_of(run, which)
    env = {
        start.STATE_ENV: str(run.dir / "launch-state" / which),
        "ROCM_DSPARK_READY_TIMEOUT_S": str(int(run.options.ready_timeout_s)),
        "ROCM_DSPARK_COMPILE_CACHE_DIR": str(cache_root(run)),
    }
    window = start_window_s(plan, run.options.ready_timeout_s)
    return start.Start(which, f["launcher"], f["unit"], service_user(run), env, plan.host, plan.port, window)


def start_actions(run, which: str) -> list[actions.Action]:
    """What a start of `which` does: the unit's install commands (systemd), or the launcher; then the wait."""
    return start.actions(start_of(run, which, command_plans(run)[which]))


def served_facts(run, which: str, plan) -> dict:
    """What the canary and the readiness server's /metrics need of a served command, recorded with the service: the
    plan hash the observability files label it with, the image digest a container runs, the served name, K, the
    sizes the re-scoring reference is padded past, and its start (the canary's switch starts block's)."""
    from rocm_dspark.launch.observability import plan_hash
    from rocm_dspark.probe.live import capture_of, int_flag
    from rocm_dspark.recipe.plan import Command

    k = (Command.from_words(plan.argv).spec_config() or {}).get("num_speculative_tokens")
    image = plan.image if run.mode != "foreground" else ""
    return {
        "plan_hash": plan_hash(run.plan),
        "image_digest": image.partition("@")[2] or "none",
        "served_name": plan.served_name,
        "k": k if isinstance(k, int) else None,
        "capture_size": capture_of(plan.argv, plan.capture_size),
        "max_num_batched_tokens": int_flag(plan.argv, "max_num_batched_tokens"),
        "start": start_of(run, which, plan)._asdict(),
    }


def files_digest(run) -> str | None:
    files = (run.outputs.get("launchers") or run.state.output("launchers") or {}).get("files")
    return digest(files) if files else None


def load(run, which: str, why: str, phase: str = "starting") -> dict:
    """Start the service for `which` command and wait until it serves: one model load (service.start.load)."""
    plans = command_plans(run)
    s = start_of(run, which, plans[which])
    if s.unit:
        commands = [a for a in start.actions(s) if isinstance(a, actions.Run)]
        confirm(run, "install and start the systemd unit with:\n" + "\n".join(actions.render(commands)))

    def started(record: dict) -> None:  # from here on, Ctrl-C stops it (runner._stop_started)
        run.started = record

    facts = {w: served_facts(run, w, p) for w, p in plans.items()}
    return start.load(
        run.state,
        run.display,
        s,
        why,
        facts=facts,
        launchers=files_digest(run),
        loads=run.loads,
        on_record=started,
        phase=phase,
    )


def serving(run, which: str | None = None) -> str | None:
    """Why the recorded service cannot be kept for `which` (None: it serves it, healthy, from unchanged files)."""
    return start.why_not_kept(run.state.service, which, files_digest(run))


def run_all(run, commands: list[actions.Run], what: str, fix: str, timeout: float = 120.0) -> None:
    """Execute each command, said as --dry-run prints it; the first that fails stops the step."""
    actions.run_all(commands, run.display.say, what, fix, timeout)
