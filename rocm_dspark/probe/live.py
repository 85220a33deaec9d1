"""Level `live`: start vLLM with the adaptive argv, wait until it serves, ask it, read /metrics, stop it.

What passes and what counts: docs/probe.md's level table. The command is the plan's own (resolve() with adaptive
verification forced on), started by the one process manager (rocm_dspark.runtime.process.VllmServer); its greedy
tokens are re-scored (rocm_dspark.probe.rescore) and its `vllm:spec_decode_*` counters read with the real
Prometheus parser. A refusal (vLLM's exact line), a crash or a timeout fails the level with that reason.

A `--server-json FILE` (rocm_dspark.runtime.server_spec, as `validate --server-json`) replaces the plan's command
where the plan cannot run (this CPU-only build box): it is recorded as `live_override` and never counts. Its own
`deterministic_check` and `prompts` replace the defaults, and the recipe's check applies only with `recipe_model:
true`. A server already up (`up` probes the one it started) counts only when /proc shows it is the plan's own
adaptive command before and after the requests (rocm_dspark.probe.serving).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import NamedTuple

from rocm_dspark.errors import EnvironmentFailure, UsageError
from rocm_dspark.probe import rescore, serving
from rocm_dspark.probe.record import LevelResult
from rocm_dspark.probe.store import iso, utc_now
from rocm_dspark.recipe.plan import Command
from rocm_dspark.runtime.metrics import spec_decode_counters
from rocm_dspark.runtime.process import VllmServer, listening
from rocm_dspark.runtime.readiness import wait_ready

DEFAULT_PROMPTS = ("def fibonacci(n):", "The three primary colours are")
GREEDY_MAX_TOKENS = 32
WAIT_STEP_S = 10.0  # progress line interval while waiting for readiness


class LiveTarget(NamedTuple):
    argv: tuple[str, ...]
    env: dict
    host: str
    port: int
    served_name: str | None
    adaptive: bool | None  # enable_adaptive_verification in its --speculative-config (None: none found)
    source: str  # "plan" | "command-file" (a --server-json file) | "attached"
    deterministic_check: dict | None
    prompts: tuple[str, ...]
    detail: str = ""  # the --server-json file's path
    capture_size: int | None = None  # largest captured graph size (0: none; None: not known)
    max_num_batched_tokens: int | None = None  # None: not known


def int_flag(argv, dest: str) -> int | None:
    """vLLM `dest` of an argv as a whole number (None: not given, or not digits); read by Command.from_words."""
    value = Command.from_words(argv).value(dest)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def capture_of(argv, capture_size: int | None = None) -> int | None:
    """The largest captured graph size a command runs with: 0 under --enforce-eager (no graphs), else
    --max-cudagraph-capture-size or `capture_size`, else None (not known)."""
    if Command.from_words(argv).bool_flag("enforce_eager"):
        return 0
    return int_flag(argv, "max_cudagraph_capture_size") or capture_size or None


def _adaptive_in(argv) -> bool | None:
    spec = Command.from_words(argv).spec_config()
    return None if spec is None else bool(spec.get("enable_adaptive_verification", False))


def target_from_plan(plan, model) -> LiveTarget:
    return LiveTarget(
        tuple(plan.argv),
        dict(plan.env),
        plan.host,
        plan.port,
        plan.served_name,
        plan.adaptive_verification,
        "plan",
        model.validation.get("deterministic_check"),
        DEFAULT_PROMPTS,
        capture_size=capture_of(plan.argv, plan.capture_size),
        max_num_batched_tokens=plan.max_num_batched_tokens or None,
    )


def target_from_spec(spec, model) -> LiveTarget:
    """A LiveTarget from a checked ServerSpec (rocm_dspark.runtime.server_spec.load_server_spec)."""
    check = spec.deterministic_check
    if check is None and spec.recipe_model:  # the recipe's answer only judges the recipe's own model
        check = model.validation.get("deterministic_check")
    prompts = spec.prompts if spec.prompts is not None else DEFAULT_PROMPTS
    return LiveTarget(
        tuple(spec.argv),
        dict(spec.env),
        spec.host,
        spec.port,
        spec.served_name,
        _adaptive_in(spec.argv),
        "command-file",
        check,
        prompts,
        str(spec.path) if spec.path else "",
        capture_of(spec.argv),
        int_flag(spec.argv, "max_num_batched_tokens"),
    )


# --- judging (pure: testable on recorded vLLM outputs) ---------------------------------------------


def counters_evidence(before_text: str, after_text: str, model_name: str | None) -> dict:
    """Spec-decode counters before/after and their difference, from two /metrics texts."""
    before = spec_decode_counters(before_text, model_name)
    after = spec_decode_counters(after_text, model_name)
    delta = after - before
    return {
        "spec_decode": delta.spec_decode,
        "before": dataclasses.asdict(before),
        "after": dataclasses.asdict(after),
        "delta": dataclasses.asdict(delta),
        "acceptance_length": delta.mean_acceptance_length,
        "summary": delta.summary(),
    }


def assess(ev: dict) -> list[str]:
    """What is wrong with a ready server's answers and counters ([] = the level passes)."""
    problems = []
    det = ev.get("deterministic_check")
    if det is not None and not det.get("passed"):
        problems.append(
            f"deterministic check: asked {det['prompt']!r}, expected {det['expect']!r} in the answer, "
            f"got {det.get('answer')!r}"
        )
    for g in ev.get("greedy", []):
        if g["first"] != g["second"]:
            problems.append(
                f"greedy prompt {g['prompt']!r} gave two different answers: {g['first']!r} vs {g['second']!r}"
            )
        elif not g["first"].strip():
            problems.append(f"greedy prompt {g['prompt']!r} gave an empty answer")
    rs = ev.get("rescore")
    if rs is None:
        problems.append("the outputs were not re-scored")
    elif not rs.get("proven"):
        problems.append(f"token re-scoring: {rs.get('why')}")
    m = ev.get("metrics")
    if m is None:
        problems.append("no spec-decode counters were read")
    elif not m["spec_decode"]:
        problems.append("the server exports no vllm:spec_decode_* counters: it is not speculating")
    elif m["delta"]["num_drafts"] <= 0:
        problems.append("no speculative drafts were counted during the requests")
    if ev.get("alive_after") is False:
        problems.append("the server died during the requests")
    return problems


# --- running ---------------------------------------------------------------------------------------


def _wait(srv, deadline_s: float, progress):
    """The server's readiness wait (rocm_dspark.runtime.readiness), a progress line every WAIT_STEP_S seconds."""
    from rocm_dspark.runtime.server_phases import phase_of

    check, due = srv.ready_check(), [WAIT_STEP_S]

    def heartbeat(elapsed: float) -> None:
        if elapsed >= due[0]:
            due[0] = elapsed + WAIT_STEP_S
            progress(
                f"live: waiting for {srv.base_url}/health: {elapsed:.0f} s of {deadline_s:g} s, "
                f"{phase_of(srv.log_text()).text()} (last: {check.last_error or 'no answer yet'})"
            )

    ready = wait_ready(check, deadline_s, on_miss=heartbeat)
    return dataclasses.replace(ready, elapsed_s=round(ready.elapsed_s, 3))


def _exercise(srv, target: LiveTarget, ev: dict, progress) -> None:
    """Requests and counters against a ready server, into `ev` (raises ServerError/UsageError)."""
    client = srv.client
    version = client.get("/version", timeout_s=30)
    if version.status == 200:
        try:
            ev["server_version"] = version.json().get("version")
        except (ValueError, AttributeError):
            ev["server_version"] = None
    model = target.served_name or client.models()[0]
    ev["served_name"] = model
    before = client.metrics_text()
    check = target.deterministic_check
    if check is not None:
        progress(f"live: deterministic check {check['prompt']!r}")
        extra = {"chat_template_kwargs": check["chat_template_kwargs"]} if check.get("chat_template_kwargs") else {}
        reply = client.chat(
            check["prompt"], max_tokens=int(check.get("max_tokens", 16)), model=model, temperature=0.0, **extra
        )
        answer = reply["choices"][0]["message"].get("content") or ""
        ev["deterministic_check"] = {
            "prompt": check["prompt"],
            "expect": check["expect"],
            "answer": answer,
            "passed": check["expect"] in answer,
        }
    ev["greedy"] = []
    for prompt in target.prompts:
        progress(f"live: greedy prompt {prompt!r} twice")
        texts = [
            client.complete(prompt, max_tokens=GREEDY_MAX_TOKENS, model=model, temperature=0.0)["choices"][0]["text"]
            for _ in range(2)
        ]
        ev["greedy"].append({"prompt": prompt, "first": texts[0], "second": texts[1]})
    spec = Command.from_words(target.argv).spec_config() or {}
    k = spec.get("num_speculative_tokens") if isinstance(spec.get("num_speculative_tokens"), int) else None
    start = client.metrics_text()

    def drafts_counted():
        delta = counters_evidence(start, client.metrics_text(), model)["delta"]
        return {key: delta[key] for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}

    capture = target.capture_size if target.capture_size is not None else capture_of(target.argv)
    ev["rescore"] = rescore.rescore(
        client,
        model,
        k=k,
        counters_delta=drafts_counted,
        progress=progress,
        capture_size=capture,
        max_num_batched_tokens=target.max_num_batched_tokens or int_flag(target.argv, "max_num_batched_tokens"),
    )
    progress(f"live: token re-scoring: {ev['rescore']['why']}")
    ev["token_correct"] = bool(ev["rescore"]["proven"])
    ev["reference_independent"] = bool(ev["rescore"]["reference_independent"])
    ev["reference_unreliable"] = ev["rescore"]["status"] == "reference-unreliable"
    ev["metrics"] = counters_evidence(before, client.metrics_text(), model)
    ev["alive_after"] = srv.returncode() is None


def run_live(
    target: LiveTarget, *, deadline_s: float, log_path: str | Path | None = None, progress=lambda msg: None, server=None
) -> LevelResult:
    """Run the level. `server`: a VllmServer that is already started (attached: not started or stopped here;
    valid for gating only when /proc shows it is the target's own command, rocm_dspark.probe.serving)."""
    started, t0 = utc_now(), time.monotonic()
    attached = server is not None
    ev: dict = {
        "source": target.source,
        "command_file": target.detail or None,
        "argv": list(target.argv),
        "env": dict(target.env),
        "adaptive_verification": target.adaptive,
        "attached": attached,
        "ready": False,
        "log_path": str(log_path) if log_path else None,
    }
    srv = server
    if srv is None and not listening(target.host, target.port):  # else _start_and_check says what listens
        srv = VllmServer(list(target.argv), dict(target.env), host=target.host, port=target.port, log_path=log_path)
    try:
        passed, reason = _start_and_check(srv, target, ev, deadline_s, progress)
    finally:
        if srv is not None and not attached and srv.proc is not None:
            stop = srv.stop()  # also on Ctrl-C: never leave a half-started vLLM behind
            ev["stop"] = {
                "exit_code": stop.exit_code,
                "killed": stop.killed,
                "elapsed_s": round(stop.elapsed_s, 3),
                "leftover_pids": list(stop.leftover),
            }
        if srv is not None:
            ev["log_tail"] = srv.log_tail(40)
    return _result(started, t0, passed, target, attached, reason, ev)


def _start_and_check(srv, target: LiveTarget, ev: dict, deadline_s: float, progress) -> tuple[bool, str]:
    if srv is None:
        return False, (
            f"something already listens on {target.host}:{target.port}: stop it or probe on another port (--port)"
        )
    if not ev["attached"]:
        progress(f"live: starting {' '.join(target.argv[:3])} ... (log: {srv.log_path})")
        ev["log_path"] = str(srv.log_path)
        try:
            srv.start()
        except UsageError as exc:  # e.g. the program is not on PATH
            return False, str(exc)
    ready = _wait(srv, deadline_s, progress)
    ev["readiness"] = {
        key: getattr(ready, key) for key in ("status", "elapsed_s", "exit_code", "refusal", "last_error")
    }
    if not ready.ready:
        if ready.refusal:
            ev["refusal"] = ready.refusal
            return (
                False,
                f"vLLM refused to start: {ready.refusal} (exit status {ready.exit_code} after {ready.elapsed_s:.1f} s)",
            )
        return False, ready.reason()
    ev["ready"] = True
    progress(f"live: {ready.reason()}")
    whose = "the plan's" if target.source == "plan" else f"the {target.source}'s"
    if ev["attached"]:
        ev["serving_process"] = serving.identify(target.argv, target.env, target.port, whose)
        progress(f"live: the server on port {target.port}: {ev['serving_process']['why']}")
    try:
        _exercise(srv, target, ev, progress)
        if ev["attached"]:
            after = serving.still_serving(ev["serving_process"], target.argv, target.env, target.port, whose)
            ev["serving_process_after"] = after
            ev["command_verified"] = bool(ev["serving_process"]["verified"] and after["verified"])
    except (EnvironmentFailure, UsageError, KeyError, IndexError, TypeError, ValueError) as exc:
        # ServerError (transport/HTTP), counters that went backwards, unparsable /metrics or JSON
        if not isinstance(exc, (EnvironmentFailure, UsageError)):
            exc = f"unexpected response from the server ({type(exc).__name__}: {exc})"
        code = srv.returncode()
        refusal = srv.refusal() if code is not None else None
        died = (
            f"; the server exited with status {code}" + (f": {refusal}" if refusal else "") if code is not None else ""
        )
        return False, f"{exc}{died}"
    problems = assess(ev)
    # A reference the drafter may have reached refutes nothing: the level then does not count (gate: incomplete).
    ev["reference_only"] = bool(ev.get("reference_unreliable")) and len(problems) == 1
    if problems:
        return False, "; ".join(problems)
    return True, (
        f"ready after {ready.elapsed_s:.1f} s; "
        + ("deterministic check passed; " if ev.get("deterministic_check") else "")
        + f"{len(ev['greedy'])} greedy prompt(s) stable; token re-scoring: {ev['rescore']['why']}; "
        + f"{ev['metrics']['summary']}"
    )


def _result(started, t0, passed: bool, target: LiveTarget, attached: bool, reason: str, ev: dict) -> LevelResult:
    valid, note = _gating(passed, target, attached, ev)
    return LevelResult("live", passed, valid, reason, note, iso(started), round(time.monotonic() - t0, 3), ev)


def _gating(passed: bool, target: LiveTarget, attached: bool, ev: dict) -> tuple[bool, str]:
    if target.source != "plan":
        return False, f"not valid for gating: ran the command in {target.detail}, not the plan's"
    if not target.adaptive:
        return False, "not valid for gating: the command does not enable adaptive verification"
    if not passed and ev.get("reference_only"):
        return False, f"not valid for gating: {ev['rescore']['why']}; to change: {ev['rescore']['fix']}"
    if attached and not ev.get("command_verified"):
        shown = (ev.get("serving_process_after") or ev.get("serving_process") or {}).get("why")
        return False, "not valid for gating: attached to a server not shown to run the plan's command" + (
            f" ({shown})" if shown else ""
        )
    if attached:
        return True, (
            "valid for gating: the server on the plan's port is the plan's own command with "
            "enable_adaptive_verification on (checked in /proc before and after the requests)"
        )
    return True, "valid for gating: the plan's own command with enable_adaptive_verification on"
