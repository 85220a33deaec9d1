"""Run the checks in order (host -> software -> server -> speculative decoding -> load sweep), stop at the
first blocking failure (the rest are `skipped`, with the reason), and write the report.

The server under test is either a running one (--endpoint URL) or one started here from the generated
launcher (--launch) and stopped afterwards. By default it is the recipe's plan; `--server-json FILE`
describes another server (e.g. a CPU vLLM with a tiny model) when the recipe's own cannot run on this host
(rocm_dspark.runtime.server_spec: the same format as `probe --server-json`).
"""

from __future__ import annotations

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
from rocm_dspark.runtime.server_spec import load_server_spec
from rocm_dspark.usecase.launch_plan import plan_for
from rocm_dspark.validate import gsm8k, host_checks, report, server_checks, software_checks, spec_checks, sweep
from rocm_dspark.validate.context import Context, ServerTarget, ValidateOptions, parse_endpoint
from rocm_dspark.validate.log_checks import capture as capture_check
from rocm_dspark.validate.log_checks import jit as jit_check
from rocm_dspark.validate.result import FAIL, NOT_APPLICABLE, PASS, SKIPPED, Check, CheckResult, Outcome
from rocm_dspark.validate.tool_calls import tool_calls

NO_SERVER = "no server to check: pass --endpoint URL (a running server) or --launch (start one)"


def _start(ctx) -> Outcome:
    """--launch: write the launcher for the target, run it, wait until /health and /v1/models answer."""
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
    env = {
        "ROCM_DSPARK_LAUNCH_STATE_DIR": str(launch_dir / "state"),
        "ROCM_DSPARK_STATE_DIR": str(launch_dir / "state"),
    }
    server = VllmServer(
        [str(files.launcher)], env, host=target.host, port=target.port, log_path=launch_dir / "server.log"
    )
    ctx.launched = server
    server.start()
    ready = _wait_with_progress(ctx, server, start_window_s(plan, opts.ready_timeout_s))
    evidence = {"launcher": str(files.launcher), "log": str(server.log_path), "argv": list(plan.argv)}
    if not ready.ready:
        evidence["log_tail"] = ready.log_tail
        return Outcome(
            FAIL,
            f"launcher: {ready.reason()}",
            value=round(ready.elapsed_s, 1),
            threshold=opts.ready_timeout_s,
            evidence=evidence,
        )
    return Outcome(
        PASS,
        f"started from the generated launcher, {ready.reason()}",
        value=round(ready.elapsed_s, 1),
        threshold=opts.ready_timeout_s,
        evidence=evidence,
    )


def _wait_with_progress(ctx, server, deadline_s: float):
    """The server's readiness wait (rocm_dspark.runtime.readiness), showing the server log's path and the start-up
    phase as it goes (rocm_dspark.runtime.progress: rich on a terminal, plain lines otherwise)."""
    from rocm_dspark.runtime.progress import Display

    display = ctx.data.get("display") or Display(say=ctx.say)
    check = server.ready_check()
    ready, _phase, _seconds = display.wait("      server.start", server.log_path, check, deadline_s=deadline_s)
    return ready or check.timed_out()


def build_checks(opts: ValidateOptions) -> list[Check]:
    """Every check, in the order it runs. Names are stable: reports of two runs diff by name."""
    h, s, sv, sp = host_checks, software_checks, server_checks, spec_checks
    checks = [
        Check(
            "host.gpus", "host", True, h.gpus, "AMD GPUs reported by amd-smi (JSON) or rocminfo: count, name, gfx arch."
        ),
        Check(
            "host.gpu_profile",
            "host",
            True,
            h.gpu_profile,
            "the GPUs are the part the plan's profile assumed (name and gfx arch) and there are TP x DP of them.",
        ),
        Check(
            "host.hbm",
            "host",
            False,
            h.hbm,
            "HBM per GPU matches the part's size (a smaller value means a memory partition or a VF slice).",
        ),
        Check("host.ecc", "host", True, h.ecc, "no uncorrectable ECC errors (correctable ones warn)."),
        Check(
            "host.compute_partition",
            "host",
            False,
            h.compute_partition,
            "the compute partition mode (amd-smi static --partition): a split GPU cannot run --monokernel.",
        ),
        Check(
            "host.temperature",
            "host",
            False,
            h.temperature,
            "current temperatures below the device's own slowdown limits.",
        ),
        Check("host.power", "host", False, h.power, "the power cap in force is not below the part's TDP."),
        Check(
            "host.devices",
            "host",
            True,
            h.devices,
            "/dev/kfd and /dev/dri render nodes are readable and writable by the service user (groups video, render).",
        ),
        Check(
            "host.numa_balancing",
            "host",
            False,
            h.numa_balancing,
            "kernel NUMA balancing is off (it can stall GPU work).",
        ),
        Check("host.memlock", "host", False, h.memlock, "the memlock limit is unlimited (pinned host memory)."),
        Check("host.disk", "host", True, h.disk, "the checkpoint is present or its disk has room for it."),
        Check(
            "software.rocm",
            "software",
            False,
            s.rocm,
            "ROCm version on the host (/opt/rocm/.info/version, amd-smi version).",
        ),
        Check(
            "software.torch",
            "software",
            False,
            s.torch,
            "torch in the server's Python is a ROCm build (torch.version.hip).",
        ),
        Check(
            "software.vllm",
            "software",
            False,
            s.vllm,
            "vLLM version and commit in the server's Python, against the plan's.",
        ),
        Check(
            "software.aiter",
            "software",
            False,
            s.aiter,
            "the aiter kernel library is importable (the plan enables AITER kernels).",
        ),
        Check(
            "software.plugin",
            "software",
            False,
            s.plugin,
            "the rocm-dspark vLLM plugin's status, where it is installed.",
        ),
        Check(
            "software.probe",
            "software",
            False,
            s.probe,
            "the probe gate's verdict: a matching record proving adaptive verification, or why not.",
        ),
    ]
    if opts.launch:
        checks.append(
            Check(
                "server.start",
                "server",
                True,
                _start,
                "the server starts from the generated launcher and becomes ready in time.",
                needs_server=True,
            )
        )
    checks += [
        Check("server.health", "server", True, sv.health, "GET /health answers 200.", needs_server=True),
        Check(
            "server.models", "server", True, sv.models, "GET /v1/models lists the served model name.", needs_server=True
        ),
        Check(
            "server.version", "server", False, sv.version, "GET /version: the vLLM the server runs.", needs_server=True
        ),
        Check(
            "server.capture",
            "server",
            True,
            capture_check,
            "the server log: vLLM kept the plan's --max-cudagraph-capture-size (no \"Truncating "
            'max_cudagraph_capture_size"); steps above the size it kept run eager.',
            needs_server=True,
        ),
        Check(
            "server.deterministic",
            "server",
            True,
            sv.deterministic,
            "the recipe's deterministic check (data: validation.deterministic_check; 17*19 -> 323 with thinking off).",
            needs_server=True,
        ),
        Check("server.chat", "server", True, sv.chat, "a chat completion returns generated tokens.", needs_server=True),
        Check(
            "server.completion",
            "server",
            True,
            sv.completion,
            "a text completion returns generated tokens.",
            needs_server=True,
        ),
        Check(
            "server.mono_decode",
            "server",
            False,
            sv.mono_decode,
            "--monokernel: which mono decode path the server log says runs (whole layer, FFN launch, or off, and why).",
            needs_server=True,
        ),
        Check(
            "server.tool_calls",
            "server",
            True,
            tool_calls,
            "the plan's tool and reasoning parsers: a tool call, non-streaming and streaming, thinking on and off, "
            "parses into tool_calls with arguments matching the schema, no DSML tag leaks, a long argument arrives "
            "whole (a server not serving the recipe's model is forced to emit the raw text).",
            needs_server=True,
        ),
        Check(
            "spec_decode.acceptance",
            "spec_decode",
            True,
            sp.acceptance,
            "mean acceptance length 1 + accepted/drafts from /metrics counter deltas around a fixed chat workload, "
            "against the recipe's floor (validation.acceptance_length_min).",
            needs_server=True,
        ),
        Check(
            "spec_decode.per_position",
            "spec_decode",
            False,
            sp.per_position,
            "acceptance per draft position (accepted_i / drafts), which can only fall with the position.",
            needs_server=True,
        ),
    ]
    for c in opts.levels():
        checks.append(
            Check(
                f"sweep.concurrency_{c}",
                "sweep",
                True,
                sweep.level_check(c),
                f"`vllm bench serve` (random data set, fixed lengths and seed), {opts.requests_for(c)} requests at concurrency {c}: all complete; throughput, TTFT, TPOT (per output token) and ITL (gap between streamed chunks).",
                needs_server=True,
            )
        )
    checks.append(
        Check(
            "sweep.jit",
            "sweep",
            False,
            jit_check,
            "the server log: no kernel compile reported by vLLM's JIT monitor during the sweep (warn, "
            "with the kernel's name).",
            needs_server=True,
        )
    )
    checks.append(
        Check(
            "sweep.gsm8k",
            "sweep",
            True,
            gsm8k.gsm8k,
            "optional (--gsm8k): GSM8K 5-shot through lm-eval with block rejection, against validation.gsm8k_min.",
            needs_server=True,
        )
    )
    return checks


def _target(opts: ValidateOptions, plan) -> ServerTarget | None:
    custom = load_server_spec(opts.server_json, flag="--server-json") if opts.server_json else None
    if opts.endpoint and opts.launch:
        raise UsageError("--endpoint and --launch exclude each other: check a running server or start one, not both")
    if not opts.endpoint and not opts.launch:
        return None
    if custom is None:
        k = (plan.speculative_config or {}).get("num_speculative_tokens")
        host, port = parse_endpoint(opts.endpoint) if opts.endpoint else (plan.host, plan.port)
        host = loopback_host(host)
        return ServerTarget(
            plan.served_name,
            host,
            port,
            True,
            num_speculative_tokens=k,
            description=f"the recipe's plan ({plan.profile})",
        )
    if custom.served_name is None:  # every server check asks for this model by name
        raise UsageError(
            f"--server-json {opts.server_json}: validate needs served_name (the name the server lists in /v1/models)"
        )
    host, port = parse_endpoint(opts.endpoint) if opts.endpoint else (custom.host, custom.port)
    return ServerTarget(
        custom.served_name,
        host,
        port,
        custom.recipe_model,
        argv=custom.argv,
        env=dict(custom.env),
        num_speculative_tokens=custom.num_speculative_tokens,
        description=custom.description or f"server from {opts.server_json}",
        notes=_probe_only_keys(custom),
    )


def _probe_only_keys(spec) -> tuple[str, ...]:
    # One file can serve probe and validate; say so when keys only probe reads were given, never drop them silently.
    given = [key for key in ("deterministic_check", "prompts") if getattr(spec, key) is not None]
    if not given:
        return ()
    return (
        f"--server-json keys {', '.join(given)} are read by `probe` only: validate runs the recipe's "
        f"deterministic check (judged only with recipe_model true) and its own fixed workload",
    )


def _plan(selection_opts: dict, soft: dict | None = None):
    return plan_for(selection_opts, soft=soft)


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
    catalog, selection, plan = _plan(selection_opts, opts.gate_software)
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
    ctx.data["selection"] = selection
    ctx.data["state_dir"] = selection_opts.get("state_dir")
    if display is not None:  # rocm_dspark.runtime.progress.Display: the live wait of --launch
        ctx.data["display"] = display
    if target is not None:
        ctx.client = VllmClient(target.host, target.port)
    checks = build_checks(opts)
    started, t_start = datetime.now(UTC), time.monotonic()
    results: list[CheckResult] = []
    stopper: CheckResult | None = None
    try:
        for i, check in enumerate(checks, 1):
            if on_check:
                on_check(check.name, ctx)
            t0 = time.monotonic()
            if stopper is not None:
                outcome = Outcome(SKIPPED, f"not run: blocking check {stopper.name} failed")
            elif check.needs_server and target is None:
                outcome = Outcome(SKIPPED, NO_SERVER)
            else:
                if check.needs_server:
                    say(f"[{i:2d}/{len(checks)}] {check.name} ...")
                try:
                    outcome = check.run(ctx)
                except (UsageError, EnvironmentFailure) as exc:
                    outcome = Outcome(FAIL, str(exc))
                except Exception as exc:  # a broken check is reported as its own failure, never a crash
                    outcome = Outcome(FAIL, f"the check itself failed: {type(exc).__name__}: {exc}")
            result = CheckResult(
                check.name,
                check.category,
                outcome.status,
                check.blocking,
                outcome.message,
                outcome.value,
                outcome.threshold,
                outcome.evidence,
                round(time.monotonic() - t0, 3),
            )
            results.append(result)
            say(f"[{i:2d}/{len(checks)}] {check.name:<26} {_label(result.status):<7} {result.message}")
            if result.stops_run and stopper is None:
                stopper = result
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
    checks_out = [r.to_dict() for r in results]
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
        "server": (
            {
                "mode": "launch" if opts.launch else "endpoint",
                "base_url": target.base_url,
                "served_name": target.served_name,
                "recipe_model": target.recipe_model,
                "description": target.description,
                "stop": stop,
            }
            if target
            else {"mode": "none"}
        ),
        "options": {
            "quick": opts.quick,
            "concurrencies": list(opts.levels()),
            "requests_per_level": {c: opts.requests_for(c) for c in opts.levels()},
            "max_tokens": opts.output_tokens(),
            "request_timeout_s": opts.request_timeout_s,
            "gsm8k": opts.gsm8k,
        },
        "summary": report.summary(checks_out),
        "checks": checks_out,
        "measurements": {"acceptance": ctx.data.get("acceptance"), "sweep": ctx.data.get("sweep")},
        "notes": (list(target.notes) if target else [])
        + (
            [f"the launched server left processes behind: {stop['leftover_pids']}"]
            if stop and stop["leftover_pids"]
            else []
        ),
    }
    descriptions = {c.name: c.description for c in checks}
    report.write_report(Path(opts.report_dir), rep, descriptions, ctx.data)
    return rep


def _label(status: str) -> str:
    return {PASS: "PASS", FAIL: "FAIL", NOT_APPLICABLE: "n/a", SKIPPED: "skipped"}.get(status, status.upper())


def check_names(opts: ValidateOptions) -> list[str]:
    return [c.name for c in build_checks(opts)]
