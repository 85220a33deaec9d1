"""The selection flags shared by `recipe`, `launch`, `probe` and `validate`, and their turning into a plan."""

from __future__ import annotations

import os

import click

from rocm_dspark.cli import bounds
from rocm_dspark.errors import UsageError, warn
from rocm_dspark.recipe.options import CLUSTER_OPTIONS, SELECTION_KEYS, SELECTION_OPTIONS, Opt


def _click_option(o: Opt):
    """One click option from its record (rocm_dspark.recipe.options)."""
    kw: dict = {"help": o.help, "show_default": o.show_default}
    if o.default is not None:  # click 8.3: an explicit default=None counts as given, so a required one never fails
        kw["default"] = o.default
    if o.switch:
        kw["is_flag"] = True
    elif o.choices:
        kw["type"] = click.Choice(list(o.choices))
    elif o.type:
        kw["type"] = getattr(bounds, o.type)
    for name in ("multiple", "metavar", "envvar", "required"):
        if getattr(o, name):
            kw[name] = getattr(o, name)
    if o.callback:
        kw["callback"] = globals()[o.callback]
    return click.option(*o.flags, o.key, **kw)


def _add(fn, records):
    # A command's own option of the same name wins (validate's --concurrency is its sweep levels).
    taken = {p.name for p in getattr(fn, "__click_params__", [])}
    for o in reversed(records):
        if o.key not in taken:
            fn = _click_option(o)(fn)
    return fn


def selection_options(fn):
    """Add the selection flags; the command receives them as keyword arguments."""
    return _add(fn, SELECTION_OPTIONS)


def cluster_options(fn):
    """Add the strategy flags shared by `recipe` and `launch` (rocm_dspark.recipe.strategies, rocm_dspark.recipe.cluster)."""
    return _add(fn, CLUSTER_OPTIONS)


def concurrency_levels(value: str | None) -> tuple[int, ...] | None:
    """`--concurrency N,N,...` (recipe, validate, up) -> the levels; None when not given."""
    if not value:
        return None
    try:
        levels = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise UsageError(f"--concurrency {value!r}: give comma-separated positive integers, e.g. 1,16,64,128") from None
    if not levels or any(c < 1 for c in levels):
        raise UsageError(f"--concurrency {value!r}: every level must be at least 1")
    return bounds.check_levels(levels)


def largest_level(ctx, param, value):
    """`--concurrency C[,C...]` -> the largest level: one plan serves them all, and the workload rules are
    thresholds that the largest level crosses first (as `up` sizes its plan)."""
    if value is None or isinstance(value, int):
        return value
    try:
        levels = concurrency_levels(value)
        if levels is None:  # an empty value (an unset shell variable?)
            raise UsageError(f"--concurrency {value!r}: give comma-separated positive integers, e.g. 1,16,64,128")
        return max(levels)
    except UsageError as exc:
        raise click.BadParameter(str(exc).partition(": ")[2] or str(exc)) from None


def pop_selection(kwargs: dict, keep: tuple[str, ...] = ()) -> dict:
    """Split the selection flags out of a command's kwargs (`keep`: the command's own options of that name)."""
    return {k: kwargs.pop(k) for k in SELECTION_KEYS if k in kwargs and k not in keep}


def check_model_path(opts: dict, runs_here: bool) -> None:
    """--model-path names a directory on the machine that runs vLLM: one missing here is refused where the command
    runs vLLM here, and warned about where the plan may be for another machine."""
    path = opts.get("model_path")
    if not path or not path.strip() or path.startswith("-") or os.path.exists(os.path.expanduser(path)):
        return  # empty and '-x' are the resolver's to refuse, in one line
    if runs_here:
        raise UsageError(
            f"--model-path {path!r} does not exist on this machine; pass the directory that holds the checkpoint"
        )
    warn(f"--model-path {path!r} does not exist here; vLLM fails to start unless it exists on the machine that runs it")
