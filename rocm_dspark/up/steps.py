"""The ten steps of `rocm-dspark up`, each a thin call into the library.

Every step has: `inputs(run)` (what it depends on; hashed into the state file), `run(run)` (does it and
returns what it produced, recorded), `actions(run)` (what it does as typed actions, rendered by --dry-run) and
optionally `valid(run, output)` (why a finished step must be redone although its inputs did not change,
e.g. the server it started is gone). A step that cannot go on raises StepFailed with the fix.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from rocm_dspark.images import pull
from rocm_dspark.runtime.actions import Action, Run, Say, Write
from rocm_dspark.service import control
from rocm_dspark.up import choice, prereq, prove, ready_server, serve
from rocm_dspark.up.steps_common import StepFailed, out_hash, write_json


class Step(NamedTuple):
    name: str
    title: str
    inputs: Callable
    run: Callable
    actions: Callable  # what it does, as typed actions (runtime/actions.py): --dry-run renders them
    valid: Callable | None = None
    always: bool = False  # cheap and about the present (detection, summary): run every time


def selection_flags(run, exclude: tuple[str, ...] = ()) -> str:
    """The selection as the words --dry-run prints (choice.selection_argv), quoted."""
    return shlex.join(choice.selection_argv(run, exclude))


# -- 1. detect ----------------------------------------------------------------------------------------


def detect_inputs(run) -> dict:
    return {"target": run.options.target}


def detect_run(run) -> dict:
    from rocm_dspark.probe import fingerprint

    out = {
        "target": run.options.target,
        "runtime": pull.runtime(),
        "systemd": control.systemd_usable(),
        "vllm": fingerprint.vllm_facts()[0],
    }
    return run.target.detect(run, out)


def detect_actions(run) -> list[Action]:
    return run.target.detect_actions(run)


# -- 2. choose ----------------------------------------------------------------------------------------


def choose_inputs(run) -> dict:
    sel = {k: v for k, v in run.options.selection.items() if k != "state_dir"}
    plan = run.plan  # the command itself (not its notes): new evidence that flips the gate redoes the launch
    soft = choice.chosen(run).software
    return {
        "selection": sel,
        "detected_gpu": (run.outputs.get("detect") or {}).get("gpu"),
        "mode": run.options.mode,
        "target": run.options.target,
        "name": run.options.name,
        "command": [list(plan.argv), dict(plan.env), plan.image],
        "image_software": soft,
    }


def choose_run(run) -> dict:
    c = choice.chosen(run)
    plan, soft = c.plan, c.software
    out = {
        "profile": plan.profile,
        "gpu": plan.gpu,
        "vllm_version": plan.vllm_version,
        "image": plan.image,
        "build": plan.build.name if plan.build else None,
        "status": plan.status,
        "adaptive": plan.adaptive_verification,
        "verdict": c.why,
        "mode": run.mode,
        "name": run.name,
        "plan": plan.to_json_dict(),
        "gate_software": soft or {"source": "this Python", "note": c.software_note},
    }
    if soft:
        f = soft["facts"]
        run.display.say(
            f"  the gate read the image's software: vLLM {f['vllm_version']}, torch {f['torch_version']} "
            f"(HIP {f['hip_version']}), ROCm {f['rocm_version']}"
        )
    elif c.software_note:
        run.display.say(f"  note: {c.software_note}")
    write_json(run, "plan.json", out["plan"])
    run.target.choose(run, plan, out)
    return out


def choose_actions(run) -> list[Action]:
    plan = run.plan
    out: list[Action] = [
        Say(f"the recipe `rocm-dspark recipe {selection_flags(run)}` prints"),
        Say(f"mode: {run.mode} ({run.mode_reason})"),
    ]
    if run.target.gates_on_image(run):
        tool = pull.runtime() or "docker"
        out.append(
            Say(
                f"the gate fingerprints the image's software once it is pulled: {tool} image inspect --format "
                f"'{{{{.Id}}}}' {plan.image}, then {tool} run --rm --network none --entrypoint python3 "
                f"{plan.image} -c <rocm_dspark/probe/software.py>"
            )
        )
    out.append(Write(str(run.dir / "plan.json"), 0o600, "plan"))
    out.append(
        Say(
            "its command (the launchers of step 5 run it): "
            + shlex.join([*(f"{k}={v}" for k, v in plan.env.items()), *plan.argv])
        )
    )
    from rocm_dspark.launch.render import note_lines

    out += [Say(line.removeprefix("# ")) for line in note_lines(plan.notes)]
    return out + run.target.choose_actions(run, plan)


# -- 3. prerequisites ---------------------------------------------------------------------------------


def prereq_inputs(run) -> dict:
    return {"plan": out_hash(run, "choose"), "mode": run.mode}


def mode_checks(run) -> list[prereq.Prereq]:
    """The checks of the mode itself (the daemon answers, systemd is usable): read-only, so --dry-run makes them too."""
    mode = run.mode
    checks = [_daemon_check(mode)] if mode in ("systemd", "container") else []
    if mode == "systemd" and (why := control.systemd_usable()):
        checks.append(
            prereq.Prereq(
                "systemd", prereq.FAIL, why, "use --mode container (no unit) or run as root on a systemd host"
            )
        )
    return checks


def _daemon_check(mode: str) -> prereq.Prereq:
    """The container runtime's daemon must answer (`docker info`), on DOCKER_HOST as the user set it."""
    from rocm_dspark.up.container import daemon_answers

    tool = pull.runtime()
    if tool is None:
        return prereq.Prereq(
            "docker",
            prereq.FAIL,
            f"--mode {mode} runs vLLM in an image but neither docker nor podman is installed",
            "install docker (apt-get install docker.io), or --mode foreground",
        )
    ok, said = daemon_answers(tool)
    where = os.environ.get("DOCKER_HOST") or "the default socket"
    if ok:
        return prereq.Prereq("docker", prereq.OK, f"`{tool} info` answers on {where}: server {said}")
    return prereq.Prereq(
        "docker",
        prereq.FAIL,
        f"the {tool} daemon does not answer on {where}: {said}",
        "start it (sudo systemctl start docker) or set DOCKER_HOST to a running daemon's socket",
    )


def prereq_run(run) -> dict:
    checks = run.target.checks(run, control.alive(run.state.service))
    for c in checks:
        run.display.say(f"  {c.line()}")
    failed = [c for c in checks if c.status == prereq.FAIL]
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more above)" if len(failed) > 1 else ""
        raise StepFailed(f"{first.name}: {first.message}{more}", first.fix)
    return {"checks": [c._asdict() for c in checks]}


def prereq_actions(run) -> list[Action]:
    return run.target.checks_actions(run)


# -- 4. image -----------------------------------------------------------------------------------------


def image_inputs(run) -> dict:
    return {"image": run.plan.image, "mode": run.mode, "runtime": (run.outputs.get("detect") or {}).get("runtime")}


def _image_skip(run) -> str | None:
    if why := run.target.image_skip(run):
        return why
    if run.mode == "foreground":
        return "skipped: --mode foreground runs the host's own vLLM, no container"
    return None


def image_run(run) -> dict:
    why = _image_skip(run)
    if why:
        run.display.say(f"  {why}")
        return {"skipped": why}
    from rocm_dspark.images.pull import PullFailed, pin

    tool = pull.runtime()
    try:
        got = pin(
            run.plan,
            run.options.state_dir,
            tool=tool,
            replacement=run.catalog.default_build(run.catalog.find_gpu(run.plan.gpu))[0].name,
            say=run.display.say,
        )
    except PullFailed as exc:
        if exc.missing:  # bad input, not a broken host: one line and exit 2 (runner)
            from rocm_dspark.errors import UsageError

            raise UsageError(f"{exc.message}; {exc.fix}") from None
        raise StepFailed(exc.message, exc.fix) from None
    run.display.say(f"  pinned {got['pinned']}")
    if choice.chosen(run).software_note and not run.options.dry_run:
        # The plan was chosen before the image was here, on this Python's software: now that the image is pulled,
        # choose again on the image's own (its vLLM decides the build for --image; the gate fingerprints it).
        got = {**got, "replan": "the image is pulled, so the plan now reads the image's own software"}
    return got


def image_actions(run) -> list[Action]:
    why = _image_skip(run)
    if why:
        return [Say(why)]
    tool = pull.runtime() or "docker"
    return [
        Say(f"asks the registry what {run.plan.image} is now (rocm-dspark images; skopeo or the registry HTTP API)"),
        *(Run(tuple(c)) for c in pull.commands(tool, run.plan.image)),
        Say("records the RepoDigests entry (must equal the registry's digest); every start runs it, none pulls"),
    ]


# -- 5. launchers ---------------------------------------------------------------------------------------


def launchers_inputs(run) -> dict:
    return {
        "commands": {w: digest_plan(p) for w, p in serve.command_plans(run).items()},
        "image": out_hash(run, "image"),
        "mode": run.mode,
        "name": run.name,
        "user": serve.service_user(run) if run.mode == "systemd" else None,
        "ready_timeout_s": int(run.options.ready_timeout_s),
    }


def digest_plan(plan) -> str:
    """The plan hash the observability files label every series with (one function for both)."""
    from rocm_dspark.launch.observability import plan_hash

    return plan_hash(plan)


def unit_user(run) -> str:
    """The unit's user, checked as the launchers check it, with `up`'s flag in the message."""
    from rocm_dspark.errors import UsageError
    from rocm_dspark.launch.quoting import unit_user as check

    user = serve.service_user(run)
    if user == "root":
        raise UsageError(
            "the systemd unit would run vLLM as root (you): pass --service-user USER, a dedicated "
            "unprivileged user (e.g. vllm; `up` creates it with groups video and render)"
        )
    return check(user)


def launchers_run(run) -> dict:
    """One launcher set per command that may serve (block; adaptive, which falls back to block), whatever the gate
    said: a new verdict changes which one serves, never the files."""
    from rocm_dspark.launch.launchers import write_launchers

    extra = run.target.launcher_options(run)
    from rocm_dspark.service.state import digest

    mode = run.mode
    sets, files_digest = {}, {}
    for which, plan in serve.command_plans(run).items():
        out = serve.launch_dir(run, which)
        out.mkdir(parents=True, exist_ok=True)
        files = write_launchers(
            plan,
            out,
            "systemd" if mode == "systemd" else "shell",
            name=run.name,
            user=unit_user(run) if mode == "systemd" else None,
            container=mode in ("systemd", "container"),
            ready_timeout_s=int(run.options.ready_timeout_s),
            **extra,
        )
        written = [files.launcher] + ([files.unit] if files.unit else [])
        for f in written:
            run.display.say(f"  wrote {f}")
            files_digest[str(f)] = digest(Path(f).read_text())
        sets[which] = {
            "launcher": str(files.launcher),
            "unit": str(files.unit) if files.unit else None,
            "env_file": str(files.env_file) if files.env_file else None,
            "install": list(files.install_commands) if files.unit else None,
        }
    written, bands = _observability(run, serve.launch_dir(run, next(iter(sets))))
    for f in written:
        run.display.say(f"  wrote {f}")
        files_digest[str(f)] = digest(Path(f).read_text())
    return {"sets": sets, "files": files_digest, "bands": {arm: b._asdict() for arm, b in bands.items()}}


def _observability(run, out: Path) -> tuple[list[Path], dict]:
    """Prometheus and Grafana files beside the launchers (rocm_dspark.launch.observability), with the readiness
    server's target when --ready-port runs one and the A/B's band at --concurrency."""
    from rocm_dspark.launch import observability
    from rocm_dspark.probe.ab_band import bands_for
    from rocm_dspark.runtime.client import base_url
    from rocm_dspark.up import ready_server

    listen = ready_server.listen(run)
    ready = base_url(*listen).removeprefix("http://") if listen else None
    bands = bands_for(run.catalog, run.plan, run.options.state_dir)[0] if run.plan.concurrency is not None else {}
    return observability.write(
        out, observability.render(run.plan, run.name, observability.targets(run.plan), ready=ready, bands=bands)
    ), bands


def launchers_valid(run, output) -> str | None:
    from rocm_dspark.errors import UsageError
    from rocm_dspark.inputs import read_text
    from rocm_dspark.service.state import digest

    for path, want in (output.get("files") or {}).items():
        try:
            if digest(read_text(path, "launcher file")) != want:
                return f"{path} was changed since it was written"
        except UsageError as exc:  # gone, or replaced by something that is not a regular file
            return str(exc)
    return None


def launchers_actions(run) -> list[Action]:
    if run.mode == "systemd":  # the unit's user: refused here as the run refuses it
        unit_user(run)
    out: list[Action] = []
    for which in serve.command_plans(run):
        f = serve.files_of(run, which)
        out.append(Write(f["launcher"], 0o755, f"{which} launcher"))
        if f.get("unit"):
            out.append(Write(f["unit"], 0o644, f"{which} unit"))
        if which == "adaptive":
            out.append(Say("the adaptive launcher falls back to block if the adaptive start fails"))
    return out


# -- 6. probe (the levels that load no model, before the first start) -----------------------------------


def probe_inputs(run) -> dict:
    adaptive = serve.command_plans(run).get("adaptive")
    return {"adaptive": digest_plan(adaptive) if adaptive else None, "levels": list(run.options.probe_levels)}


def _probe_skip(run) -> str | None:
    if "adaptive" not in serve.command_plans(run):
        return "skipped: the plan has no adaptive command to prove"
    if not run.options.probe_levels:
        return "skipped: --probe-levels names no level that runs without a model"
    if serve.serving_command(run) == "adaptive":
        return f"skipped: the gate already proves adaptive verification here ({choice.chosen(run).why})"
    return None


def probe_run(run) -> dict:
    from rocm_dspark.probe.run import run_probe
    from rocm_dspark.up import inimage

    if why := _probe_skip(run):
        run.display.say(f"  {why}")
        return {"skipped": why}
    if run.target.inimage_skip(run) is None:
        # Container modes: the levels run inside the image (up/inimage.py), on the software that will serve.
        try:
            return inimage.probe_step(run)
        except RuntimeError as exc:
            raise StepFailed(str(exc), inimage.WHEEL_FIX) from None
    outcome = run_probe(
        run.catalog,
        run.selection,
        levels=run.options.probe_levels,
        state_dir=run.options.state_dir,
        progress=lambda m: run.display.say(f"  [probe] {m}"),
        kernel_python=run.options.kernel_python,
    )
    run.chosen = None
    if run.target.gates_on_image(run) and fingerprint_vllm() is None:
        run.display.say(f"  note: {IMAGE_ONLY_VLLM.format(mode=run.mode)}")
    levels_out = [
        {
            "name": lv.name,
            "passed": lv.passed,
            "valid_for_gating": lv.valid_for_gating,
            "reason": lv.reason,
            "note": lv.gating_note,
        }
        for lv in outcome.record.levels
    ]
    for lv in levels_out:
        run.display.say(f"  {lv['name']}: {'PASS' if lv['passed'] else 'FAIL'}; {lv['note']}")
    return {
        "record": str(outcome.path),
        "levels": levels_out,
        "gate": outcome.gate_state,
        "gate_reason": outcome.gate_reason,
    }


IMAGE_ONLY_VLLM = (
    "with --mode {mode} vLLM runs inside the image and this host's Python has none, so the levels "
    "above cannot count; records that do are written by `rocm-dspark probe` run inside the image "
    '(README: probe, "On an MI300-class host"), and `up` gates on the image\'s software, so its '
    "next run serves what they prove"
)


def fingerprint_vllm() -> str | None:
    from rocm_dspark.probe import fingerprint

    return fingerprint.vllm_facts()[0]


def probe_actions(run) -> list[Action]:
    from rocm_dspark.up import inimage

    if why := _probe_skip(run):
        return [Say(why)]
    if run.target.inimage_skip(run) is None:
        return inimage.probe_actions(run)
    return [
        Say(
            f"rocm-dspark probe {selection_flags(run)} --levels {','.join(run.options.probe_levels)}, in this "
            "process (no model load; the live level runs on the adaptive start, step 8)"
        )
    ]


# -- 7. start ------------------------------------------------------------------------------------------


def start_inputs(run) -> dict:
    return {"launchers": out_hash(run, "launchers"), "mode": run.mode}


def start_run(run) -> dict:
    """Serve the command the evidence chose: the gate's (the plan), or the one the prove step kept. A service
    that already runs it from unchanged launchers is kept: no load."""
    from rocm_dspark.service.canary import hold

    prev = run.state.output("start") or {}
    kept = (run.state.output("prove") or {}).get("serving")
    wanted = [serve.serving_command(run)] + ([kept] if kept and kept != serve.serving_command(run) else [])
    if held := hold(run.state, out_hash(run, "probe")):
        run.display.say(f"  {held}")
        wanted = ["block"]
    ready_server.ensure(run)  # before any load: a load balancer sees 503 while it runs
    for which in wanted:
        if serve.serving(run, which) is None:
            run.display.say(f"  the service already serves the {which} command from unchanged launchers: no load")
            # The step's output stays what its last load produced: the steps after it are not redone.
            return prev or {"base_url": run.state.service["base_url"], "command": which}
    if control.alive(run.state.service):
        run.display.say("  stopping the service started before (what it runs changed)")
    out = serve.load(
        run, wanted[0], "the service" if wanted[0] == serve.serving_command(run) else "the service (kept by prove)"
    )
    prove.validating(run, wanted[0], "started")
    return out


def start_actions(run) -> list[Action]:
    return [*ready_server.actions(run), *serve.start_actions(run, serve.serving_command(run))]


# -- 8. prove: the adaptive start and the A/B on the service -------------------------------------------


def prove_inputs(run) -> dict:
    return {
        "probe": out_hash(run, "probe"),
        "concurrency": run.options.concurrency,
        "serving": serve.serving_command(run),
    }


def prove_actions(run) -> list[Action]:
    why, c = prove.decision(run)
    if why:
        return [Say(why)]
    return [
        Say(
            f"A/B block arm at c={c}: the workload (validate's sweep, ignore_eos) on the running block service, no load"
        ),
        Say(
            "marks the service proving (not ready: `rocm-dspark status --ready` exits 1), stops it, then starts "
            "the adaptive launcher (one load):"
        ),
        *serve.start_actions(run, "adaptive"),
        Say(
            "live level attached to it: rocm-dspark probe --levels live, carried into the record of step 6 (its "
            "process checked in /proc, tokens re-scored)"
        ),
        Say(
            f"A/B adaptive arm at c={c} on the same start; the A/B record is signed into {run.options.state_dir / 'ab'}"
        ),
        Say(
            "the gate decides (probe records, A/B record, this host's calibration): proven and paying -> the "
            "adaptive start is kept and marked ready; refuted or not paying -> one more start, back to block:"
        ),
        *serve.start_actions(run, "block"),
    ]


# -- 9. validate ---------------------------------------------------------------------------------------


def validate_inputs(run) -> dict:
    return {
        "start": out_hash(run, "start"),
        "prove": out_hash(run, "prove"),
        "concurrency": run.options.concurrency,
        "quick": run.target.quick(run.options),
    }


def validate_run(run) -> dict:
    from rocm_dspark.recipe.secret_env import redact_argv
    from rocm_dspark.validate import ValidateOptions, run_validation

    report_dir = run.dir / "reports" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    report_dir.parent.mkdir(parents=True, exist_ok=True)
    base_url = run.state.service["base_url"]
    opts = ValidateOptions(
        report_dir=report_dir,
        endpoint=base_url,
        server_json=run.target.validate_server_json(run),
        quick=run.target.quick(run.options),
        concurrencies=run.options.concurrency,
        host_root=prereq.host_root(),
        gate_software=choice.gate_software(run),
        bench_container=serve.bench_container(run),
        service_user=run.target.validate_service_user(run),
        request_timeout_s=run.options.request_timeout_s,
    )
    rep = run_validation(
        opts,
        choice.selection_opts(run),
        command=["rocm-dspark", "up"] + redact_argv(sys.argv[1:]),
        say=lambda line: run.display.say(f"  {line}"),
        display=run.display,
    )
    s = rep["summary"]
    checks = {c["name"]: c for c in rep["checks"]}
    acc = checks.get("spec_decode.acceptance") or {}
    sweep = (rep.get("measurements") or {}).get("sweep") or []
    out = {
        "report": str(report_dir / "report.md"),
        "result": s["result"],
        "stopped_at": s["stopped_at"],
        "reason": s["reason"],
        "acceptance_length": acc.get("value") if acc.get("status") == "pass" else None,
        "throughput": [
            {"concurrency": lv["concurrency"], "output_tok_s": lv["output_throughput_tok_s"]} for lv in sweep
        ],
        "hardware_checked": s["hardware_checked"],
    }
    served = (run.state.service or {}).get("command") or "the"
    if s["exit_status"] != 0:
        run.state.set_readiness(
            False, "failed", f"validation {s['result'].upper()} at {s['stopped_at']}: {s['reason']}"
        )
        raise StepFailed(
            f"validate: {s['result'].upper()} at {s['stopped_at']}: {s['reason']}",
            f"read {out['report']}; the server keeps running for a look (`rocm-dspark down` stops it)",
        )
    run.state.set_readiness(
        True, "serving", f"{served} verification serves, validated ({s['result']}: {out['report']})"
    )
    return out


def validate_actions(run) -> list[Action]:
    flags = (
        f" --endpoint http://127.0.0.1:{run.plan.port} --report {shlex.quote(str(run.dir / 'reports' / '<UTC time>'))}"
    )
    if (served := run.target.validate_server_json(run)) is not None:
        flags += f" --server-json {shlex.quote(str(served))}"
    if run.target.quick(run.options):
        flags += " --quick"
    if run.options.concurrency:
        flags += " --concurrency " + ",".join(map(str, run.options.concurrency))
    # validate's own --concurrency is its sweep levels (the plan's workload concurrency is up's largest level)
    return [Say(f"in this process, as `rocm-dspark validate {selection_flags(run, ('concurrency',))}{flags}`")]


# -- 10. summary ---------------------------------------------------------------------------------------


def _ready_if_validated(run) -> None:
    """Every step is done, so validate passed on inputs equal to these: a service kept after a run that died
    mid-load (still "starting") is the validated one, and serves."""
    r, svc = run.state.readiness, run.state.service
    if not r.get("ready") and r.get("phase") in ("starting", "validating") and control.alive(svc):
        v = run.outputs.get("validate") or {}
        run.state.set_readiness(
            True,
            "serving",
            f"{svc.get('command')} verification serves, validated "
            f"({v.get('result')}: {v.get('report')}; its inputs unchanged since)",
        )


def summary_inputs(run) -> dict:
    return {k: out_hash(run, k) for k in ("choose", "image", "start", "probe", "prove", "validate")}


def summary_run(run) -> dict:
    from rocm_dspark.up.summary import build_summary, summary_lines

    _ready_if_validated(run)

    from rocm_dspark.up.canary import ensure_timer

    data = build_summary(run)
    write_json(run, "summary.json", data)
    for line in summary_lines(data) + ensure_timer(run):
        run.display.say(line)
    return data


def summary_actions(run) -> list[Action]:
    from rocm_dspark.up import canary

    return [
        Say(
            "prints the endpoint, build and digest, verification mode and why, the model loads and each one's "
            "time, tokens/s and acceptance length, and the report path"
        ),
        Write(str(run.dir / "summary.json"), 0o600, "summary"),
        *(Say(line) for line in loads_forecast(run)),
        *canary.actions(run),
    ]


def loads_forecast(run) -> list[str]:
    """How many model loads this `up` takes, with and without --concurrency (--dry-run)."""
    start = 0 if serve.serving(run, serve.serving_command(run)) is None else 1
    kept = (run.state.output("prove") or {}).get("serving")
    if kept and serve.serving(run, kept) is None:
        return [f"model loads: 0 (the service already serves the {kept} command the prove step kept)"]
    why, c = prove.loads_forecast(run)
    if why.startswith("skipped"):
        now = f"model loads: {start} (the service{'' if start else ': already serving'}); the prove step makes no adaptive start"
    else:
        now = (
            f"model loads: {start + 1} if adaptive verification is proven and pays at c={c} (block service, then "
            f"one adaptive start that is kept), {start + 2} if it is refuted or does not pay (back to block)"
        )
    if run.options.concurrency:
        other = f"without --concurrency: {start} (the gate cannot say it pays, so no adaptive start)"
    elif "adaptive" in serve.command_plans(run) and serve.serving_command(run) == "block":
        other = (
            f"with --concurrency C: {start + 1} if it is proven and pays at C, {start + 2} if refuted or not "
            f"paying, {start} where the gate already says it does not pay at C"
        )
    else:
        other = f"with --concurrency C: {start} (nothing to prove)"
    return [now, other]


STEPS = (
    Step("detect", "detect the host", detect_inputs, detect_run, detect_actions, always=True),
    Step("choose", "choose the profile and build", choose_inputs, choose_run, choose_actions),
    Step("prereq", "check prerequisites", prereq_inputs, prereq_run, prereq_actions),
    Step("image", "pull the image and pin its digest", image_inputs, image_run, image_actions),
    Step("launchers", "write launchers", launchers_inputs, launchers_run, launchers_actions, valid=launchers_valid),
    Step("probe", "probe the levels that load no model (static, kernel)", probe_inputs, probe_run, probe_actions),
    Step("start", "start the service and wait until ready", start_inputs, start_run, start_actions, always=True),
    Step(
        "prove",
        "prove adaptive verification on the service (live level, A/B)",
        prove_inputs,
        prove.prove_run,
        prove_actions,
    ),
    Step("validate", "validate", validate_inputs, validate_run, validate_actions),
    Step("summary", "summary", summary_inputs, summary_run, summary_actions, always=True),
)
