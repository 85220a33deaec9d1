"""`rocm-dspark down` and `status`: stop the service `up` left, and say what it is, from the state file."""

from __future__ import annotations

from pathlib import Path

from rocm_dspark.service import canary, control
from rocm_dspark.service.readiness import answer
from rocm_dspark.service.state import UpState, up_dir


def down(state_dir, display, purge_cache: bool = False) -> int:
    """Stop what `up` started; purge_cache: then remove its compile cache (not after a failed stop: a server may
    still write there)."""
    state = UpState.load(up_dir(state_dir))
    code = _stop(state, display)
    if purge_cache and code == 0:
        from rocm_dspark.launch.compile_cache import purge

        root = _cache_root(state_dir, state.service)
        removed, left = purge(root)
        display.say(f"removed the compile cache {root} ({removed / 2**20:.0f} MB)" + (f"; {left}" if left else ""))
        return 1 if left else 0
    return code


def _cache_root(state_dir, svc) -> Path:
    """serve.cache_root's rule, from the name, never a path read from the state file (--purge-cache removes it)."""
    if (svc or {}).get("kind") == "systemd" and svc.get("unit"):
        from rocm_dspark.launch.compile_cache import UNIT_ROOT
        from rocm_dspark.launch.launchers import check_name

        return Path(UNIT_ROOT) / check_name(Path(str(svc["unit"])).stem)
    return up_dir(state_dir) / "compile-cache"


def _compile_cache(state_dir, svc) -> dict:
    """The compile cache's size per key, and the key the service's launcher used (its launch-state)."""
    from rocm_dspark.launch import launch_state
    from rocm_dspark.launch.compile_cache import usage

    ls_dir = (
        Path(svc["log"]).parent
        if (svc or {}).get("kind") == "systemd" and svc.get("log")
        else up_dir(state_dir) / "launch-state" / str((svc or {}).get("command"))
    )
    ls = launch_state.read(ls_dir)
    return {**usage(_cache_root(state_dir, svc)), "key": ls.get("cache_key"), "used": bool(ls.get("cache_dir"))}


def _jit(svc) -> dict | None:
    """What vLLM's JIT monitor reported in the service's log (runtime/server_phases.jit_report), with the log's
    path; None without a log. Read bounded: the head (the monitor's activation) and the last 48 MiB."""
    from rocm_dspark.runtime.server_phases import jit_report

    path = (svc or {}).get("log")
    if not path:
        return None
    head, tail = 8 << 20, 48 << 20
    try:
        with open(path, "rb") as f:
            data = f.read(head + tail + 1)
            if len(data) > head + tail:
                f.seek(-tail, 2)
                data = data[:head] + b"\n" + f.read(tail)
    except OSError as exc:
        return {"log": path, "error": exc.strerror or str(exc)}
    return {"log": path, **jit_report(data.decode("utf-8", "replace"))}


def _stop(state: UpState, display) -> int:
    svc = state.service
    if rec := state.data.get("ready_server"):  # it would only answer 503 "stopped"; `down` stops all `up` started
        control.stop_ready_server(state)
        display.say(f"stopped the readiness server ({_what(rec)}, {rec.get('url')})")
    if not state.exists or not svc:
        display.say(f"nothing to stop: no service recorded in {state.path}")
        return 0
    if not control.alive(svc) and svc.get("kind") != "systemd":
        display.say(f"the service (pid {svc.get('pid')}) is not running; records kept in {state.path.parent}")
        return 0
    res = control.stop_recorded(state)
    if res.get("stopped") and not res.get("leftover_pids"):
        display.say(f"stopped {_what(svc)}; records kept in {state.path.parent} (`rocm-dspark up` starts it again)")
        return 0
    display.say(f"rocm-dspark down: could not stop {_what(svc)} cleanly: {res}")
    return 1


def _what(rec: dict) -> str:
    return rec.get("unit") or f"pid {rec.get('pid')}"


def status(state_dir, steps, sizes: bool = True) -> dict:
    """steps: (name, title) of each step of `up`, in order; sizes: walk the compile cache for its size (not for
    `status --ready`, which a load balancer polls)."""
    state = UpState.load(up_dir(state_dir))
    svc = state.service
    running = control.alive(svc)
    health = control.vllm_health(svc) if running and svc else None
    fields = ("status", "at", "message", "fix", "seconds")
    rows = [(name, title, state.step(name) or {"status": "not run"}) for name, title in steps]
    steps = [{"name": n, "title": t, **{k: v for k, v in rec.items() if k in fields}} for n, t, rec in rows]
    bands = (state.output("launchers") or {}).get("bands") or {}
    return {
        "ready_server": state.data.get("ready_server"),
        "state_file": str(state.path),
        "exists": state.exists,
        "steps": steps,
        "service": {**(svc or {}), "running": running, "health": health} if svc else None,
        "readiness": answer(state, running, health),  # the one answer: `status --ready` and GET /ready
        "loads": state.data.get("loads", []),
        "summary": state.output("summary"),
        "compile_cache": _compile_cache(state_dir, svc) if sizes else None,
        "jit": _jit(svc) if sizes and svc else None,
        "mode_changes": state.data.get("mode_changes", []),
        "bands": bands,
        "watch": canary.status_lines(state_dir, state.data, bands) if state.exists else [],
    }


def _jit_lines(jit: dict | None) -> list[str]:
    """vLLM's JIT monitor since ready, in one line: a compile there is a latency spike in traffic."""
    if not jit:
        return []
    if jit.get("error"):
        return [f"JIT monitor: cannot read the server log {jit['log']}: {jit['error']}"]
    if jit["mode"] is None:
        return [
            "JIT monitor: not active in this server (vLLM turns it on after its own JIT warm-up on a GPU; "
            "--enforce-eager, kernel_config.enable_jit_warmup=false and vLLM's CPU build leave it off)"
        ]
    warm = f"{len(jit['warm_up'])} during the warm-up before ready"
    if not jit["ready"]:
        return [f"JIT monitor (mode={jit['mode']}): not ready yet; {warm}"]
    kernels = sorted({f"{e['backend']} {e['kernel']}" for e in jit["serving"]})
    return [
        f"JIT monitor (mode={jit['mode']}): {len(jit['serving'])} compile(s) while serving since ready"
        + (f" ({', '.join(kernels)}: each a latency spike)" if kernels else "")
        + f"; {warm}"
    ]


def status_lines(st: dict) -> list[str]:
    if not st["exists"]:
        return [f"no `up` state in {st['state_file']}: run `rocm-dspark up`"]
    lines = [f"state: {st['state_file']}"]
    for i, s in enumerate(st["steps"], 1):
        extra = f"  {s.get('message')}" if s.get("message") else ""
        fix = f" (fix: {s['fix']})" if s.get("fix") else ""
        lines.append(f"  [{i:2d}] {s['name']:<10} {s['status']:<12} {s.get('at', '')}{extra}{fix}")
    svc = st["service"]
    if svc is None:
        lines.append("service: none recorded")
    else:
        state = ("proving" if st["readiness"]["phase"] == "proving" else "running") if svc["running"] else "stopped"
        health = f", /health {svc['health']}" if svc["running"] else ""
        lines.append(
            f"service: {state} ({svc.get('kind')} {_what(svc)}) at {svc.get('base_url')}{health}"
            + (f"; log {svc['log']}" if svc.get("log") else "")
        )
    if loads := st.get("loads"):
        last = [ld for ld in loads if ld.get("run") == loads[-1].get("run")]
        lines.append(
            f"model loads: {len(last)} in the last run that loaded ("
            + ", ".join(f"{ld['command']} {ld.get('seconds', 0):.0f} s" for ld in last)
            + ")"
        )
    cc = st.get("compile_cache")
    if cc and (cc["keys"] or cc["key"]):
        lines.append(
            f"compile cache: {cc['root']}: {cc['bytes'] / 2**20:.0f} MB in {len(cc['keys'])} key(s); current key "
            f"{cc['key'] or '-'}" + ("" if cc["used"] or not cc["key"] else " (not used: the start was cold)")
        )
    lines += _jit_lines(st.get("jit"))
    ready = st["readiness"]
    lines.append(f"readiness: {'ready' if ready['ready'] else 'NOT READY'} ({ready['phase']}: {ready['why']})")
    if rs := st.get("ready_server"):
        running = "" if control.alive(rs) else ", not running"
        lines.append(f"readiness server: {rs.get('url')} ({rs.get('kind')} {_what(rs)}{running})")
    return lines + list(st.get("watch") or [])
