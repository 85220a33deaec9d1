"""Checks read from the server's log (rocm_dspark.runtime.server_phases): the one --launch writes, or
--server-log FILE for a running server; without one both are n/a.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from rocm_dspark.runtime.server_phases import capture_facts, jit_compiles
from rocm_dspark.validate.result import FAIL, NOT_APPLICABLE, PASS, WARN, Outcome

NO_LOG = "no server log to read (--launch writes one; pass --server-log FILE with --endpoint)"


def log_path(ctx) -> Path | None:
    if ctx.launched is not None:
        return Path(ctx.launched.log_path)
    return Path(ctx.options.server_log) if ctx.options.server_log else None


def _read(ctx) -> str | None:
    path = log_path(ctx)
    if path is None:
        return None
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None


def mark_sweep_start(ctx) -> None:
    """Remember where the log stood when the sweep began (the JIT check reads from there)."""
    if "sweep_log_offset" not in ctx.data:
        ctx.data["sweep_log_offset"] = len(_read(ctx) or "")  # characters: the reader slices text


def capture(ctx) -> Outcome:
    """the server log: vLLM kept the plan's --max-cudagraph-capture-size (no "Truncating
    max_cudagraph_capture_size"); steps above the size it kept run eager."""
    text = _read(ctx)
    if text is None:
        return Outcome(NOT_APPLICABLE, NO_LOG)
    from rocm_dspark.probe.live import int_flag

    asked = int_flag(ctx.target.argv or ctx.plan.argv, "max_cudagraph_capture_size")
    facts = capture_facts(text)
    if facts is None:
        return Outcome(
            WARN,
            f'the server log {log_path(ctx)} has no vLLM engine line ("Initializing a V1 LLM '
            'engine ... with config"): the capture sizes vLLM kept are unknown',
            threshold=asked,
        )
    kept = facts["truncated_to"] if facts["truncated_to"] is not None else facts["max"]
    value = {"asked": asked, "kept": kept, "cudagraph_mode": facts["mode"], "sizes": facts["sizes"]}
    out = partial(Outcome, value=value, threshold=asked, evidence=facts)
    if kept is None and facts["mode"] not in (None, "NONE"):
        return out(
            WARN,
            f"vLLM's engine line prints cudagraph_mode {facts['mode']} but no "
            "max_cudagraph_capture_size: the size it kept is unknown",
        )
    if facts["mode"] == "NONE" or not kept:
        if asked is None:
            return out(
                NOT_APPLICABLE,
                "no capture size asked and vLLM captures no graphs (cudagraph_mode "
                f"{facts['mode']}, e.g. --enforce-eager): every step runs eager",
            )
        return out(
            FAIL,
            f"asked --max-cudagraph-capture-size {asked} but vLLM captures no graphs (cudagraph_mode "
            f"{facts['mode']}): every step runs eager",
        )
    if asked is not None and kept < asked or facts["truncated_to"] is not None:
        k = ctx.target.num_speculative_tokens or 0
        per_req = 1 + k
        return out(
            FAIL,
            f'capture size cut: asked {asked}, vLLM kept {kept} ("Truncating '
            f'max_cudagraph_capture_size to {kept}"); steps of more than {kept} tokens run eager, i.e. '
            f"more than {kept // per_req} requests at {per_req} tokens each (K={k})",
        )
    return out(
        PASS,
        f"vLLM kept the capture size asked: {kept} ({len(facts['sizes'] or [])} sizes, cudagraph_mode {facts['mode']})",
    )


def jit(ctx) -> Outcome:
    """the server log: no kernel compile reported by vLLM's JIT monitor during the sweep (warn,
    with the kernel's name)."""
    text = _read(ctx)
    if text is None:
        return Outcome(NOT_APPLICABLE, NO_LOG)
    seen = jit_compiles(text, ctx.data.get("sweep_log_offset", 0))
    if seen["mode"] is None:
        return Outcome(
            NOT_APPLICABLE,
            "vLLM's JIT monitor is not active in this server (it starts after JIT "
            "warm-up, which --enforce-eager and kernel_config.enable_jit_warmup=false turn off)",
        )
    events = seen["events"]
    kernels = sorted({f"{e['backend']} {e['kernel']}" for e in events})
    out = partial(Outcome, value={"mode": seen["mode"], "compiles": len(events), "kernels": kernels}, threshold=0)
    if events:
        return out(
            WARN,
            f"{len(events)} kernel compile(s) reported by vLLM's JIT monitor during the sweep: "
            f"{', '.join(kernels)} (each is a latency spike; extend warm-up to cover the shape)",
            evidence=events[:20],
        )
    return out(PASS, f"vLLM's JIT monitor (mode={seen['mode']}) reported no compile during the sweep")
