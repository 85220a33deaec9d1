"""Step 10: what an operator needs after `up`: where to send requests, what runs, why, how fast, and the report."""

from __future__ import annotations

from rocm_dspark.runtime.mono_log import read_file


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
    b = s["build"]
    digest = b["digest"] or f"none ({b['digest_note'] or 'not pulled'})"
    tps = (
        ", ".join(f"{lv['output_tok_s']} tok/s at concurrency {lv['concurrency']}" for lv in s["throughput_tok_s"])
        or "not measured"
    )
    acc = f"{s['acceptance_length']:.3f}" if isinstance(s["acceptance_length"], (int, float)) else "not measured"
    lines = [
        "rocm-dspark up: summary",
        f"  endpoint      {s['endpoint']}  (model name {s['served_name']!r})",
        f"  profile       {s['profile']}",
        f"  build         vLLM {b['vllm']}, image {b['image'] or '-'}",
        f"  digest        {digest}",
        *([f"  ran           {s['ran']}"] if s.get("ran") else []),
        f"  service       {s['service']['mode']}"
        + (f" unit {s['service']['unit']}" if s["service"].get("unit") else "")
        + (f" pid {s['service']['pid']}" if s["service"].get("pid") else "")
        + "  (`rocm-dspark down` stops it)",
        f"  verification  {s['verification']['mode']}: {s['verification']['why']}",
        *([f"  mono decode   {s['mono_decode']}"] if s.get("mono_decode") else []),
        f"  throughput    {tps}",
        f"  acceptance    mean acceptance length {acc}",
        f"  validation    {(s['validation'] or 'not run').upper()}; report {s['report'] or '-'}",
        *(
            [
                f"  readiness     GET {s['readiness']} (200 when validated and serving; 503 while a load runs, while proving, or down)"
            ]
            if s.get("readiness")
            else []
        ),
        f"  probe         {s['probe']['gate'] or '-'}: {s['probe']['gate_reason'] or '-'} ({s['probe']['record'] or 'no record'})",
        f"  A/B           {s['ab'] or '-'}",
        f"  model loads   {len(s['loads'])} this run" + ("" if s["loads"] else " (the service already served)"),
        *[f"    {ld['n']}. {ld['command']:<8} {ld['seconds']:.0f} s  ({ld['why']})" + _cache(ld) for ld in s["loads"]],
    ]
    if not s["counts_for_gate"]:
        lines.append(f"  note          {s['note']}")
    return lines


def _cache(load: dict) -> str:
    """Time to ready and the compile cache, both read from the start (serve.load; the cache from vLLM's log)."""
    if load.get("ready_s") is None:
        return ""
    state = {"none": "nothing compiled", "reload": "read, but vLLM compiled again (its log says why)"}.get(
        load.get("cache") or "unknown", load.get("cache")
    )
    return f"; ready after {load['ready_s']:.0f} s, compile cache {state}"
