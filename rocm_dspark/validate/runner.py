"""Run the checks in order (host -> software -> server -> speculative decoding -> load sweep), stop at the
first blocking failure (the rest are `skipped`, with the reason), and write the report.

The server under test is either a running one (--endpoint URL) or one started here from the generated
launcher (--launch) and stopped afterwards. By default it is the recipe's plan; `--server-json FILE`
describes another server (e.g. a CPU vLLM with a tiny model) when the recipe's own cannot run on this host
(rocm_dspark.runtime.server_spec: the same format as `probe --server-json`).
"""

from __future__ import annotations

import inspect
import platform
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

from rocm_dspark.errors import EnvironmentFailure, UsageError
from rocm_dspark.launch.launch_facts import start_window_s
from rocm_dspark.launch.launchers import write_launchers
from rocm_dspark.runtime.client import VllmClient, loopback_host
from rocm_dspark.runtime.process import VllmServer
from rocm_dspark.runtime.progress import Display
from rocm_dspark.runtime.server_spec import load_server_spec
from rocm_dspark.usecase.launch_plan import plan_for
from rocm_dspark.validate import gsm8k, host_checks, report, server_checks, software_checks, spec_checks, sweep
from rocm_dspark.validate.context import Context, ServerTarget, ValidateOptions, parse_endpoint
from rocm_dspark.validate.log_checks import capture as capture_check
from rocm_dspark.validate.log_checks import jit as jit_check
from rocm_dspark.validate.result import FAIL, PASS, SKIPPED, Check, Outcome
from rocm_dspark.validate.tool_calls import tool_calls

NO_SERVER = "no server to check: pass --endpoint URL (a running server) or --launch (start one)"


def _start(ctx) -> Outcome:
    """the server starts from the generated launcher and becomes ready in time.

    --launch: write the launcher for the target, run it, wait until /health and /v1/models answer."""
    target, opts = ctx.target, ctx.options
    launch_dir = Path(opts.report_dir) / report.LAUNCH_DIR
    launch_dir.mkdir(exist_ok=True)
    plan = ctx.plan
    if target.argv:  # --server-json: the same launcher, around the given command
        plan = plan._replace(
            argv=tuple(target.argv),
            env=dict(target.env),
            host=target.host,
            port=target.port,
            served_name=target.served_name,
            speculative_config={},
            adaptive_verification=False,
            block_argv=None,
            adaptive_argv=None,
        )
    files = write_launchers(
        plan, launch_dir, "shell", name="validate-server", ready_timeout_s=max(int(opts.ready_timeout_s), 1)
    )
    # The launcher's state (launch-state, vllm_command.txt, start logs) goes into the report.
    state = str(launch_dir / "state")
    env = {"ROCM_DSPARK_LAUNCH_STATE_DIR": state, "ROCM_DSPARK_STATE_DIR": state}
    server = VllmServer(
        [str(files.launcher)], env, host=target.host, port=target.port, log_path=launch_dir / "server.log"
    )
    ctx.launched = server
    server.start()
    ready = _wait_with_progress(ctx, server, start_window_s(plan, opts.ready_timeout_s))
    evidence = {"launcher": str(files.launcher), "log": str(server.log_path), "argv": list(plan.argv)}
    if ready.ready:
        status, message = PASS, f"started from the generated launcher, {ready.reason()}"
    else:
        status, message = FAIL, f"launcher: {ready.reason()}"
        evidence["log_tail"] = ready.log_tail
    return Outcome(status, message, value=round(ready.elapsed_s, 1), threshold=opts.ready_timeout_s, evidence=evidence)


def _wait_with_progress(ctx, server, deadline_s: float):
    """The server's readiness wait (rocm_dspark.runtime.readiness), showing the server log's path and the start-up
    phase as it goes (rocm_dspark.runtime.progress: rich on a terminal, plain lines otherwise)."""

    display = ctx.data.get("display") or Display(say=ctx.say)
    check = server.ready_check()
    ready, _phase, _seconds = display.wait("      server.start", server.log_path, check, deadline_s=deadline_s)
    return ready or check.timed_out()


def _check(name: str, blocking: bool, run) -> Check:
    """A check whose meaning (report.md's "What each check means") is the first paragraph of run's docstring."""
    return Check(name, blocking, run, " ".join((inspect.getdoc(run) or "").split("\n\n")[0].split()))


def build_checks(opts: ValidateOptions) -> list[Check]:
    """Every check, in the order it runs. Names are stable: reports of two runs diff by name."""
    levels = [
        Check(
            f"sweep.concurrency_{c}",
            True,
            sweep.level_check(c),
            f"`vllm bench serve` (random data set, fixed lengths and seed), {opts.requests_for(c)} requests at concurrency {c}: all complete; throughput, TTFT, TPOT (per output token) and ITL (gap between streamed chunks).",
        )
        for c in opts.levels()
    ]
    return [
        _check("host.gpus", True, host_checks.gpus),
        _check("host.gpu_profile", True, host_checks.gpu_profile),
        _check("host.hbm", False, host_checks.hbm),
        _check("host.ecc", True, host_checks.ecc),
        _check("host.compute_partition", False, host_checks.compute_partition),
        _check("host.temperature", False, host_checks.temperature),
        _check("host.power", False, host_checks.power),
        _check("host.devices", True, host_checks.devices),
        _check("host.numa_balancing", False, host_checks.numa_balancing),
        _check("host.memlock", False, host_checks.memlock),
        _check("host.disk", True, host_checks.disk),
        _check("software.rocm", False, software_checks.rocm),
        _check("software.torch", False, software_checks.torch),
        _check("software.vllm", False, software_checks.vllm),
        _check("software.aiter", False, software_checks.aiter),
        _check("software.plugin", False, software_checks.plugin),
        _check("software.probe", False, software_checks.probe),
        *([_check("server.start", True, _start)] if opts.launch else []),
        _check("server.health", True, server_checks.health),
        _check("server.models", True, server_checks.models),
        _check("server.version", False, server_checks.version),
        _check("server.capture", True, capture_check),
        _check("server.deterministic", True, server_checks.deterministic),
        _check("server.chat", True, server_checks.chat),
        _check("server.completion", True, server_checks.completion),
        _check("server.mono_decode", False, server_checks.mono_decode),
        _check("server.tool_calls", True, tool_calls),
        _check("spec_decode.acceptance", True, spec_checks.acceptance),
        _check("spec_decode.per_position", False, spec_checks.per_position),
        *levels,
        _check("sweep.jit", False, jit_check),
        _check("sweep.gsm8k", True, gsm8k.gsm8k),
    ]


def _target(opts: ValidateOptions, plan) -> ServerTarget | None:
    custom = load_server_spec(opts.server_json, flag="--server-json") if opts.server_json else None
    if opts.endpoint and opts.launch:
        raise UsageError("--endpoint and --launch exclude each other: check a running server or start one, not both")
    if not opts.endpoint and not opts.launch:
        return None
    if custom is None:
        host, port = parse_endpoint(opts.endpoint) if opts.endpoint else (plan.host, plan.port)
        return ServerTarget(
            plan.served_name,
            loopback_host(host),
            port,
            True,
            num_speculative_tokens=(plan.speculative_config or {}).get("num_speculative_tokens"),
            description=f"the recipe's plan ({plan.profile})",
        )
    if custom.served_name is None:  # every server check asks for this model by name
        raise UsageError(
            f"--server-json {opts.server_json}: validate needs served_name (the name the server lists in /v1/models)"
        )
    host, port = parse_endpoint(opts.endpoint) if opts.endpoint else (custom.host, custom.port)
    # One file can serve probe and validate: keys only probe reads are said, never dropped silently.
    probe_only = [key for key in ("deterministic_check", "prompts") if getattr(custom, key) is not None]
    note = (
        f"--server-json keys {', '.join(probe_only)} are read by `probe` only: validate runs the recipe's "
        "deterministic check (judged only with recipe_model true) and its own fixed workload"
    )
    return ServerTarget(
        custom.served_name,
        host,
        port,
        custom.recipe_model,
        argv=custom.argv,
        env=dict(custom.env),
        num_speculative_tokens=custom.num_speculative_tokens,
        description=custom.description or f"server from {opts.server_json}",
        notes=(note,) if probe_only else (),
    )


def run_validation(
    opts: ValidateOptions,
    selection_opts: dict,
    *,
    command: list[str] | None = None,
    say=lambda line: None,
    on_check=None,
    display=None,
) -> dict:
    """Run every check and write the report into opts.report_dir. Returns the report dict; its
    summary.exit_status is 0 when every blocking check passed, 1 otherwise. Bad input raises UsageError
    before anything runs or is written."""
    catalog, _selection, plan = plan_for(selection_opts, soft=opts.gate_software)
    target = _target(opts, plan)
    if target is None:  # host checks alone say nothing about a server: that is not a validation
        raise UsageError(
            f"validate {NO_SERVER}"
            + (" (--server-json describes it; it does not choose one)" if opts.server_json else "")
        )
    for note in target.notes:
        say(f"note: {note}")
    report.prepare_dir(opts.report_dir, opts.force)  # after every input is checked: a refusal writes nothing
    ctx = Context(opts, catalog, catalog.find_model(plan.model_key), plan, target=target, say=say)
    ctx.client = VllmClient(target.host, target.port)
    ctx.data["state_dir"] = selection_opts.get("state_dir")
    if display is not None:  # rocm_dspark.runtime.progress.Display: the live wait of --launch
        ctx.data["display"] = display
    checks = build_checks(opts)
    started, t_start = datetime.now(UTC), time.monotonic()
    rows: list[dict] = []  # report.json's "checks"
    stopper: Check | None = None  # the blocking check that failed: nothing after it runs
    try:
        for i, check in enumerate(checks, 1):
            if on_check:
                on_check(check.name, ctx)
            t0 = time.monotonic()
            if stopper is not None:
                outcome = Outcome(SKIPPED, f"not run: blocking check {stopper.name} failed")
            else:
                if check.needs_server:
                    say(f"[{i:2d}/{len(checks)}] {check.name} ...")
                try:
                    outcome = check.run(ctx)
                except (UsageError, EnvironmentFailure) as exc:
                    outcome = Outcome(FAIL, str(exc))
                except Exception as exc:  # a broken check is reported as its own failure, never a crash
                    outcome = Outcome(FAIL, f"the check itself failed: {type(exc).__name__}: {exc}")
                if check.blocking and outcome.status == FAIL:
                    stopper = check
            rows.append(
                {
                    "name": check.name,
                    "category": check.category,
                    "status": outcome.status,
                    "blocking": check.blocking,
                    "message": outcome.message,
                    "value": outcome.value,
                    "threshold": outcome.threshold,
                    "evidence": outcome.evidence,
                    "duration_s": round(time.monotonic() - t0, 3),
                }
            )
            say(f"[{i:2d}/{len(checks)}] {check.name:<26} {report.MARK[outcome.status]:<7} {outcome.message}")
    finally:
        stop = None
        if ctx.launched is not None:
            say("stopping the server started by --launch ...")
            res = ctx.launched.stop(grace_s=60)
            stop = {
                "exit_code": res.exit_code,
                "killed": res.killed,
                "elapsed_s": round(res.elapsed_s, 1),
                "leftover_pids": list(res.leftover),
            }
    notes = list(target.notes)
    if stop and stop["leftover_pids"]:
        notes.append(f"the launched server left processes behind: {stop['leftover_pids']}")
    rep = {
        "schema": 1,
        "tool": "rocm-dspark validate",
        "started_at": started.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - t_start, 2),
        "command": command,
        "host": {"hostname": socket.gethostname(), "platform": platform.platform()},
        "plan": {
            "model_key": plan.model_key,
            "profile": plan.profile,
            "gpu": plan.gpu,
            "arch": plan.arch,
            "status": plan.status,
            "vllm_version": plan.vllm_version,
            "served_name": plan.served_name,
            "argv": list(plan.argv),
            "speculative_config": dict(plan.speculative_config),
        },
        "server": {
            "mode": "launch" if opts.launch else "endpoint",
            "base_url": target.base_url,
            "served_name": target.served_name,
            "recipe_model": target.recipe_model,
            "description": target.description,
            "stop": stop,
        },
        "options": {
            "quick": opts.quick,
            "concurrencies": list(opts.levels()),
            "requests_per_level": {c: opts.requests_for(c) for c in opts.levels()},
            "max_tokens": opts.output_tokens(),
            "request_timeout_s": opts.request_timeout_s,
            "gsm8k": opts.gsm8k,
        },
        "summary": report.summary(rows),
        "checks": rows,
        "measurements": {"acceptance": ctx.data.get("acceptance"), "sweep": ctx.data.get("sweep")},
        "notes": notes,
    }
    descriptions = {c.name: c.description for c in checks}
    report.write_report(Path(opts.report_dir), rep, descriptions, ctx.data)
    return rep


def check_names(opts: ValidateOptions) -> list[str]:
    return [c.name for c in build_checks(opts)]
