"""Acceptance inputs for the planner.

The planner works with CONDITIONAL per-position rates: c[j] = P(draft j accepted | drafts 1..j-1
accepted), what DSpark's confidence head estimates and what the seeds call alpha. Survival (the
probability that draft j is accepted at all) is their running product.

A synthetic acceptance length L (vLLM's `synthetic_acceptance_length`, e.g. InferenceX's 3.51 for
V4.1-Flash DSpark-5) resolves to vLLM's minimum-variance schedule: unconditional rates
[1]*floor(L-1) + [frac(L-1)] + [0]*..., truncated to gamma (vLLM config/speculative.py), and
conditional rates r[j] / r[j-1] (vllm/v1/spec_decode/utils.py). L counts the bonus token, so
verifying every position gives exactly L tokens per request per step on average. That schedule is
what vLLM's synthetic benchmark mode runs; real drafts decay gradually instead, so the planner's
default reads L as a constant conditional rate alpha (geometric survival, the seeds' model).
"""

from __future__ import annotations

import itertools
import math
import operator

from rocm_dspark.errors import UsageError


def _check_length(length: float, gamma: int) -> None:
    if not 1.0 <= length <= gamma + 1:
        raise UsageError(
            f"acceptance length {length:g} is outside [1, {gamma + 1}] for {gamma} drafted positions; "
            f"pass e.g. --acceptance-length 3.51"
        )


def synthetic_rates(length: float, gamma: int) -> list[float]:
    """Conditional rates for a synthetic acceptance length L in [1, gamma + 1]."""
    _check_length(length, gamma)
    extra = length - 1.0
    whole = math.floor(extra)
    unconditional = ([1.0] * whole + [extra - whole] + [0.0] * gamma)[:gamma]
    return [r / previous if previous > 0 else 0.0 for previous, r in zip([1.0, *unconditional], unconditional)]


def bisect_increasing(f, target: float, lo: float, hi: float, *, steps: int) -> float:
    """The x in [lo, hi] where the increasing function f reaches `target`, after `steps` halvings."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def geometric_rates(length: float, gamma: int) -> list[float]:
    """One conditional rate alpha for every position (the seeds' model: each draft accepted with the
    same probability given the earlier ones) such that 1 + alpha + ... + alpha^gamma = L."""
    _check_length(length, gamma)
    alpha = bisect_increasing(lambda a: sum(a**i for i in range(1, gamma + 1)), length - 1.0, 0.0, 1.0, steps=100)
    return [alpha] * gamma


def parse_rates(text: str, gamma: int) -> list[float]:
    """'0.9,0.8,0.7' -> conditional rates; positions past the list are taken as never accepted."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        rates = [float(p) for p in parts]
    except ValueError:
        raise UsageError(
            f"--acceptance-rates {text!r} is not a comma-separated list of numbers; "
            f"pass e.g. --acceptance-rates 0.9,0.8,0.7,0.6,0.5"
        ) from None
    if not rates or len(rates) > gamma:
        raise UsageError(f"--acceptance-rates needs 1 to {gamma} values (one per drafted position), got {len(rates)}")
    if any(not 0.0 <= r <= 1.0 for r in rates):
        raise UsageError(
            f"--acceptance-rates {text!r}: every rate must lie in [0, 1] (conditional acceptance of each position)"
        )
    return rates + [0.0] * (gamma - len(rates))


def expected_tokens_per_round(conditional_acceptance) -> float:
    """1 (the correction or bonus token) + the expected number of accepted drafts."""
    if not all(0.0 <= p <= 1.0 for p in conditional_acceptance):
        raise ValueError("acceptance probability out of range")
    return 1.0 + sum(itertools.accumulate(conditional_acceptance, operator.mul))


def choose_spec_method(methods, baseline_ms_per_token: float, memory_budget_gb: float):
    """Pick the speculative method with the best speed-up over the target alone, within a memory
    budget: speed-up = expected tokens per round x baseline ms per token / round ms (draft + verify +
    overhead), all measured on the same workload. ('baseline', 1.0) when nothing beats it."""
    best = ("baseline", 1.0)
    for method in methods:
        if method["extra_memory_gb"] > memory_budget_gb:
            continue
        produced = expected_tokens_per_round(method["conditional_acceptance"])
        round_ms = method["draft_ms"] + method["verify_ms"] + method["overhead_ms"]
        speedup = produced * baseline_ms_per_token / round_ms
        if speedup > best[1]:
            best = (method["name"], speedup)
    return best
