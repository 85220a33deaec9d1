"""The ten steps of `rocm-dspark up`, each a thin call into the library (step 8: up/prove.py, 10: up/summary.py).

Every step has: `inputs(run)` (what it depends on; hashed into the state file), `run(run)` (does it and
returns what it produced, recorded), `actions(run)` (what it does as typed actions, rendered by --dry-run),
optionally `skip(run)` (why it does nothing this time: the run says it and records the step skipped, --dry-run
prints it instead of the actions) and `valid(run, output)` (why a finished step must be redone although its
inputs did not change, e.g. the server it started is gone). A step that cannot go on raises StepFailed with the fix.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from rocm_dspark.errors import UsageError
from rocm_dspark.images import pull, wheel
from rocm_dspark.inputs import read_text
from rocm_dspark.launch import observability, quoting
from rocm_dspark.launch.launchers import write_launchers
from rocm_dspark.launch.render import note_lines
from rocm_dspark.probe import fingerprint, inimage, store
from rocm_dspark.probe.ab_band import bands_for
from rocm_dspark.probe.run import run_probe
from rocm_dspark.recipe.secret_env import redact_argv
from rocm_dspark.runtime.actions import Action, Run, Say, Write
from rocm_dspark.runtime.client import base_url
from rocm_dspark.service import control
from rocm_dspark.service.canary import hold
from rocm_dspark.service.state import digest
from rocm_dspark.up import choice, prove, ready_server, serve, summary
from rocm_dspark.up.steps_common import StepFailed, build_wheel, out_hash, write_json
from rocm_dspark.validate import start_checks
from rocm_dspark.validate.result import FAIL, WARN, Outcome


class Step(NamedTuple):
    name: str
    title: str
    inputs: Callable
    run: Callable
    actions: Callable  # what it does, as typed actions (runtime/actions.py): --dry-run renders them
    skip: Callable | None = None
    valid: Callable | None = None
    always: bool = False  # cheap and about the present (detection, summary): run every time


def selection_flags(run, exclude: tuple[str, ...] = ()) -> str:
    """The selection as the words --dry-run prints (choice.selection_argv), quoted."""
    return shlex.join(choice.selection_argv(run, exclude))


def gate_reads_image(run) -> bool:
    """The gate fingerprints the image's software (container modes), not this Python's; local-cpu has no gate."""
    return run.target.counts_for_gate and run.mode != "foreground"


# -- 1. detect ----------------------------------------------------------------------------------------


def detect_inputs(run) -> dict:
    return {"target": run.options.target}


def detect_run(run) -> dict:
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
    return {
        "selection": sel,
        "detected_gpu": (run.outputs.get("detect") or {}).get("gpu"),
        "mode": run.options.mode,
        "target": run.options.target,
        "name": run.options.name,
        "command": [list(plan.argv), dict(plan.env), plan.image],
        "image_software": choice.chosen(run).software,
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
    if gate_reads_image(run):
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
    out += [Say(line.removeprefix("# ")) for line in note_lines(plan.notes)]
    return out + run.target.choose_actions(run, plan)


# -- 3. prerequisites ---------------------------------------------------------------------------------


def prereq_inputs(run) -> dict:
    return {"plan": out_hash(run, "choose"), "mode": run.mode}


def prereq_actions(run) -> list[Action]:
    return run.target.checks_actions(run)


def mode_checks(run) -> dict[str, Outcome]:
    """The checks of the mode itself (the daemon answers, systemd is usable): read-only, so --dry-run makes them too."""
    checks = {"docker": start_checks.daemon(pull.runtime(), run.mode)} if run.mode in ("systemd", "container") else {}
    if run.mode == "systemd" and (why := control.systemd_usable()):
        checks["systemd"] = Outcome(FAIL, why, fix="use --mode container (no unit) or run as root on a systemd host")
    return checks


def prereq_run(run) -> dict:
    """The target's checks (validate's host checks on a node), then what a start needs (validate.start_checks)."""
    checks = run.target.checks(run)
    present = "checkpoint present" in getattr(checks.get("disk"), "message", "")
    checks |= start_checks.checkpoint(run.plan, run.options.selection.get("model_path"), needs_download=not present)
    checks |= mode_checks(run)
    block = serve.command_plans(run)["block"]
    checks["port"] = start_checks.port(block.host, block.port, ours=control.alive(run.state.service))
    for name, c in checks.items():
        fix = f" -> fix: {c.fix}" if c.fix and c.status in (WARN, FAIL) else ""
        run.display.say(f"  {name:<14} {c.status:<7} {c.message}{fix}")
    failed = [(name, c) for name, c in checks.items() if c.status == FAIL]
    if failed:
        (name, first), more = failed[0], f" (and {len(failed) - 1} more above)" if len(failed) > 1 else ""
        raise StepFailed(f"{name}: {first.message}{more}", first.fix)
    return {"checks": [{"name": n, "status": c.status, "message": c.message, "fix": c.fix} for n, c in checks.items()]}


# -- 4. image -----------------------------------------------------------------------------------------


def image_inputs(run) -> dict:
    return {"image": run.plan.image, "mode": run.mode, "runtime": (run.outputs.get("detect") or {}).get("runtime")}


def image_skip(run) -> str | None:
    return f"skipped: {run.target.host_vllm}, no container" if run.mode == "foreground" else None


def image_run(run) -> dict:
    try:
        got = pull.pin(
            run.plan,
            run.options.state_dir,
            tool=pull.runtime(),
            replacement=run.catalog.default_build(run.catalog.find_gpu(run.plan.gpu))[0].name,
            say=run.display.say,
        )
    except pull.PullFailed as exc:
        if exc.missing:  # bad input, not a broken host: one line and exit 2 (runner)
            raise UsageError(f"{exc.message}; {exc.fix}") from None
        raise StepFailed(exc.message, exc.fix) from None
    run.display.say(f"  pinned {got['pinned']}")
    if choice.chosen(run).software_note and not run.options.dry_run:
        # The plan was chosen before the image was here, on this Python's software: now that the image is pulled,
        # choose again on the image's own (its vLLM decides the build for --image; the gate fingerprints it).
        got = {**got, "replan": "the image is pulled, so the plan now reads the image's own software"}
    return got


def image_actions(run) -> list[Action]:
    tool = pull.runtime() or "docker"
    return [
        Say(f"asks the registry what {run.plan.image} is now (rocm-dspark images; skopeo or the registry HTTP API)"),
        *(Run(tuple(c)) for c in pull.commands(tool, run.plan.image)),
        Say("records the RepoDigests entry (must equal the registry's digest); every start runs it, none pulls"),
    ]


# -- 5. launchers ---------------------------------------------------------------------------------------


def launchers_inputs(run) -> dict:
    return {
        "commands": {w: observability.plan_hash(p) for w, p in serve.command_plans(run).items()},
        "image": out_hash(run, "image"),
        "mode": run.mode,
        "name": run.name,
        "user": serve.service_user(run) if run.mode == "systemd" else None,
        "ready_timeout_s": int(run.options.ready_timeout_s),
    }


def unit_user(run) -> str:
    """The unit's user, checked as the launchers check it, with `up`'s flag in the message."""
    user = serve.service_user(run)
    if user == "root":
        raise UsageError(
            "the systemd unit would run vLLM as root (you): pass --service-user USER, a dedicated "
            "unprivileged user (e.g. vllm; `up` creates it with groups video and render)"
        )
    return quoting.unit_user(user)


def launchers_run(run) -> dict:
    """One launcher set per command that may serve (block; adaptive, which falls back to block), whatever the gate
    said: a new verdict changes which one serves, never the files."""
    extra = run.target.launcher_options(run)
    mode = run.mode
    sets, written = {}, []
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
        written += [files.launcher] + ([files.unit] if files.unit else [])
        sets[which] = {
            "launcher": str(files.launcher),
            "unit": str(files.unit) if files.unit else None,
            "env_file": str(files.env_file) if files.env_file else None,
            "install": list(files.install_commands) if files.unit else None,
        }
    dashboards, bands = _observability(run, serve.launch_dir(run, next(iter(sets))))
    files_digest = {}
    for f in [*written, *dashboards]:
        run.display.say(f"  wrote {f}")
        files_digest[str(f)] = digest(Path(f).read_text())
    return {"sets": sets, "files": files_digest, "bands": {arm: b._asdict() for arm, b in bands.items()}}


def _observability(run, out: Path) -> tuple[list[Path], dict]:
    """Prometheus and Grafana files beside the launchers (rocm_dspark.launch.observability), with the readiness
    server's target when --ready-port runs one and the A/B's band at --concurrency."""
    listen = ready_server.listen(run)
    ready = base_url(*listen).removeprefix("http://") if listen else None
    bands = bands_for(run.catalog, run.plan, run.options.state_dir)[0] if run.plan.concurrency is not None else {}
    return observability.write(
        out, observability.render(run.plan, run.name, observability.targets(run.plan), ready=ready, bands=bands)
    ), bands


def launchers_valid(run, output) -> str | None:
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
    return {
        "adaptive": observability.plan_hash(adaptive) if adaptive else None,
        "levels": list(run.options.probe_levels),
    }


def probe_skip(run) -> str | None:
    if "adaptive" not in serve.command_plans(run):
        return "skipped: the plan has no adaptive command to prove"
    if not run.options.probe_levels:
        return "skipped: --probe-levels names no level that runs without a model"
    if serve.serving_command(run) == "adaptive":
        return f"skipped: the gate already proves adaptive verification here ({choice.chosen(run).why})"
    return None


def in_image_skip(run) -> str | None:
    """Why the levels run in this process, not inside the image on the software that will serve (None: inside)."""
    if run.mode == "foreground":
        return run.target.host_vllm
    if pull.runtime() is None:
        return "no docker or podman to run the image"
    if run.target.counts_for_gate and (proof := prove.judged(run).proof).adaptive_proven:
        return f"a record already proves adaptive verification here ({proof.reason})"
    return None


def probe_run(run) -> dict:
    if in_image_skip(run) is None:
        return probe_in_image(run)
    outcome = run_probe(
        run.catalog,
        run.selection,
        levels=run.options.probe_levels,
        state_dir=run.options.state_dir,
        progress=lambda m: run.display.say(f"  [probe] {m}"),
        kernel_python=run.options.kernel_python,
    )
    run.chosen = None
    if gate_reads_image(run) and fingerprint.vllm_facts()[0] is None:
        run.display.say(
            f"  note: with --mode {run.mode} vLLM runs inside the image and this host's Python has none, so the "
            "levels above cannot count; records that do are written by `rocm-dspark probe` run inside the image "
            '(README: probe, "On an MI300-class host"), and `up` gates on the image\'s software, so its next run '
            "serves what they prove"
        )
    levels = outcome.summary()["levels"]  # as `probe --json` prints them
    for lv in levels:
        run.display.say(f"  {lv['name']}: {'PASS' if lv['passed'] else 'FAIL'}; {lv['gating_note']}")
    return {
        "record": str(outcome.path),
        "levels": levels,
        "gate": outcome.gate_state,
        "gate_reason": outcome.gate_reason,
    }


def in_image_argv(run, image: str, wheel: Path, check: bool = True) -> list[str]:
    """The in-image probe's `docker run` (rocm_dspark.probe.inimage) of the no-model levels, in the served image."""
    return inimage.probe_command(
        pull.runtime() or "docker",
        image,
        wheel,
        run.options.state_dir,
        choice.selection_argv(run, ("state_dir",)),
        tuple(run.options.probe_levels),
        run_flags=run.target.image_run_flags,
        compile_cache_dir=serve.probe_cache(run, image, check=check),
        model_path=run.options.selection.get("model_path"),
    )


def probe_in_image(run) -> dict:
    """Container modes: the levels that load no model, run inside the pulled image before the first start (a
    build whose classes refuse adaptive verification costs no load); the records read back with the gate, on the
    image's software (choice.image_software). The live level runs on `up`'s own adaptive start (up/prove.py)."""
    image = (run.outputs.get("image") or {}).get("pinned") or run.plan.image
    levels = list(run.options.probe_levels)
    wheel = build_wheel(run, "the probe installs it in the image")
    argv = in_image_argv(run, image, wheel)
    directory = store.records_dir(run.options.state_dir)
    before = set(store.record_names(directory))
    run.display.say(
        f"  [in image] {shlex.join(argv[:2])} ... --entrypoint bash {image} -c '<pip install --no-deps the wheel; "
        f"rocm-dspark probe --levels {','.join(levels)}>'"
    )
    code, tail = inimage.run_in_image(argv, say=lambda line: run.display.say(f"  [in image] {line}"))
    new = sorted(set(store.record_names(directory)) - before)
    if code not in (0, 1):  # 1: a level failed (its record says why); 2: a usage error, 3: no click, 4: no pip
        raise StepFailed(
            f"the probe inside {image} exited {code}: {' '.join(tail[-1].split()) if tail else 'no output'}",
            "fix what its last line says, then rerun `rocm-dspark up`",
            log_tail="\n".join(tail),
        )
    run.chosen = None  # the image is pulled and records written: the gate reads them on its software
    verdict = prove.judged(run).verdict
    run.display.say(
        f"  the probe inside the image exited {code} and wrote {len(new)} record(s); gate: {verdict.reason}"
    )
    done = {"image": image, "wheel": str(wheel), "exit_code": code, "levels": levels, "argv": argv, "new_records": new}
    return {"in_image": done, "gate": verdict.outcome, "gate_reason": verdict.reason}


def probe_actions(run) -> list[Action]:
    if in_image_skip(run) is not None:
        return [
            Say(
                f"rocm-dspark probe {selection_flags(run)} --levels {','.join(run.options.probe_levels)}, in this "
                "process (no model load; the live level runs on the adaptive start, step 8)"
            )
        ]
    built = wheel.wheel_path(run.dir / "wheel")
    if built is None:
        return [Say("the run would stop here: no source tree beside this rocm-dspark to build its wheel from")]
    # pip wheel runs on a copy of the sources (the checkout stays clean): said, not printed as a command to paste.
    return [
        Say(f"builds {built} with pip wheel --no-deps --no-index from a copy of {wheel.toolkit_source()}"),
        Run(tuple(in_image_argv(run, run.plan.image, built, check=False))),
        Say("reads the records back with the gate (no model load: the live level runs on the adaptive start, step 8)"),
    ]


# -- 7. start ------------------------------------------------------------------------------------------


def start_inputs(run) -> dict:
    return {"launchers": out_hash(run, "launchers"), "mode": run.mode}


def start_run(run) -> dict:
    """Serve the command the evidence chose: the gate's (the plan), or the one the prove step kept. A service
    that already runs it from unchanged launchers is kept: no load."""
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


# -- 9. validate ---------------------------------------------------------------------------------------


def validate_inputs(run) -> dict:
    return {
        "start": out_hash(run, "start"),
        "prove": out_hash(run, "prove"),
        "concurrency": run.options.concurrency,
        "quick": run.options.quick,
    }


def validate_run(run) -> dict:
    from rocm_dspark.validate import ValidateOptions, run_validation

    report_dir = run.dir / "reports" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    opts = ValidateOptions(
        report_dir=report_dir,
        endpoint=run.state.service["base_url"],
        server_json=run.target.validate_server_json(run),
        quick=run.options.quick,
        concurrencies=run.options.concurrency,
        host_root=start_checks.host_root(),
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
    acc: dict = next((c for c in rep["checks"] if c["name"] == "spec_decode.acceptance"), {})
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
    if s["exit_status"] != 0:
        why = f"{s['result'].upper()} at {s['stopped_at']}: {s['reason']}"
        run.state.set_readiness(False, "failed", f"validation {why}")
        raise StepFailed(
            f"validate: {why}",
            f"read {out['report']}; the server keeps running for a look (`rocm-dspark down` stops it)",
        )
    served = (run.state.service or {}).get("command") or "the"
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
    if run.options.quick:
        flags += " --quick"
    if run.options.concurrency:
        flags += " --concurrency " + ",".join(map(str, run.options.concurrency))
    # validate's own --concurrency is its sweep levels (the plan's workload concurrency is up's largest level)
    return [Say(f"in this process, as `rocm-dspark validate {selection_flags(run, ('concurrency',))}{flags}`")]


STEPS = (
    Step("detect", "detect the host", detect_inputs, detect_run, detect_actions, always=True),
    Step("choose", "choose the profile and build", choose_inputs, choose_run, choose_actions),
    Step("prereq", "check prerequisites", prereq_inputs, prereq_run, prereq_actions),
    Step("image", "pull the image and pin its digest", image_inputs, image_run, image_actions, image_skip),
    Step("launchers", "write launchers", launchers_inputs, launchers_run, launchers_actions, valid=launchers_valid),
    Step(
        "probe",
        "probe the levels that load no model (static, kernel)",
        probe_inputs,
        probe_run,
        probe_actions,
        probe_skip,
    ),
    Step("start", "start the service and wait until ready", start_inputs, start_run, start_actions, always=True),
    Step(
        "prove",
        "prove adaptive verification on the service (live level, A/B)",
        prove.prove_inputs,
        prove.prove_run,
        prove.prove_actions,
        prove.skip,
    ),
    Step("validate", "validate", validate_inputs, validate_run, validate_actions),
    Step("summary", "summary", summary.summary_inputs, summary.summary_run, summary.summary_actions, always=True),
)
