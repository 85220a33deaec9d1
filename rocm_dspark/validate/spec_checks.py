"""Speculative-decoding checks from the server's own /metrics counter *deltas* around a fixed workload
(rocm_dspark.runtime.metrics, parsed with prometheus_client's real parser). The floor is data (--acceptance-min
overrides it); the public golden (3.51 for V4.1 DSpark-5, thinking on) is a reference, never the threshold.
"""

from __future__ import annotations

import time
from functools import partial

from rocm_dspark.errors import EnvironmentFailure, UsageError
from rocm_dspark.runtime.metrics import spec_decode_counters
from rocm_dspark.validate.result import FAIL, PASS, SKIPPED, WARN, Outcome

# A fixed workload of chat-templated prompts (raw text skews AL); maths and code, where drafts are accepted
# most, plus prose. The same prompts every run, so two reports of one node can be compared.
WORKLOAD = (
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Solve step by step: a train travels 180 km in 2.5 hours. What is its average speed in km/h?",
    "List the first twenty prime numbers, separated by commas.",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Explain in three sentences why the sky is blue.",
    "Convert the decimal numbers 1 to 16 to binary, one per line.",
    "Write a bash loop that prints the numbers from 1 to 10.",
    "Summarise the rules of tic-tac-toe in five bullet points.",
)
COUNTER_WAIT_S = 15.0  # vLLM updates the counters from its stats loop shortly after a response


def run_workload(client, served_name: str, prompts, max_tokens: int, timeout_s: float, *, ignore_eos: bool):
    """Send the prompts one by one; return (counter delta, per-request spec metrics if the server adds them,
    total completion tokens)."""
    before = client.metrics_text(timeout_s=min(timeout_s, 30))
    per_request, tokens = [], 0
    for prompt in prompts:
        response = client.chat(
            prompt, max_tokens, model=served_name, temperature=0.0, ignore_eos=ignore_eos, timeout_s=timeout_s
        )
        tokens += (response.get("usage") or {}).get("completion_tokens") or 0
        spec = (response.get("metrics") or {}).get("speculative_decoding")
        if spec:
            per_request.append(spec)
    deadline = time.monotonic() + COUNTER_WAIT_S
    while True:
        after = client.metrics_text(timeout_s=min(timeout_s, 30))
        delta = spec_decode_counters(after) - spec_decode_counters(before)
        if delta.generation_tokens >= tokens or time.monotonic() > deadline:
            return delta, per_request, tokens
        time.sleep(0.25)


def _k(ctx, delta) -> int | None:
    if ctx.target.num_speculative_tokens:
        return ctx.target.num_speculative_tokens
    if ctx.target.recipe_model and ctx.plan.speculative_config:
        return ctx.plan.speculative_config.get("num_speculative_tokens")
    return len(delta.accepted_per_pos) or None


def _floor(ctx) -> tuple[float | None, str]:
    if ctx.options.acceptance_min is not None:
        return ctx.options.acceptance_min, "--acceptance-min"
    floor = (ctx.model.validation or {}).get("acceptance_length_min") if ctx.target.recipe_model else None
    if floor is None:
        return None, ""
    return float(floor), f"recipe {ctx.model.key} validation.acceptance_length_min"


def acceptance(ctx) -> Outcome:
    """mean acceptance length 1 + accepted/drafts from /metrics counter deltas around a fixed chat workload, against
    the recipe's floor (validation.acceptance_length_min)."""
    prompts = WORKLOAD[:4] if ctx.options.quick else WORKLOAD
    max_tokens = ctx.options.output_tokens()
    try:
        delta, per_request, tokens = run_workload(
            ctx.client,
            ctx.target.served_name,
            prompts,
            max_tokens,
            ctx.options.request_timeout_s,
            # A test model is sent ignore_eos so every request drafts for its full length; the real model is
            # left to stop where it would in service, so its AL is the one users see.
            ignore_eos=not ctx.target.recipe_model,
        )
    except (EnvironmentFailure, UsageError) as exc:  # ServerError, CounterReset, bad /metrics
        return Outcome(FAIL, f"workload failed: {exc}")
    k = _k(ctx, delta)
    floor, floor_source = _floor(ctx)
    golden = (ctx.model.speculative or {}).get("golden_acceptance_length") if ctx.target.recipe_model else None
    evidence = {
        "workload": {"requests": len(prompts), "max_tokens": max_tokens, "completion_tokens": tokens},
        "delta": {
            "drafts": delta.num_drafts,
            "draft_tokens": delta.num_draft_tokens,
            "accepted": delta.num_accepted_tokens,
            "accepted_per_pos": list(delta.accepted_per_pos),
            "generation_tokens": delta.generation_tokens,
            "requests": delta.request_success,
        },
        "num_speculative_tokens": k,
        "threshold_source": floor_source or None,
        "golden_reference": golden
        and {"value": golden, "note": "InferenceX golden, V4.1 DSpark-5, thinking on; a reference, not the threshold"},
        "per_request": per_request or None,
    }
    out = partial(Outcome, threshold=floor, evidence=evidence)
    if not delta.spec_decode:
        return out(FAIL, "the server exports no vllm:spec_decode_* counters: it runs without speculative decoding")
    if delta.num_drafts <= 0:
        return out(FAIL, f"no drafts counted during {len(prompts)} requests ({tokens} tokens): speculation never ran")
    al = delta.mean_acceptance_length
    per_pos = list(delta.per_position_acceptance or ())
    ctx.data["acceptance"] = {"al": al, "per_position": per_pos, "k": k, "threshold": floor, "golden": golden}
    evidence["acceptance_rate"] = delta.acceptance_rate
    evidence["per_position"] = per_pos
    out = partial(out, value=round(al, 4))  # from here on, with the measured length
    if k and not 1.0 <= al <= k + 1 + 1e-9:
        return out(FAIL, f"acceptance length {al:.3f} is outside [1, K+1={k + 1}]: the counters are inconsistent")
    shown = f"acceptance length {al:.3f} (1 + {delta.num_accepted_tokens:g}/{delta.num_drafts:g} drafts, K={k})"
    if floor is None:
        return out(
            PASS,
            f"{shown}; no floor for {ctx.target.served_name!r} (the recipe's floor is for "
            f"{ctx.model.key}; pass --acceptance-min to set one)",
        )
    if al < floor:
        return out(FAIL, f"{shown} is below the floor {floor:g} ({floor_source})")
    return out(PASS, f"{shown} >= floor {floor:g}")


def per_position(ctx) -> Outcome:
    """acceptance per draft position (accepted_i / drafts), which can only fall with the position."""
    acc = ctx.data.get("acceptance")
    if not acc:
        return Outcome(SKIPPED, "no acceptance measurement to break down")
    rates = acc["per_position"]
    # Drafts are verified left to right: position i is accepted only if i-1 was, so the rates never rise.
    rising = [i for i in range(1, len(rates)) if rates[i] > rates[i - 1] + 1e-9]
    value = [round(r, 4) for r in rates]
    if rising:
        return Outcome(
            WARN,
            f"per-position acceptance rises at position(s) {rising}: {value}; the counters are not prefix-consistent",
            value=value,
        )
    return Outcome(PASS, "per position " + ", ".join(f"{r:.3f}" for r in rates), value=value)
