"""A sweep level's row from per-request records, for the report tests' rows (the sweep itself takes bench's
numbers: rocm_dspark.validate.bench.row)."""

import math
from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    ok: bool
    ttft_s: float | None = None
    latency_s: float | None = None
    output_tokens: int = 0
    itl_s: list = field(default_factory=list)     # gaps between streamed chunks after the first
    error: str | None = None


def percentile(values, q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]; None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarise(records: list[RequestRecord], wall_s: float, concurrency: int) -> dict:
    """Per-level statistics from the request records (pure; tested against numpy)."""
    ok = [r for r in records if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in ok
            if r.ttft_s is not None and r.latency_s is not None and r.output_tokens > 1]
    itl = [g for r in ok for g in r.itl_s]
    tokens = sum(r.output_tokens for r in ok)
    ms = lambda v: None if v is None else round(v * 1000, 2)  # noqa: E731
    return {
        "concurrency": concurrency, "requests": len(records), "succeeded": len(ok), "failed": len(records) - len(ok),
        "wall_s": round(wall_s, 3), "output_tokens": tokens,
        "output_throughput_tok_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "request_throughput_req_s": round(len(ok) / wall_s, 3) if wall_s > 0 else None,
        "ttft_ms": {"mean": ms(sum(ttft) / len(ttft)) if ttft else None, "p50": ms(percentile(ttft, 50)),
                    "p90": ms(percentile(ttft, 90)), "p99": ms(percentile(ttft, 99))},
        "tpot_ms": {"mean": ms(sum(tpot) / len(tpot)) if tpot else None, "p50": ms(percentile(tpot, 50)),
                    "p99": ms(percentile(tpot, 99))},
        "itl_ms": {"mean": ms(sum(itl) / len(itl)) if itl else None, "p50": ms(percentile(itl, 50)),
                   "p99": ms(percentile(itl, 99))},
        "errors": sorted({r.error for r in records if r.error})[:5],
    }
