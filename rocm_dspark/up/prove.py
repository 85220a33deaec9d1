"""Step 8 of `up`: prove adaptive verification on the service itself, in as few model loads as the evidence needs
(docs/up.md, step 8): the running block service is the A/B's block arm; one adaptive start is the probe's live
level (attached to the service's own process, which probe.serving checks in /proc), the A/B's adaptive arm and,
proven and paying, the service, kept; else one restart back to block. Until the gate has decided, the service
is "proving": not ready, whatever vLLM's own /health says. `skip` says where no adaptive start can change what
serves (the payoff is usecase/verdict.judge's, read ahead of a proof).
"""

from __future__ import annotations

from rocm_dspark.errors import UsageError
from rocm_dspark.inputs import read_text
from rocm_dspark.probe import store
from rocm_dspark.probe.payoff import LOSES
from rocm_dspark.probe.record import RecordError, parse_record
from rocm_dspark.probe.run import run_probe
from rocm_dspark.recipe.plan import PROVEN, REFUTED
from rocm_dspark.runtime.actions import Say
from rocm_dspark.service import control
from rocm_dspark.service.canary import hold
from rocm_dspark.up import choice, serve
from rocm_dspark.up.steps_common import StepFailed, out_hash
from rocm_dspark.usecase.verdict import judge
from rocm_dspark.validate.ab import AB_BENCH_DIR, default_requests, measure, write_ab_record
from rocm_dspark.validate.sweep import bench_setup, input_len


def skip(run) -> str | None:
    """Why no adaptive start is made (None: one is made, at the largest --concurrency)."""
    if held := hold(run.state, out_hash(run, "probe")):
        return f"skipped: {held}"
    if "adaptive" not in serve.command_plans(run):
        return "skipped: the plan has no adaptive command to prove (--adaptive off, or the build does not allow it)"
    if serve.serving_command(run) == "adaptive":
        why = (run.outputs.get("choose") or {}).get("verdict")
        return f"skipped: the gate already chose adaptive verification ({why})"
    got = judged(run, ahead=run.target.counts_for_gate)  # local-cpu: its A/B decides, not the recipe's
    if got.verdict.outcome == REFUTED:
        return (
            f"skipped: the levels that load no model refute adaptive verification here ({got.verdict.reason}), "
            "so no adaptive start is made"
        )
    if not run.options.concurrency:
        return (
            "skipped: no workload declared: without --concurrency C the gate cannot say adaptive verification pays, "
            "so block verification serves (pass --concurrency C to prove it and A/B it on the service)"
        )
    if (pay := got.payoff) is not None and pay.state == LOSES:
        c = max(run.options.concurrency)
        return f"skipped: the gate says adaptive verification does not pay at c={c} ({pay.evidence}): {pay.text}"
    return None


def prove_inputs(run) -> dict:
    return {
        "probe": out_hash(run, "probe"),
        "concurrency": run.options.concurrency,
        "serving": serve.serving_command(run),
    }


def prove_actions(run) -> list:
    c = max(run.options.concurrency)  # not skipped: --concurrency was given
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


def prove_run(run) -> dict:
    plans, c = serve.command_plans(run), max(run.options.concurrency)  # not skipped: --concurrency was given
    workload = {
        "concurrency": c,
        "requests": default_requests(c),
        "input_len": input_len(run.options.quick),
        "max_tokens": run.target.ab_max_tokens,
    }
    started = store.utc_now()
    out_dir = (run.dir / AB_BENCH_DIR / store.iso(started).replace(":", "")).absolute()  # not a validate report
    arms = {}

    def arm(which: str) -> dict:
        srv = control.attach(run.state.service)
        plan = plans[which]
        # bench from the vLLM that serves, as the validate step's sweep runs it (in the image in container modes)
        prefix, tokenizer = bench_setup(
            plan.argv, plan, python=None, container=serve.bench_container(run), result_dir=out_dir
        )
        stats = measure(
            srv,
            plan.served_name,
            which,
            prefix=prefix,
            tokenizer=tokenizer,
            **workload,
            timeout_s=run.options.request_timeout_s,
            out_dir=out_dir,
            say=lambda line: run.display.say(f"  {line}"),
        )
        return {"argv": [str(a) for a in plan.argv], "description": run.target.describe_arm(run, which), **stats}

    run.display.say(f"  A/B block arm at c={c}: measured on the running block service (no load)")
    arms["block"] = arm("block")
    run.display.say(
        "  starting the adaptive command: the probe's live level, the A/B's adaptive arm, and the service if the "
        "gate says proven and paying"
    )
    try:
        started_out = serve.load(run, "adaptive", "prove: live level and the A/B's adaptive arm", phase="proving")
    except StepFailed as exc:
        return _back_to_block(run, {"arms": arms}, f"the adaptive command did not start ({exc.message})")
    out: dict = {"concurrency": c, "adaptive_start": started_out}
    if (started_out.get("launch_state") or {}).get("fell_back"):
        validating(run, "block", "the adaptive start fell back")
        return {
            **out,
            "decision": "refuted: the adaptive command did not start; the launcher fell back to block",
            "serving": "block",
            "service": started_out,
        }
    live = _live(run)
    out.update(probe_record=str(live.path), gate=live.gate_state, gate_reason=live.gate_reason)
    level = live.record.level("live")
    out["live"] = {"passed": level.passed, "reason": level.reason, "note": level.gating_note}
    run.display.say(f"  live: {'PASS' if level.passed else 'FAIL'}; {level.gating_note}")
    if not level.passed:
        return _back_to_block(run, out, f"refuted: the live level failed: {level.reason}")
    run.display.say(f"  A/B adaptive arm at c={c}: measured on the same start")
    arms["adaptive"] = arm("adaptive")
    record = write_ab_record(
        catalog=run.catalog,
        selection=run.selection,
        plan=plans["adaptive"],
        arms=arms,
        started=started,
        **workload,
        override=run.target.ab_override(arms),
        state_dir=run.options.state_dir,
        report_dir=None,
        say=lambda line: run.display.say(f"  {line}"),
    )
    out["ab"] = {"record": record["id"], "verdict": record["verdict"]["text"], "bench": str(out_dir)}
    run.display.say(f"  {record['verdict']['text']}")
    verdict = run.target.decide(run, live, record)
    why = out["decision"] = f"{verdict.outcome}: {verdict.reason}"
    if verdict.outcome != PROVEN:
        return _back_to_block(run, out, why)
    run.display.say(f"  kept: the adaptive start serves ({why})")
    validating(run, "adaptive", f"kept: {why}")
    return {**out, "serving": "adaptive", "service": started_out}


def _back_to_block(run, out: dict, why: str) -> dict:
    run.display.say(f"  {why}: starting block verification again")
    back = serve.load(run, "block", f"back to block: {why}")
    validating(run, "block", why)
    return {**out, "decision": why, "serving": "block", "service": back}


def validating(run, which: str, why: str) -> None:
    """The gate has decided: `which` serves for good, not ready until the validate step passes on it."""
    run.state.set_readiness(False, "validating", f"{which} verification serves ({why}); not ready until validated")


def _live(run):
    """The live level on the adaptive start, carried into one record with the levels run before the first load."""
    target = run.target.live_target(run)
    earlier_path = (run.outputs.get("probe") or {}).get("record")
    try:  # the record this `up` wrote before the first load, read as strictly as the gate reads it
        earlier = parse_record(read_text(earlier_path, "probe record")) if earlier_path else None
    except RecordError as exc:
        raise UsageError(f"probe record {earlier_path}, from this `up`'s probe step: {exc}") from None
    return run_probe(
        run.catalog,
        run.selection,
        levels=("live",),
        state_dir=run.options.state_dir,
        live_target=target,
        attach_server=control.attach(run.state.service),
        earlier=earlier,
        soft=choice.gate_software(run),
        progress=lambda m: run.display.say(f"  [probe] {m}"),
        kernel_python=run.options.kernel_python,
    )


def judged(run, *, ahead: bool = False):
    """The verdict (usecase.verdict) for `up`'s plan at its largest --concurrency, on the software that serves."""
    c = max(run.options.concurrency) if run.options.concurrency else None
    return judge(
        run.catalog,
        run.plan,
        state_dir=run.options.state_dir,
        concurrency=c,
        soft=choice.gate_software(run),
        ahead=ahead,
    )
