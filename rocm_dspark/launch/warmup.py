"""Warm before ready: the requests a launcher sends once /v1/models answers and before it says "ready: serving"
(templates/launcher.sh.tmpl, warm_up), so that the batch sizes the plan serves have run once before traffic.

vLLM's own warm-up runs dummy inputs (KernelConfig.enable_jit_warmup, vllm/config/kernel.py:291 in 0.32.0, :296
in 0.33.0; vllm/v1/worker/gpu_worker.py:936-957), then its JIT monitor (:1078) logs every later compile. Ours are
real requests in batches of 1, 2, 4, ... up to max_num_seqs, so the last decode step reaches max_num_seqs x (1+K),
what the capture size covers (recipe/capture.py): a kernel that still compiles for such a shape does so before
ready, not in traffic. docs/compile-cache.md, "Warm before ready", has the whole story.

Short on purpose: max_tokens just past two verify steps, ignore_eos so each request runs its full length.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from rocm_dspark.recipe.plan import Command

PROMPT = "Warm-up request: count from one to ten."
MIN_TOKENS = 8  # a few decode steps even without speculative decoding


class Warmup(NamedTuple):
    batches: tuple[int, ...]  # requests sent together, one batch after the other
    step: int  # tokens one request adds to a decode step: 1 + K
    capture: int | None  # the largest captured size: 0 eager (no graphs), None vLLM's default
    max_num_seqs: int | None  # None: the plan leaves it to vLLM's default, which this module does not guess

    @property
    def step_sizes(self) -> tuple[int, ...]:
        """Tokens in the decode step of each batch: the capture sizes these requests exercise."""
        return tuple(b * self.step for b in self.batches)

    @property
    def max_tokens(self) -> int:
        return max(MIN_TOKENS, 2 * self.step)

    def says(self) -> str:
        """What the launcher's log line says was exercised (one line)."""
        sizes = ", ".join(map(str, self.step_sizes))
        graphs = (
            "no graphs (--enforce-eager)"
            if self.capture == 0
            else f"the plan's capture size {self.capture}"
            if self.capture
            else "vLLM's default capture sizes"
        )
        seqs = f"max_num_seqs {self.max_num_seqs}" if self.max_num_seqs else "max_num_seqs not set by the plan"
        return (
            f"{sum(self.batches)} requests in batches of {', '.join(map(str, self.batches))}: capture sizes "
            f"exercised {sizes} (a decode step of batch x (1+K={self.step}) tokens); {seqs}, {graphs}"
        )


def batches(max_num_seqs: int | None) -> tuple[int, ...]:
    """1, 2, 4, ... below max_num_seqs, then max_num_seqs; (1,) when the plan does not set it."""
    if not max_num_seqs or max_num_seqs < 1:
        return (1,)
    return (*(1 << i for i in range((max_num_seqs - 1).bit_length())), max_num_seqs)


def _int(cmd: Command, dest: str) -> int | None:
    v = cmd.value(dest)
    return int(v) if isinstance(v, str) and v.isdigit() else None


def plan_warmup(argv, capture_size: int = 0) -> Warmup:
    """The warm-up of one command (block and adaptive can differ in K): from its own flags."""
    cmd = Command.from_words(argv)
    spec = cmd.spec_config() or {}
    k = spec.get("num_speculative_tokens")
    k = k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else 0
    seqs = _int(cmd, "max_num_seqs")
    capture = 0 if cmd.bool_flag("enforce_eager") else (_int(cmd, "max_cudagraph_capture_size") or capture_size or None)
    return Warmup(batches(seqs), 1 + k, capture, seqs)


def body(served_name: str, max_tokens: int) -> str:
    """The /v1/completions request body, as JSON (the launcher sends it as is)."""
    return json.dumps(
        {"model": served_name, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
        ensure_ascii=False,
        separators=(",", ":"),
    )
