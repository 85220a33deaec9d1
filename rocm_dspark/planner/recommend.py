"""Plan over a concurrency grid and recommend one setting.

For every concurrency the simulator runs no speculation, every fixed K in `k_values`, and adaptive
verification (drafting gamma positions). Decisions use the exact expected tokens/s of each run (no
sampling noise, so the answer does not depend on the seed); the draws give the reported acceptance
length. From those:
  * best fixed K: the one K with the highest geometric mean of (its tok/s / the row's best tok/s)
    over the grid;
  * per-batch-size K: each row's best K, written as vLLM's `num_speculative_tokens_per_batch_size`
    (inclusive ranges (start, end, K); a batch size between two grid points takes the K of the next
    larger grid point, the cautious side). vLLM ignores it when data_parallel_size > 1;
  * the recommendation: the candidate with the best geometric-mean relative throughput, except that
    a simpler candidate (no speculation < fixed K < per-batch-size K < adaptive) wins when it is
    within TOLERANCE of it: the cost model is not precise enough to justify complexity for less.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rocm_dspark.planner.simulator import Policy, SimResult, simulate

TOLERANCE = 0.02
CANDIDATE_LABELS = {
    "none": "no speculation",
    "fixed": "fixed K",
    "per_batch_size": "per-batch-size K",
    "adaptive": "adaptive verification",
    "block": "block verification",
}
DECIDE = (
    "measure it: `rocm-dspark validate --ab --concurrency C` (adaptive against block verification on this "
    "host) or `rocm-dspark plan --calibrate FILE` (this model fit to your own runs)"
)


@dataclass(frozen=True)
class Row:
    concurrency: int
    batch: int  # running requests (concurrency capped by max_num_seqs x dp)
    no_spec: SimResult
    fixed: dict  # K -> SimResult
    adaptive: SimResult
    best_k: int  # 0 means no speculation

    def at_k(self, k: int) -> SimResult:
        return self.no_spec if k == 0 else self.fixed[k]

    @property
    def best_tokens_per_s(self) -> float:
        """The best expected tok/s of every setting run at this row."""
        return max(
            self.no_spec.expected_tokens_per_s,
            self.adaptive.expected_tokens_per_s,
            *(x.expected_tokens_per_s for x in self.fixed.values()),
        )


@dataclass
class PlanResult:
    title: str
    cost_label: str
    acceptance_label: str
    rates: list
    gamma: int
    dp: int
    rows: list
    fixed_k: int
    schedule: list | None  # [(start, end, K), ...] or None when dp > 1
    scores: dict = field(default_factory=dict)  # candidate -> geometric-mean relative throughput
    recommended: str = ""
    speculative_config: dict = field(default_factory=dict)  # keys to merge into --speculative-config
    recommendation: str = ""
    notes: list = field(default_factory=list)
    error_pct: float | None = None  # stated tok/s error of every prediction (None: not stated)
    payoff_error_pp: float | None = None  # stated error of adaptive's gain over block verification, points
    error_source: str = "uncalibrated"
    adaptive_available: bool = True
    build: str = ""
    mono: list = field(default_factory=list)  # per row: does --monokernel run, what it predicts (mono_term)
    capture_overruns: list = field(default_factory=list)  # cells past the largest captured size (capture_term)

    def adaptive_gain_pct(self, row: Row) -> float:
        """Predicted gain of adaptive verification over block verification (all gamma drafts) at a row."""
        block = row.fixed.get(self.gamma)
        block_tps = (
            block.expected_tokens_per_s
            if block is not None
            else max(x.expected_tokens_per_s for x in row.fixed.values())
        )
        return 100.0 * (row.adaptive.expected_tokens_per_s / block_tps - 1.0)

    def payoff(self, row: Row) -> str:
        """'pays', 'loses' or 'uncertain' once the stated error is taken off (or put on) the gain."""
        gain = self.adaptive_gain_pct(row)
        err = self.payoff_error_pp
        if err is None:
            return "even" if abs(gain) < 0.5 else ("pays" if gain > 0 else "loses")
        return "pays" if gain - err > 0 else ("loses" if gain + err < 0 else "uncertain")

    @property
    def offered(self) -> list[str]:
        """The candidates scored, simplest first, that this build can run (adaptive only where available)."""
        return [c for c in self.scores if c != "block" and (c != "adaptive" or self.adaptive_available)]

    def candidate_result(self, candidate: str, row: Row) -> SimResult:
        if candidate == "block":  # every drafted position verified: K = gamma
            return row.fixed.get(self.gamma) or row.fixed[max(row.fixed)]
        k = {"none": 0, "fixed": self.fixed_k, "per_batch_size": row.best_k}.get(candidate)
        return row.adaptive if k is None else row.at_k(k)


def per_batch_size_schedule(batches_and_k, max_batch: int) -> list[tuple[int, int, int]]:
    """[(batch, K), ...] at grid points -> vLLM's inclusive ranges, merged where K repeats."""
    points = sorted(dict(batches_and_k).items())
    ranges: list[list[int]] = []
    start = 1
    for i, (batch, k) in enumerate(points):
        end = max(batch, max_batch) if i == len(points) - 1 else batch
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, k])
        start = end + 1
    return [tuple(r) for r in ranges]


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _relative(rows, tokens_per_s) -> float:
    """Geometric mean over the rows of tokens_per_s(row) / the row's best."""
    return _geomean(tokens_per_s(r) / r.best_tokens_per_s for r in rows)


def plan_grid(
    cost,
    rates,
    concurrencies,
    *,
    gamma: int,
    k_values=None,
    max_num_seqs: int | None = None,
    dp: int = 1,
    adaptive_allowed: bool = True,
    adaptive_blocker: str | None = None,
    title: str = "",
    acceptance_label: str = "",
    steps: int | None = None,
    seed: int = 0,
) -> PlanResult:
    import numpy as np

    k_values = sorted(set(k_values or range(1, gamma + 1)))
    if not k_values or k_values[0] < 1 or k_values[-1] > gamma:
        raise ValueError(f"k_values must lie in [1, {gamma}]")
    notes: list[str] = []
    rows: list[Row] = []
    capacity = max_num_seqs * dp if max_num_seqs else None
    for concurrency in sorted(set(concurrencies)):
        batch = min(concurrency, capacity) if capacity else concurrency
        ranks = min(dp, batch)
        common = dict(dp=ranks, steps=steps, seed=seed)
        no_spec = simulate(cost, rates, batch, Policy("none"), **common)
        fixed = {k: simulate(cost, rates, batch, Policy("fixed", k), **common) for k in k_values}
        adaptive = simulate(cost, rates, batch, Policy("adaptive", gamma), **common)
        best_k = max([0, *k_values], key=lambda k: (no_spec if k == 0 else fixed[k]).expected_tokens_per_s)
        rows.append(Row(concurrency, batch, no_spec, fixed, adaptive, best_k))
    clamped = [r.concurrency for r in rows if r.batch < r.concurrency]
    if clamped:
        notes.append(
            f"concurrency {', '.join(map(str, clamped))} exceeds max_num_seqs x dp = {capacity}: "
            f"the extra requests queue, the running batch stays {capacity}"
        )

    fixed_k = max(k_values, key=lambda k: _relative(rows, lambda r: r.fixed[k].expected_tokens_per_s))
    schedule = None
    if dp == 1:
        schedule = per_batch_size_schedule([(r.batch, r.best_k) for r in rows], max_num_seqs or rows[-1].batch)
    result = PlanResult(
        title=title,
        cost_label=getattr(cost, "label", "cost model"),
        acceptance_label=acceptance_label,
        rates=np.asarray(rates, dtype=float).tolist(),
        gamma=gamma,
        dp=dp,
        rows=rows,
        fixed_k=fixed_k,
        schedule=schedule,
        notes=notes,
    )
    candidates = ["none", "fixed"] + (["per_batch_size"] if schedule else []) + ["adaptive"]
    result.scores = {
        c: _relative(rows, lambda r, c=c: result.candidate_result(c, r).expected_tokens_per_s) for c in candidates
    }
    if not schedule:
        notes.append(
            "per-batch-size K not offered: vLLM disables num_speculative_tokens_per_batch_size "
            "when data_parallel_size > 1 (ranks would pick different K and deadlock)"
        )
    allowed = [c for c in candidates if c != "adaptive" or adaptive_allowed]
    best_score = max(result.scores[c] for c in allowed)
    chosen = next(c for c in allowed if result.scores[c] >= best_score * (1 - TOLERANCE))
    if not adaptive_allowed:
        gain = result.scores["adaptive"] / best_score - 1
        verdict = f"is predicted {gain:+.1%} better but " if gain > TOLERANCE else ""
        notes.append(
            f"adaptive verification {verdict}is not available here"
            + (f": {adaptive_blocker}" if adaptive_blocker else "")
        )
    result.adaptive_available = adaptive_allowed
    result.recommended = chosen
    result.speculative_config, result.recommendation = _describe(result, chosen)
    return result


def gain_over_block_pct(result: PlanResult, candidate: str) -> float:
    """Geometric mean over the grid of a candidate's predicted tok/s over block verification's, in percent."""
    return 100.0 * (
        _geomean(
            result.candidate_result(candidate, r).expected_tokens_per_s
            / result.candidate_result("block", r).expected_tokens_per_s
            for r in result.rows
        )
        - 1.0
    )


def hold_to_error(result: PlanResult) -> None:
    """Recommend over block verification only what beats it beyond the stated error (adaptive: its gain's own
    error, and a 'pays' verdict at some concurrency; the others: the tok/s error). The table keeps the point
    predictions; without a stated error nothing changes."""
    if result.error_pct is None or not result.rows:
        return

    def margin(c: str) -> float:
        return result.payoff_error_pp if c == "adaptive" and result.payoff_error_pp is not None else result.error_pct

    def supported(c: str) -> bool:  # of the offered candidates (adaptive only where it is available)
        if c == "fixed" and result.fixed_k == result.gamma:
            return False  # that is block verification itself
        if c == "adaptive" and not any(result.payoff(r) == "pays" for r in result.rows):
            return False
        return gain_over_block_pct(result, c) > margin(c)

    offered = result.offered
    result.scores["block"] = _relative(result.rows, lambda r: result.candidate_result("block", r).expected_tokens_per_s)
    chosen = result.recommended
    if chosen == "fixed" and result.fixed_k == result.gamma:
        chosen = "block"
    backed = [c for c in offered if supported(c)]
    if chosen != "block" and chosen not in backed:
        gains = "; ".join(
            f"{CANDIDATE_LABELS[c]} {gain_over_block_pct(result, c):+.1f}% (error +-{margin(c):g}"
            f"{' points' if c == 'adaptive' and result.payoff_error_pp is not None else '%'})"
            for c in offered
            if not (c == "fixed" and result.fixed_k == result.gamma)
        )
        if backed:
            chosen = max(backed, key=lambda c: result.scores[c])
        else:
            result.recommended = "block"
            result.speculative_config = {"num_speculative_tokens": result.gamma}
            result.recommendation = (
                f"block verification: num_speculative_tokens={result.gamma}: no setting beats it beyond the stated "
                f"error (predicted over block, geometric mean: {gains}); the table keeps the point predictions. "
                f"To decide, {DECIDE}"
            )
            return
    result.recommended = chosen
    result.speculative_config, result.recommendation = _describe(result, chosen)
    if chosen != "block":
        result.recommendation += (
            f"; {gain_over_block_pct(result, chosen):+.1f}% over block verification, beyond "
            f"the stated error +-{margin(chosen):g}"
        )


def _describe(result: PlanResult, chosen: str) -> tuple[dict, str]:
    """The --speculative-config keys of a candidate and the recommendation line that names them."""
    tail = f"(geometric mean {result.scores[chosen]:.1%} of the best per concurrency)"
    if chosen == "none":
        return {}, f"no speculation: drafting does not pay on this grid {tail}"
    if chosen == "per_batch_size":
        schedule = [list(r) for r in result.schedule]
        k_max = max(max(k for _, _, k in result.schedule), 1)
        config = {"num_speculative_tokens": k_max, "num_speculative_tokens_per_batch_size": schedule}
    else:
        config = {"num_speculative_tokens": result.fixed_k if chosen == "fixed" else result.gamma}
        if chosen == "adaptive":
            config["enable_adaptive_verification"] = True
    shown = ", ".join(f"{key}={str(value).lower() if value is True else value}" for key, value in config.items())
    return config, f"{CANDIDATE_LABELS[chosen]}: {shown} {tail}"
