"""The graph-capture cliff as a term of its own (docs/capture.md, docs/calibration.md).

A step with more tokens than the largest captured graph size runs without a full graph (vLLM 0.33
`VllmConfig._set_cudagraph_sizes`: "Larger uniform decode batches fall back to eager execution") and pays
eager(T) (docs/calibration.md, "The capture term"): per layer the kernel launches a graph would have replayed,
plus a per-token penalty of the unfused kernels, both non-negative and fitted where a run's tokens cross its
capture size (calibration.fit, `rocm-dspark plan --calibrate`).

This module also marks the plan's cells whose verify batch leaves the captured graphs, and says what
capture size would hold them; it imports nothing heavy.
"""

from __future__ import annotations


def eager_ms(tokens, largest: int | None, *, layers: int, launch_ms_per_layer: float, per_token_ms: float):
    """The extra milliseconds of a step of `tokens` tokens above the largest captured size (numpy array)."""
    import numpy as np

    tokens = np.asarray(tokens, dtype=np.float64)
    if not largest:
        return np.zeros_like(tokens)
    return np.where(tokens > largest, layers * launch_ms_per_layer + per_token_ms * tokens, 0.0)


def eager_columns(tokens: float, largest: int | None, layers: int) -> tuple[float, float]:
    """The two design-matrix entries of the eager term for a step of `tokens` (launch, per token)."""
    if not largest or tokens <= largest:
        return 0.0, 0.0
    return float(layers), float(tokens)


def needed_capture_size(tokens: int) -> int:
    """The capture size the toolkit would set to hold a verify batch of `tokens` (capture.capture_size's
    rounding: the next power of two, at least 8)."""
    from rocm_dspark.recipe.capture import MIN_CAPTURE

    return max(MIN_CAPTURE, 1 << (tokens - 1).bit_length())


def overrun_cells(result, largest: int | None) -> list[tuple[int, int, int]]:
    """(concurrency, K, verify tokens) of every planned fixed-K cell (and the block arm) whose full verify
    batch, batch x (1+K) per DP rank, exceeds the largest captured size."""
    if not largest:
        return []
    out = []
    for row in result.rows:
        per_rank = -(-row.batch // max(1, min(result.dp, row.batch)))
        for k in sorted(row.fixed):
            tokens = per_rank * (1 + k)
            if tokens > largest:
                out.append((row.concurrency, k, tokens))
    return out


def capture_notes(result, cost, rerun) -> list[str]:
    """The plan's capture lines: which cells leave the graphs (also kept as result.capture_overruns), and
    the payoff verdict's capture assumption. `rerun(capture_size, concurrencies)` plans the same profile
    with another capture size; it is called only when adaptive "pays" where block verification overruns."""
    largest = int(cost.capture_sizes[-1]) if cost.capture_sizes else None
    cells = overrun_cells(result, largest)
    result.capture_overruns = [
        {"concurrency": c, "k": k, "verify_tokens": t, "needed_capture_size": needed_capture_size(t)}
        for c, k, t in cells
    ]
    if not largest:
        return []
    if not cells:
        return [
            f"capture: every planned verify batch fits the largest captured size {largest}, so no verdict "
            f"below leans on a batch leaving the graphs"
        ]
    by_c: dict[int, list[int]] = {}
    for c, k, _ in cells:
        by_c.setdefault(c, []).append(k)
    worst = max(t for _, _, t in cells)
    shown = "; ".join(f"c{c} K{ks[0]}" + (f"-{ks[-1]}" if len(ks) > 1 else "") for c, ks in sorted(by_c.items()))
    notes = [
        f"capture overrun: verify batches above the largest captured size {largest} run without a full graph "
        f"(eager/piecewise term priced): {shown}; a capture size of {needed_capture_size(worst)} would hold "
        f"them all (up to {worst} tokens)"
    ]
    block = {c: t for c, k, t in cells if k == result.gamma}
    paying = [r for r in result.rows if r.concurrency in block and result.payoff(r) == "pays"]
    if paying:
        size = needed_capture_size(max(block[r.concurrency] for r in paying))
        other = rerun(size, [r.concurrency for r in paying])
        gone = [(r, o) for r, o in zip(paying, other.rows) if other.payoff(o) != "pays"]
        if gone:
            shown = ", ".join(
                f"c{r.concurrency} ({result.adaptive_gain_pct(r):+.1f}% -> "
                f"{other.adaptive_gain_pct(o):+.1f}%, {other.payoff(o)})"
                for r, o in gone
            )
            notes.append(
                f"capture assumption: adaptive verification pays at {shown} only because fixed K="
                f"{result.gamma} overruns the capture size {largest}; a capture size of {size} removes "
                f"the advantage there"
            )
        else:
            notes.append(
                f"capture assumption: adaptive verification still pays at "
                f"{', '.join(f'c{r.concurrency}' for r in paying)} with a capture size of {size} that "
                f"holds fixed K={result.gamma}"
            )
    return notes
