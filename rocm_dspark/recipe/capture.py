"""The graph capture-size rule (why, with vLLM's sources: docs/capture.md).

A verify step carries (1+K) tokens per request, so a full decode batch of max_num_seqs x (1+K) tokens outgrows
vLLM's ROCm default ceiling of 512: the plan passes --max-cudagraph-capture-size, rounded up to a power of two
(768 -> 1024, as the official recipe does), which vLLM's capture grid keeps as given.
"""

from __future__ import annotations

from rocm_dspark.errors import UsageError

MIN_CAPTURE = 8


def vllm_capture_grid(max_size: int, max_num_batched_tokens: int | None = None) -> list[int]:
    """The sizes vLLM's _set_cudagraph_sizes keeps for a given max (config/vllm.py, 0.33)."""
    if max_num_batched_tokens is not None:
        max_size = min(max_size, max_num_batched_tokens)
    grid = [s for s in (1, 2, 4) if s <= max_size]
    grid += list(range(8, min(max_size + 1, 256), 8))
    grid += list(range(256, max_size + 1, 16))
    if max_num_batched_tokens is not None and max_num_batched_tokens <= max_size and max_num_batched_tokens not in grid:
        grid.append(max_num_batched_tokens)
    return sorted(grid)


def capture_size(max_num_seqs: int, k: int, cap: int) -> int:
    """Smallest power of two >= max(8, max_num_seqs x (1+K)); an error above `cap`."""
    if max_num_seqs <= 0:
        raise UsageError(f"max_num_seqs must be positive, got {max_num_seqs}; pass e.g. --max-num-seqs 128")
    if k < 0:
        raise UsageError(f"K must not be negative, got {k}")
    tokens = max_num_seqs * (1 + k)
    size = MIN_CAPTURE
    while size < tokens:
        size *= 2
    if size > cap:
        fits = 1 << (cap.bit_length() - 1) if cap > 0 else 0  # the largest capture size the cap allows
        largest_mns = fits // (1 + k) if fits >= MIN_CAPTURE else 0
        what = (
            f"use --max-num-seqs {largest_mns} or less, a smaller --num-speculative-tokens, or raise the cap"
            if largest_mns
            else f"raise the cap to at least {max(MIN_CAPTURE, 1 << (k.bit_length()))}"
        )
        raise UsageError(
            f"capture size {size} (max_num_seqs {max_num_seqs} x (1+K={1 + k}) = {tokens}, rounded up to a "
            f"power of two, at least {MIN_CAPTURE}) exceeds the cap {cap}; {what} with --capture-cap"
        )
    return size
