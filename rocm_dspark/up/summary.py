"""Step 10: what an operator needs after `up`: where to send requests, what runs, why, how fast, and the report."""

from __future__ import annotations

from rocm_dspark.runtime.actions import Action, Say, Write
from rocm_dspark.runtime.mono_log import read_file
from rocm_dspark.service import control
from rocm_dspark.up import canary, prove, serve
from rocm_dspark.up.steps_common import out_hash, write_json


def summary_inputs(run) -> dict:
    return {k: out_hash(run, k) for k in ("choose", "image", "start", "probe", "prove", "validate")}


def ready_if_validated(run) -> None:
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


def summary_run(run) -> dict:
    ready_if_validated(run)
    data = build_summary(run)
    write_json(run, "summary.json", data)
    for line in summary_lines(data) + canary.ensure_timer(run):
        run.display.say(line)
    return data


def summary_actions(run) -> list[Action]:
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
    if prove.skip(run):
        now = f"model loads: {start} (the service{'' if start else ': already serving'}); the prove step makes no adaptive start"
    else:
        now = (
            f"model loads: {start + 1} if adaptive verification is proven and pays at c={max(run.options.concurrency)} "
            f"(block service, then one adaptive start that is kept), {start + 2} if it is refuted or does not pay "
            "(back to block)"
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


def build_summary(run) -> dict:
    o = run.outputs
    choose, start = o.get("choose") or {}, o.get("start") or {}
    img, probe, prove, val = o.get("image") or {}, o.get("probe") or {}, o.get("prove") or {}, o.get("validate") or {}
    served = prove.get("service") or start
    ls = served.get("launch_state") or {}
    mode = ls.get("mode") or ("adaptive" if choose.get("adaptive") else "block")
    if ls.get("fell_back"):
        why = "the adaptive start failed and the launcher fell back (see its launch-state and adaptive.log): " + str(
            choose.get("verdict")
        )
    else:
        why = prove.get("decision") or choose.get("verdict") or ""
    plan = run.plan
    ran = None
    if choose.get("server_json"):  # local-cpu: what actually served, beside the recipe it stands in for
        which = served.get("command") or "block"
        spec = choose["server_json_adaptive" if which == "adaptive" else "server_json"]
        ran = f"installed vLLM {(o.get('detect') or {}).get('vllm')}: {spec['description']}"
        mode = f"{which}: ngram speculation, K={spec['num_speculative_tokens']} (the local-cpu {which} test server)"
        why = (
            (f"{prove['decision']}; " if prove.get("decision") else "")
            + f"the recipe's plan would run {'adaptive' if choose.get('adaptive') else 'block'} verification: {choose.get('verdict')}"
        )
    mono = read_file(served.get("log"))  # read now, after validation's decode steps: "... active" comes late
    return {
        "endpoint": served.get("base_url"),
        "loads": [{k: ld.get(k) for k in ("n", "command", "why", "seconds", "ready_s", "cache")} for ld in run.loads],
        "served_name": (choose.get("server_json") or {}).get("served_name") or plan.served_name,
        "profile": choose.get("profile"),
        "ran": ran,
        "build": {
            "vllm": choose.get("vllm_version"),
            "image": choose.get("image"),
            "digest": img.get("digest"),
            "digest_note": img.get("skipped") or img.get("note"),
        },
        "service": {
            "mode": choose.get("mode"),
            **({"unit": start["unit"]} if start.get("unit") else {}),
            **({"pid": served["pid"]} if served.get("pid") else {}),
        },
        "verification": {"mode": mode, "why": why},
        # a systemd unit's log is one start's: a flag the launcher dropped shows in its launch-state only
        "mono_decode": mono.text()
        if mono
        else (ls.get("monokernel") if str(ls.get("monokernel")).startswith("off") else None),
        "acceptance_length": val.get("acceptance_length"),
        "throughput_tok_s": val.get("throughput") or [],
        "report": val.get("report"),
        "validation": val.get("result"),
        "probe": {
            "record": prove.get("probe_record") or probe.get("record"),
            "gate": prove.get("gate") or probe.get("gate"),
            "gate_reason": prove.get("gate_reason") or probe.get("gate_reason"),
        },
        "ab": prove.get("skipped") or (prove.get("ab") or {}).get("verdict"),
        "readiness": (run.state.data.get("ready_server") or {}).get("url"),
        "counts_for_gate": choose.get("counts_for_gate", True),
        "note": choose.get("note"),
    }


def summary_lines(s: dict) -> list[str]:
    b, svc, p, loads = s["build"], s["service"], s["probe"], s["loads"]
    tps = ", ".join(f"{lv['output_tok_s']} tok/s at concurrency {lv['concurrency']}" for lv in s["throughput_tok_s"])
    acc = f"{s['acceptance_length']:.3f}" if isinstance(s["acceptance_length"], (int, float)) else "not measured"
    ready = "(200 when validated and serving; 503 while a load runs, while proving, or down)"
    rows = {
        "endpoint": f"{s['endpoint']}  (model name {s['served_name']!r})",
        "profile": s["profile"],
        "build": f"vLLM {b['vllm']}, image {b['image'] or '-'}",
        "digest": b["digest"] or f"none ({b['digest_note'] or 'not pulled'})",
        "ran": s.get("ran"),
        "service": f"{svc['mode']}"
        + (f" unit {svc['unit']}" if svc.get("unit") else "")
        + (f" pid {svc['pid']}" if svc.get("pid") else "")
        + "  (`rocm-dspark down` stops it)",
        "verification": f"{s['verification']['mode']}: {s['verification']['why']}",
        "mono decode": s.get("mono_decode"),
        "throughput": tps or "not measured",
        "acceptance": f"mean acceptance length {acc}",
        "validation": f"{(s['validation'] or 'not run').upper()}; report {s['report'] or '-'}",
        "readiness": s.get("readiness") and f"GET {s['readiness']} {ready}",
        "probe": f"{p['gate'] or '-'}: {p['gate_reason'] or '-'} ({p['record'] or 'no record'})",
        "A/B": s["ab"] or "-",
        "model loads": f"{len(loads)} this run" + ("" if loads else " (the service already served)"),
    }
    optional = ("ran", "mono decode", "readiness")  # a line only where there is something to say
    lines = ["rocm-dspark up: summary", *(f"  {k:<13} {v}" for k, v in rows.items() if v or k not in optional)]
    lines += [f"    {ld['n']}. {ld['command']:<8} {ld['seconds']:.0f} s  ({ld['why']})" + _cache(ld) for ld in loads]
    return lines + ([] if s["counts_for_gate"] else [f"  note          {s['note']}"])


def _cache(load: dict) -> str:
    """Time to ready and the compile cache, both read from the start (serve.load; the cache from vLLM's log)."""
    if load.get("ready_s") is None:
        return ""
    state = {"none": "nothing compiled", "reload": "read, but vLLM compiled again (its log says why)"}.get(
        load.get("cache") or "unknown", load.get("cache")
    )
    return f"; ready after {load['ready_s']:.0f} s, compile cache {state}"
