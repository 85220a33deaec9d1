"""Load sweep: throughput, time to first token and inter-token latency at several concurrencies.

Each level is one `vllm bench serve` run (rocm_dspark.validate.bench) from the serving vLLM, bounded in
requests (options.requests_for) and time, so a server that dies or hangs mid-sweep is a failed level with
the first error bench reports, never waited on forever. The A/B arms (rocm_dspark.validate.ab) run the same
bench the same way. No check measures with a client of its own.
"""

from __future__ import annotations

import math
import os
import shutil
from functools import partial
from pathlib import Path

from rocm_dspark.launch.launch_facts import hf_cache_mounts, hf_home, hf_hub_cache
from rocm_dspark.validate import bench
from rocm_dspark.validate.log_checks import mark_sweep_start
from rocm_dspark.validate.result import FAIL, PASS, Outcome

BENCH_DIR = "bench"  # in the report: each level's `vllm bench serve` JSON, as written, and its output
BENCH_START_S = 300.0  # bench's own start (imports, tokenizer) before the first request


def bench_setup(
    argv, plan, *, python: str | None, container: tuple[str, str] | None, result_dir: Path
) -> tuple[list[str], str]:
    """(how to reach the serving vLLM's `vllm`, the tokenizer bench loads) for a server run from `argv`. The `vllm`
    is the one inside its image (container modes), else the one that serves (argv[0]) or the one beside its Python
    (--python, or a `python -m vllm...` argv); the tokenizer is the served model's (the served name is no path)."""
    tokenizer = bench.served_model(argv or plan.argv) or plan.model_path or plan.model_id
    if container:
        tool, image = container
        mounts = [*hf_cache_mounts(hf_home(), hf_hub_cache()), "-v", f"{result_dir}:{result_dir}"]
        model_path = tokenizer if os.path.isabs(tokenizer) else plan.model_path
        if model_path:
            mounts += ["-v", f"{model_path}:{model_path}:ro"]
        return bench.container_prefix(tool, image, mounts), tokenizer
    first = Path(str(argv[0])) if argv else None
    if not python and first is not None and first.name == "vllm":
        return [str(first)], tokenizer
    py = python or (str(first) if first is not None and first.name.startswith("python") else None)
    exe = Path(py).with_name("vllm") if py else None
    return [str(exe) if exe and exe.exists() else (shutil.which("vllm") or "vllm")], tokenizer


def bench_level(
    prefix, *, concurrency: int, n: int, out_dir: Path, stem: str, request_timeout_s: float, **workload
) -> dict:
    """One `vllm bench serve` run (workload: the rest of bench.bench_argv's keywords); its row (bench.row) with
    "rc". Bounded: every round of `concurrency` requests may take the request timeout, plus bench's own start."""
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = bench.bench_argv(
        prefix,
        concurrency=concurrency,
        num_prompts=n,
        result_dir=str(out_dir),
        result_filename=f"{stem}.json",
        **workload,
    )
    timeout_s = math.ceil(n / concurrency) * request_timeout_s + BENCH_START_S
    res = bench.run(argv, out_dir / f"{stem}.json", out_dir / f"{stem}.log", timeout_s)
    return {**bench.row(res["json"], concurrency, n, argv, res["error"]), "rc": res["rc"]}


def input_len(quick: bool) -> int:
    """Prompt tokens per request: the sweep's, and the A/B's."""
    return 128 if quick else 1024


def level_check(concurrency: int):
    """The check function for one concurrency level: one `vllm bench serve` run (rocm_dspark.validate.bench)."""

    def check(ctx) -> Outcome:
        opts = ctx.options
        n = opts.requests_for(concurrency)
        mark_sweep_start(ctx)
        result_dir = (Path(opts.report_dir) / BENCH_DIR).absolute()
        prefix, tokenizer = bench_setup(
            ctx.target.argv, ctx.plan, python=opts.python, container=opts.bench_container, result_dir=result_dir
        )
        ctx.say(f"      sweep.concurrency_{concurrency}: running vllm bench serve ({prefix[0]} ...)")
        before = _counters(ctx)
        stats = bench_level(
            prefix,
            base_url=ctx.target.base_url,
            served_name=ctx.target.served_name,
            tokenizer=tokenizer,
            concurrency=concurrency,
            n=n,
            input_len=input_len(opts.quick),
            output_len=opts.output_tokens(),
            out_dir=result_dir,
            stem=f"concurrency_{concurrency}",
            request_timeout_s=opts.request_timeout_s,
        )
        rc = stats.pop("rc")
        stats.update(step_estimate(stats, before, _counters(ctx), n))
        ctx.data.setdefault("sweep", []).append(stats)
        value = {
            "output_throughput_tok_s": stats["output_throughput_tok_s"],
            "ttft_p50_ms": stats["ttft_ms"]["p50"],
            "itl_p50_ms": stats["itl_ms"]["p50"],
            "tpot_mean_ms": stats["tpot_ms"]["mean"],
        }
        out = partial(Outcome, value=value, threshold={"failed_requests": 0}, evidence=stats)
        if stats["failed"] or rc != 0:
            alive = _server_state(ctx)
            return out(
                FAIL,
                f"{stats['failed']} of {n} requests failed at concurrency {concurrency} ({alive}); "
                f"first error: {stats['errors'][0] if stats['errors'] else 'unknown'}",
            )
        # bench's ITL is the gap between streamed chunks; with speculative decoding several tokens arrive back
        # to back, so TPOT is the per-token figure to compare across runs.
        return out(
            PASS,
            f"{n} requests (vllm bench serve): {stats['output_throughput_tok_s']} tok/s, TTFT p50 "
            f"{stats['ttft_ms']['p50']} ms, TPOT mean {stats['tpot_ms']['mean']} ms, ITL p50 "
            f"{stats['itl_ms']['p50']} ms",
        )

    return check


def _counters(ctx):
    """The server's spec-decode counters now, or None (no /metrics, or not Prometheus text)."""
    try:
        return ctx.client.metrics(timeout_s=10)
    except Exception:  # the sweep's numbers stand without them; the level says they are missing
        return None


def step_estimate(stats: dict, before, after, n_requests: int) -> dict:
    """One decode step's cost at this level, for `plan --cost-table`: the median gap between streamed
    chunks (a request receives one chunk per engine step) and the target tokens such a step verifies:
    running requests x (1 + drafts verified per request per step, from the /metrics deltas)."""
    step_ms, al, drafted = stats["itl_ms"]["p50"], None, None  # None: no /metrics to count drafts from
    if before is not None and after is not None:
        delta = after - before
        drafting = delta.spec_decode and delta.num_drafts > 0
        drafted = delta.num_draft_tokens / delta.num_drafts if drafting else 0.0
        al = round(delta.mean_acceptance_length, 4) if drafting else None
    known = step_ms is not None and drafted is not None
    return {
        "acceptance_length": al,
        "drafted_per_step": None if drafted is None else round(drafted, 4),
        "step_ms": step_ms,
        "tokens_per_step": round(min(stats["concurrency"], n_requests) * (1.0 + drafted), 2) if known else None,
    }


def _server_state(ctx) -> str:
    """After failures: did the server die (and how), or does it still answer /health?"""
    if ctx.launched is not None and ctx.launched.returncode() is not None:
        return f"the server process exited with status {ctx.launched.returncode()}"
    try:
        res = ctx.client.get("/health", timeout_s=5)
        return f"/health now answers HTTP {res.status}"
    except Exception as exc:  # ServerError and friends: the reason is the point
        return f"the server no longer answers: {exc}"
