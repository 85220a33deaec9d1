"""Step 8 of `up`: prove adaptive verification on the service itself, in as few model loads as the evidence needs.

The block service that the start step brought up is the A/B's block arm: it is measured where it runs, before
anything stops. Then one adaptive start (one load) is at once the probe's live level (attached to the service's
own process, which probe.serving checks in /proc), the A/B's adaptive arm and, when the gate then says proven
and paying, the service itself: it is kept. A refutation, or "does not pay", costs one restart back to block.
Until the gate has decided, the service is "proving": the state's readiness says not ready (`rocm-dspark status
--ready` exits 1), whatever vLLM's own /health says.

No adaptive start is made where it cannot change what serves: no adaptive command, the gate already chose it,
the levels that load no model refuted it, no --concurrency (the gate cannot say "pays" without a workload), or
the verdict's payoff half (A/B records, this host's calibration, the public prediction: usecase/verdict.judge,
read ahead of a proof) says it loses at that concurrency.
"""

from __future__ import annotations

from rocm_dspark.errors import UsageError
from rocm_dspark.inputs import read_text
from rocm_dspark.probe.payoff import LOSES
from rocm_dspark.recipe.plan import PROVEN, REFUTED
from rocm_dspark.service import control
from rocm_dspark.up import choice, serve
from rocm_dspark.up.steps_common import StepFailed, out_hash


def decision(run) -> tuple[str | None, int | None]:
    """(why no adaptive start is made, or None to make one; the concurrency the A/B runs at)."""
    from rocm_dspark.service.canary import hold

    plans = serve.command_plans(run)
    if held := hold(run.state, out_hash(run, "probe")):
        return f"skipped: {held}", None
    if "adaptive" not in plans:
        return (
            "skipped: the plan has no adaptive command to prove (--adaptive off, or the build does not allow it)",
            None,
        )
    if serve.serving_command(run) == "adaptive":
        return (
            f"skipped: the gate already chose adaptive verification ({(run.outputs.get('choose') or {}).get('verdict')})",
            None,
        )
    c = max(run.options.concurrency) if run.options.concurrency else None
    got = judged(run, ahead=run.target.counts_for_gate)  # local-cpu: its A/B decides, not the recipe's
    if got.verdict.outcome == REFUTED:
        return (
            f"skipped: the levels that load no model refute adaptive verification here ({got.verdict.reason}), "
            f"so no adaptive start is made"
        ), None
    if c is None:
        return (
            "skipped: no workload declared: without --concurrency C the gate cannot say adaptive verification pays, "
            "so block verification serves (pass --concurrency C to prove it and A/B it on the service)"
        ), None
    if (pay := got.payoff) is not None and pay.state == LOSES:
        return f"skipped: the gate says adaptive verification does not pay at c={c} ({pay.evidence}): {pay.text}", c
    return None, c


def loads_forecast(run) -> tuple[str, int | None]:
    """(what the prove step costs in loads, in words; the concurrency) for --dry-run."""
    why, c = decision(run)
    if why:
        return why, c
    return (
        f"one adaptive start at c={c}: kept if the gate says proven and paying, else one more start back to block"
    ), c


def prove_run(run) -> dict:
    why, c = decision(run)
    if why:
        run.display.say(f"  {why}")
        return {"skipped": why}
    from rocm_dspark.probe import store
    from rocm_dspark.up.serve import bench_container
    from rocm_dspark.validate.ab import AB_BENCH_DIR, default_requests, measure, write_ab_record
    from rocm_dspark.validate.sweep import bench_setup, input_len

    plans = serve.command_plans(run)
    requests = default_requests(c)
    max_tokens = run.target.ab_max_tokens
    started = store.utc_now()
    out_dir = (run.dir / AB_BENCH_DIR / store.iso(started).replace(":", "")).absolute()  # not a validate report
    arms = {}

    def arm(which: str) -> dict:
        srv = control.attach(run.state.service)
        plan = plans[which]
        # bench from the vLLM that serves, as the validate step's sweep runs it (in the image in container modes)
        prefix, tokenizer = bench_setup(
            plan.argv, plan, python=None, container=bench_container(run), result_dir=out_dir
        )
        stats = measure(
            srv,
            plan.served_name,
            which,
            prefix=prefix,
            tokenizer=tokenizer,
            concurrency=c,
            requests=requests,
            input_len=input_len(run.target.quick(run.options)),
            max_tokens=max_tokens,
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
    override = run.target.ab_override(arms)
    record = write_ab_record(
        catalog=run.catalog,
        selection=run.selection,
        plan=plans["adaptive"],
        concurrency=c,
        arms=arms,
        started=started,
        requests=requests,
        input_len=input_len(run.target.quick(run.options)),
        max_tokens=max_tokens,
        override=override,
        state_dir=run.options.state_dir,
        report_dir=None,
        say=lambda line: run.display.say(f"  {line}"),
    )
    out["ab"] = {"record": record["id"], "verdict": record["verdict"]["text"], "bench": str(out_dir)}
    run.display.say(f"  {record['verdict']['text']}")
    verdict = decide(run, live, record, c)
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
    from rocm_dspark.probe.record import RecordError, parse_record
    from rocm_dspark.probe.run import run_probe

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
    from rocm_dspark.usecase.verdict import judge

    c = max(run.options.concurrency) if run.options.concurrency else None
    return judge(
        run.catalog,
        run.plan,
        state_dir=run.options.state_dir,
        concurrency=c,
        soft=choice.gate_software(run),
        ahead=ahead,
    )


def decide(run, live, record: dict, c: int):
    """Keep the adaptive start? The target's verdict on the records just written (up/target.py)."""
    return run.target.decide(run, live, record)
