"""The acceptance band a trusted A/B record measured: what the live mean accepted length is held against.

The A/B (rocm_dspark.validate.ab) stores, per arm, the mean accepted length AL = 1 + accepted/drafts over its
workload (from the /metrics deltas), the number of requests served, and the arm's argv (so K, the number of
speculative tokens). It stores no per-request spread, so the band's half-width is the largest spread the record
allows: one request's AL lies in [1, K+1], so its standard deviation is at most K/2 (Popoviciu's inequality), and
the mean of n served requests has a standard error of at most K/(2 sqrt(n)). The band is AL +- 2 of those, i.e.
AL +- K/sqrt(n), clipped to [1, K+1]. (AL is a draft-weighted mean over requests; with the A/B's fixed output
length, ignore_eos, the weights are close to equal.) A small A/B gives a wide band: run more requests
(`validate --ab --requests N`) for a tighter one. The record is the one the gate's payoff half decides with.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

from rocm_dspark.probe.ab_record import ARMS, ABRecord
from rocm_dspark.recipe.plan import Command

Z = 2.0  # standard errors each side of the measured value (about 95% two-sided for a normal mean)


class AcceptanceBand(NamedTuple):
    concurrency: int
    low: float
    high: float
    arm: str  # block | adaptive: the verification mode the band was measured with
    record_id: str


def _num_speculative_tokens(argv: list) -> int | None:
    """K of the arm's recorded command (its --speculative-config, read by Command.from_words as vLLM reads it)."""
    k = (Command.from_words(argv).spec_config() or {}).get("num_speculative_tokens")
    return k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else None


def acceptance_band(record: ABRecord, arm: str) -> AcceptanceBand | None:
    """The mean accepted length band of `arm` in `record`; None when that arm measured no acceptance length
    (no drafts, or no speculative decoding), served no request, or its argv names no K."""
    if arm not in ARMS:
        raise ValueError(f"arm {arm!r}: use one of {', '.join(ARMS)}")
    data = record.arms[arm]
    al = data.get("acceptance_length")
    served = int(data.get("requests", 0)) - int(data.get("failed", 0))
    k = _num_speculative_tokens(data.get("argv") or [])
    if al is None or served <= 0 or k is None:
        return None
    half = Z * (k / 2.0) / math.sqrt(served)
    return AcceptanceBand(
        record.concurrency, round(max(1.0, al - half), 4), round(min(k + 1.0, al + half), 4), arm, record.id
    )


def trusted_record(
    catalog, plan, concurrency: int | None, state_dir=None, *, current=None
) -> tuple[ABRecord | None, list[str]]:
    """The A/B record the gate trusts for `plan` at `concurrency`, or None and the notes saying why not."""
    if concurrency is None:
        return None, ["no workload declared (--concurrency C): no A/B record applies"]
    from rocm_dspark.probe import ab_record
    from rocm_dspark.probe.payoff import from_ab_records

    decided, notes = from_ab_records(catalog, plan, concurrency, state_dir, current=current)
    if decided is None or decided.record is None:
        return None, notes or [f"no A/B record at c={concurrency} in {ab_record.directory(state_dir)}"]
    loaded = ab_record.load(state_dir, [Path(decided.record).name])  # read again by the same trust rules
    trusted = [rec for _, rec in loaded.trusted]
    return (trusted[0] if trusted else None), notes + loaded.notes


def bands_for(catalog, plan, state_dir=None, *, current=None) -> tuple[dict[str, AcceptanceBand], list[str]]:
    """Both arms' bands from the trusted record at the plan's declared concurrency ({} without one)."""
    record, notes = trusted_record(catalog, plan, plan.concurrency, state_dir, current=current)
    if record is None:
        return {}, notes
    bands = {arm: band for arm in ARMS if (band := acceptance_band(record, arm)) is not None}
    return bands, notes


__all__ = ["AcceptanceBand", "Z", "acceptance_band", "bands_for", "trusted_record"]
