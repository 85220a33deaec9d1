"""Bounds for every numeric option: each has a range and a one-line error, never a traceback or a run that
never ends (`--nodes 1000000000` built a billion commands; a 400-digit `--max-num-batched-tokens` overflowed
a float). The ranges are sanity bounds, far above any real deployment, not tuning advice; the library keeps
its own checks for the values inside them (a TP that does not divide the heads, ...). Text and path options
refuse an empty value (NonEmpty)."""

from __future__ import annotations

import math

import click

from rocm_dspark.errors import UsageError

MAX_NODES = 1024  # x up to 64 GPUs a node: 65,536 ranks
MAX_GPUS_PER_NODE = 64
MAX_RANKS = MAX_NODES * MAX_GPUS_PER_NODE
MAX_SEQS = 1 << 20  # max_num_seqs, --concurrency, capture sizes
MAX_TOKENS = (1 << 31) - 1  # vLLM indexes token budgets with int32
MAX_SECONDS = 7 * 24 * 3600  # every timeout and deadline: a week


def _show(value) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return text if len(text) <= 24 else f"a {len(text)}-digit number"


def _name(param) -> str:
    return max(param.opts, key=len) if param is not None and param.opts else "the value"


class _Bounded(click.ParamType):
    def __init__(self, lo, hi, unit: str | None = None):
        self.lo, self.hi, self.unit = lo, hi, unit

    def _in_range(self, number, param):
        """`number`, or a one-line UsageError naming the bound it crosses (a unit words the lower one)."""
        name, shown = _name(param), _show(number)
        if number > self.hi:
            raise UsageError(f"{name} must be at most {self.hi}, got {shown}")
        if number >= self.lo:
            return number
        if self.unit == "positive":
            raise UsageError(f"{name} must be a positive integer (at most {self.hi}), got {shown}")
        if self.unit:
            raise UsageError(f"{name} {shown} must be a positive number of {self.unit} (at most {self.hi})")
        raise UsageError(f"{name} must be at least {self.lo}, got {shown}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.lo}, {self.hi})"


class BoundedInt(_Bounded):
    """An integer in lo..hi; outside it, `--nodes must be at most 1024, got 1000000000`."""

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            if len(text) > 40:  # int() of thousands of digits is slow and past 4300 raises: say so in words
                digits = text.lstrip("+-")
                if not digits.isdigit() or not digits.isascii():
                    self.fail(f"{value[:40]!r}... is not a valid integer", param, ctx)
                kind, bound = ("at least", self.lo) if text.startswith("-") else ("at most", self.hi)
                sign = "negative " if text.startswith("-") else ""
                raise UsageError(f"{_name(param)} must be {kind} {bound}, got a {sign}{len(digits)}-digit number")
            try:
                number = int(text, 10)
            except ValueError:
                self.fail(f"{value!r} is not a valid integer", param, ctx)
        return self._in_range(number, param)


class BoundedFloat(_Bounded):
    """A finite number in lo..hi (nan and inf are refused: a comparison with nan is always false)."""

    name = "float"

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            self.fail(f"{value!r} is not a valid number", param, ctx)
        if not math.isfinite(number):
            raise UsageError(f"{_name(param)} must be a finite number in {self.lo:g}..{self.hi:g}, got {value}")
        return self._in_range(number, param)


NODES = BoundedInt(1, MAX_NODES)
GPUS_PER_NODE = BoundedInt(1, MAX_GPUS_PER_NODE, "positive")
RANKS = BoundedInt(1, MAX_RANKS, "positive")  # --tp, --dp, --ep
SEQS = BoundedInt(1, MAX_SEQS, "positive")  # --max-num-seqs, --concurrency, --capture-cap
TOKENS = BoundedInt(1, MAX_TOKENS, "positive")  # --max-num-batched-tokens, --max-tokens
PORT = BoundedInt(1, 65535)
NODE_RANK = BoundedInt(0, MAX_NODES - 1)
PREFILL_NODES = BoundedInt(1, MAX_NODES - 1)
REPLICAS = BoundedInt(1, MAX_GPUS_PER_NODE)  # --replicas: servers on one node (the library refuses 1)
SECONDS = BoundedFloat(1, MAX_SECONDS, "seconds")
INT_SECONDS = BoundedInt(1, MAX_SECONDS, "seconds")
COUNT = BoundedInt(1, 1_000_000)  # requests, questions, records to show
ACCEPTANCE = BoundedFloat(0, 64)  # an acceptance length: 1..1+K, K <= 16 (the library checks 1+K)


def check_levels(levels, flag: str = "--concurrency"):
    """Concurrency levels (recipe, validate, up and plan take the same ones): each in 1..MAX_SEQS."""
    if any(c > MAX_SEQS for c in levels):
        raise UsageError(f"{flag}: every level must be at most {MAX_SEQS}, got {_show(max(levels))}")
    return levels


class NonEmpty(click.ParamType):
    """A text or path option that refuses an empty value (an unset shell variable must not fall back to the
    default, docs/cli.md); otherwise the wrapped type's."""

    def __init__(self, inner: click.ParamType):
        self.inner, self.name = inner, inner.name

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            raise UsageError(
                f"{_name(param)} is empty (an unset shell variable?); give a value or leave the option out"
            )
        return self.inner.convert(value, param, ctx)

    def get_metavar(self, param, ctx):
        return self.inner.get_metavar(param, ctx)

    def shell_complete(self, ctx, param, incomplete):
        return self.inner.shell_complete(ctx, param, incomplete)


def refuse_empty(command: click.Command) -> click.Command:
    """Every text and path option of `command` refuses an empty value (the group applies it to each command)."""
    for param in command.params:
        if (
            isinstance(param, click.Option)
            and not param.is_flag
            and isinstance(param.type, (click.types.StringParamType, click.Path))
        ):
            param.type = NonEmpty(param.type)
    for sub in getattr(command, "commands", {}).values():
        refuse_empty(sub)
    return command
