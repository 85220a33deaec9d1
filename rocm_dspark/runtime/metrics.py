"""Prometheus text from vLLM's /metrics -> speculative-decoding counters and acceptance length.

vLLM exports no acceptance gauges, only monotonically growing counters (labels model_name, engine;
per-position adds `position`). Rates are therefore computed from the *difference* of two reads taken
around a workload: mean acceptance length AL = 1 + accepted/drafts (the bonus token counts, so
AL lies in [1, K+1]), acceptance rate = accepted/draft_tokens, per-position = accepted_at_i/drafts.

Parsing uses the real prometheus_client parser, imported lazily (it is an optional dependency).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from rocm_dspark.errors import EnvironmentFailure, UsageError

# The counters' fields -> their samples as vLLM exposes them (prometheus_client appends `_total` to counters).
COUNTERS = {
    "num_drafts": "vllm:spec_decode_num_drafts_total",
    "num_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "request_success": "vllm:request_success_total",  # summed over finished_reason
}
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_SPEC_NAMES = (*tuple(COUNTERS.values())[:3], ACCEPTED_PER_POS)


class CounterReset(EnvironmentFailure):
    """A counter went backwards between two reads: the server restarted, so the delta means nothing."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_samples(text: str) -> list[Sample]:
    """Every sample in a Prometheus text exposition, in order. Raises UsageError on text that is not one."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return [
            Sample(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
    except (ValueError, TypeError, IndexError) as exc:
        first = text.strip().splitlines()[0][:80] if text.strip() else "<empty>"
        raise UsageError(
            f"not Prometheus text exposition ({exc}); first line {first!r}: point at the server's /metrics"
        ) from None


def sample_sum(samples: list[Sample], name: str, model_name: str | None = None) -> float | None:
    """Sum of the samples called `name` (of `model_name` only, when given); None when there is no such sample."""
    values = [s.value for s in samples if s.name == name and model_name in (None, s.labels.get("model_name"))]
    return sum(values, 0.0) if values else None


@dataclass(frozen=True)
class SpecDecodeCounters:
    """One read of the counters (or the difference of two reads, via `after - before`).

    `spec_decode` is False when the server exports no spec_decode counters at all (it runs without
    --speculative-config); the derived values are then None rather than a made-up number.
    """

    spec_decode: bool
    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    accepted_per_pos: tuple[float, ...] = ()  # index = draft position 0..K-1
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    request_success: float = 0.0
    is_delta: bool = field(default=False, compare=False)  # in the records the probe writes (dataclasses.asdict)

    # -- derived values -------------------------------------------------------------------------
    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted/drafts (tokens emitted per verification step); None without drafts."""
        if not self.spec_decode or self.num_drafts <= 0:
            return None
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    @property
    def acceptance_rate(self) -> float | None:
        """accepted/draft_tokens. Under adaptive verification this drops by design (it counts
        scheduled drafts); prefer the acceptance length there."""
        if not self.spec_decode or self.num_draft_tokens <= 0:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def per_position_acceptance(self) -> tuple[float, ...] | None:
        """accepted_at_position_i / drafts for i in 0..K-1; None without drafts."""
        if not self.spec_decode or self.num_drafts <= 0:
            return None
        return tuple(a / self.num_drafts for a in self.accepted_per_pos)

    def summary(self) -> str:
        if not self.spec_decode:
            return "no speculative decoding counters"
        al, rate, pos = self.mean_acceptance_length, self.acceptance_rate, self.per_position_acceptance
        if al is None:
            return "speculative decoding on, no drafts counted"
        return (
            f"acceptance length {al:.3f} (drafts {self.num_drafts:g}, draft tokens {self.num_draft_tokens:g}, "
            f"accepted {self.num_accepted_tokens:g}, rate {rate:.3f}), per position "
            + ", ".join(f"{p:.3f}" for p in (pos or ()))
        )

    # -- deltas ---------------------------------------------------------------------------------
    def __sub__(self, before: SpecDecodeCounters) -> SpecDecodeCounters:
        if not isinstance(before, SpecDecodeCounters):
            return NotImplemented
        if self.spec_decode != before.spec_decode:
            raise CounterReset(
                "spec_decode counters appeared or vanished between the two reads: the server restarted "
                "with another configuration; read both snapshots from the same server run"
            )
        # a position one read lacks counts 0
        per_pos = list(itertools.zip_longest(self.accepted_per_pos, before.accepted_per_pos, fillvalue=0.0))
        pairs = {k: (getattr(self, k), getattr(before, k)) for k in COUNTERS}
        pairs |= {f"accepted_per_pos[{i}]": ab for i, ab in enumerate(per_pos)}
        backwards = [f"{k} {b:g} -> {a:g}" for k, (a, b) in pairs.items() if a < b]
        if backwards:
            raise CounterReset(
                "counters went backwards (" + "; ".join(backwards) + "): the server restarted between "
                "the two reads; rerun the workload against a server that stays up"
            )
        deltas = {k: a - b for k, (a, b) in pairs.items() if k in COUNTERS}
        return replace(self, accepted_per_pos=tuple(a - b for a, b in per_pos), is_delta=True, **deltas)


def spec_decode_counters(text: str, model_name: str | None = None) -> SpecDecodeCounters:
    """Parse /metrics text into counters, summed over engines (and over models unless `model_name`)."""
    samples = parse_samples(text)
    if not any(s.name.startswith("vllm:") for s in samples):
        raise UsageError("the metrics text has no vllm: samples: point at a vLLM server's /metrics")
    if model_name is not None and not any(s.labels.get("model_name") == model_name for s in samples):
        served = sorted({s.labels["model_name"] for s in samples if "model_name" in s.labels})
        raise UsageError(f"no metrics for model_name {model_name!r}; the server reports {served}: pass one of those")
    spec = any(sample_sum(samples, n, model_name) is not None for n in _SPEC_NAMES)
    per_pos: dict[int, float] = {}
    for s in samples:
        if s.name != ACCEPTED_PER_POS or model_name not in (None, s.labels.get("model_name")):
            continue
        try:
            pos = int(s.labels["position"])
        except (KeyError, ValueError):
            raise UsageError(f"{ACCEPTED_PER_POS} sample without an integer position label: {s.labels}") from None
        per_pos[pos] = per_pos.get(pos, 0.0) + s.value
    width = max(per_pos) + 1 if per_pos else 0
    totals: dict[str, Any] = {k: sample_sum(samples, n, model_name) or 0.0 for k, n in COUNTERS.items()}
    return SpecDecodeCounters(spec, accepted_per_pos=tuple(per_pos.get(i, 0.0) for i in range(width)), **totals)
