"""Whether a plan runs vLLM's DeepSeek-V4.1 mono decode layer (--monokernel). Pure: recipes/vllm.yaml
`mono_decode` (each condition with its vllm 0.33.0 wheel source) and the plan's layout in, one decision out.

A decode step takes the kernels when it is decode-only, runs eager or as a FULL graph, and has at most the
arch's rows; its rows are the padded graph size, vLLM's capture grid rounded up to multiples of 1+K.
"""

# No `from __future__ import annotations` here: typing.NamedTuple would then compile every field's string
# annotation at import, on the `recipe` start-up path (benchmarks/recipe_latency.py).

from typing import NamedTuple

from rocm_dspark.recipe.capture import vllm_capture_grid


class Mono(NamedTuple):
    on: bool
    why: str  # one line: what runs, or why it is off and which layout would take it
    short: str = ""  # the same in a few words (the default output)
    rows: int | None = None  # the padded rows of a decode step of `concurrency` requests
    max_rows: int | None = None  # the arch's kernels' rows at most
    max_requests: int | None = None  # the most requests a step may carry and still take the kernels, at this K


def step_rows(requests: int, k: int, capture_size: int) -> int:
    """The rows vLLM runs a decode step of `requests` x (1+K) tokens at: the smallest captured size that holds
    it (capture sizes rounded up to multiples of 1+K, config/compilation.py:1537), else the tokens (eager)."""
    q, tokens = 1 + k, requests * (1 + k)
    sizes = sorted({-(-s // q) * q for s in vllm_capture_grid(capture_size)} - {0})
    return next((s for s in sizes if tokens <= s <= capture_size), tokens)


def max_requests(max_rows: int, k: int, capture_size: int) -> int:
    n = 0
    while step_rows(n + 1, k, capture_size) <= max_rows:
        n += 1
    return n


def decide(
    mono: dict,
    *,
    model: str,
    gpu,
    build: str,
    has_change: bool | None,
    tp: int,
    dp: int,
    ep: int,
    nodes: int,
    k: int,
    concurrency: int | None,
    capture_size: int,
    k_schedule: bool,
    env_keys: tuple[str, ...] = (),
) -> Mono | None:
    """The decision for one plan; None where the model has no mono layer (nothing to say)."""
    if not mono or model not in mono["models"]:
        return None

    def off(short: str, more: str = "", **kw) -> Mono:
        return Mono(False, f"mono decode off: {short}{more}", f"off: {short}", **kw)

    if has_change is not True:
        return off(
            f"{build} {'lacks' if has_change is False else 'is not shown to contain'} {mono['change']} "
            f"({mono['flag']} is in vLLM 0.33.0 on)"
        )
    arch = mono["archs"].get(gpu.arch)
    if arch is None:
        return off(f"{gpu.arch} has no mono kernels (they take {', '.join(mono['archs'])})")
    tps, top = "/".join(map(str, arch["tp"])), arch["tp"][-1]
    g = gpu.gpus_per_node
    n_rep = g // top if g % top == 0 and g // top >= 2 else 0
    # Every GPU of the node with the kernels: N independent TP-`top` servers behind vllm-router (the strategy
    # `replicas`; vLLM's data parallelism is refused by the kernels). The router gives each ceil(C/N) requests.
    per = None if concurrency is None or not n_rep else -(-concurrency // n_rep)
    fits_rep = per is None or step_rows(per, k, capture_size) <= arch["max_rows"]
    run = f"--strategy replicas --replicas {n_rep}" if n_rep else ""
    servers = (
        f"{n_rep} independent TP-{top} servers behind vllm-router{f', {per} requests each' if per else ''}; "
        "vLLM's data parallelism is refused by the kernels"
    )
    pair = f"; for all {g} GPUs, {run} would ({servers})" if n_rep and fits_rep else ""
    if dp > 1 or ep > 1 or nodes > 1:
        layouts = {f"data parallel {dp}": dp > 1, "expert parallel": ep > 1, f"{nodes} nodes": nodes > 1}
        what = ", ".join(w for w, on in layouts.items() if on)
        return off(f"{what} (the kernels take tensor parallelism only, --tp {tps})", pair)
    if tp not in arch["tp"]:
        if tp > top and pair:
            return off(
                f"TP {tp} (the {gpu.arch} kernels take TP {tps}): {run} would take it",
                f" on all {g} GPUs ({servers}), --tp {top} on {top} of them",
            )
        return off(
            f"TP {tp} (the {gpu.arch} kernels take TP {tps}): --tp {top} would take it", pair if tp > top else ""
        )
    if gpu.compute_units < mono["min_compute_units"]:
        return off(f"{gpu.compute_units} compute units (the kernels need {mono['min_compute_units']})")
    unset = [e for e in mono["unset_env"] if e in env_keys]
    if unset:
        return off(f"--env {unset[0]} (the kernels need it unset)")
    if k_schedule:
        return off("--k-per-batch-size (vLLM then captures PIECEWISE graphs, where the kernels fall back)")
    n = max_requests(arch["max_rows"], k, capture_size)
    fits = f"up to {n} requests at K={k} fit {arch['max_rows']} rows"
    if concurrency is None:
        return off(
            f"no --concurrency ({fits}: pass --concurrency {n} or less)", max_rows=arch["max_rows"], max_requests=n
        )
    rows = step_rows(concurrency, k, capture_size)
    if rows > arch["max_rows"]:
        tokens = concurrency * (k + 1)
        pad = f"{tokens} rows" if rows == tokens else f"{tokens} tokens, padded to {rows} rows"
        return off(
            f"{concurrency} requests x (1+K={k + 1}) = {pad} > {arch['max_rows']} ({fits})",
            rows=rows,
            max_rows=arch["max_rows"],
            max_requests=n,
        )
    return Mono(
        True,
        (
            f"ON ({mono['flag']}): decode steps of up to {concurrency} requests ({rows} rows <= "
            f"{arch['max_rows']}; {fits}) run each layer as two FlyDSL launches"
        ),
        f"ON ({mono['flag']}): steps of <= {n} requests at K={k}",
        rows,
        arch["max_rows"],
        n,
    )
