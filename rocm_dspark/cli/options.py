"""The selection flags shared by `recipe`, `launch`, `probe` and `validate`, and their turning into a plan."""

from __future__ import annotations

import functools
import os
import sys

import click

from rocm_dspark.cli import bounds
from rocm_dspark.errors import EXIT_ENVIRONMENT, EXIT_USAGE, EnvironmentFailure, UsageError, warn
from rocm_dspark.recipe.selection import SELECTION_KEYS


def selection_options(fn):
    """Add the selection flags; the command receives them as keyword arguments."""
    opts = [
        click.option("--model", "-m", required=True, help="Model name or alias, e.g. V4.1-Flash."),
        click.option("--gpu", default=None,
                     help="GPU: a recipes/gpus.yaml key (see `rocm-dspark list`); detected with amd-smi/rocminfo when omitted."),
        click.option("--gpus-per-node", type=bounds.GPUS_PER_NODE, default=None, help="GPUs per node (default: the GPU's usual 8)."),
        click.option("--nodes", type=bounds.NODES, default=1, show_default=True, help="Number of nodes (data parallel across nodes)."),
        click.option("--head-address", default=None, help="IP of node 0, needed with --nodes > 1."),
        click.option("--tp", type=bounds.RANKS, default=None, help="Tensor parallel size (default: the profile's)."),
        click.option("--dp", type=bounds.RANKS, default=None, help="Data parallel size (default: the profile's)."),
        click.option("--ep", type=bounds.RANKS, default=None, help="Expert parallel size: 1 (off) or tp x dp."),
        click.option("--max-num-seqs", type=bounds.SEQS, default=None, help="Max concurrent sequences (default: the profile's)."),
        click.option("--max-num-batched-tokens", type=bounds.TOKENS, default=None, help="Token budget per step (default: the profile's)."),
        click.option("--num-speculative-tokens", "-k", "num_speculative_tokens", default=None,
                     help="DSpark draft length K, 1..block size (default: the block size, 5)."),
        click.option("--k-per-batch-size", "k_schedule", default=None, metavar="LO-HI:K[,...]",
                     help="Per-batch-size K (vLLM num_speculative_tokens_per_batch_size), e.g. 1-16:5,17-64:4,65-128:2: "
                          "what `plan` prints when it recommends one."),
        click.option("--no-speculation", is_flag=True, default=False,
                     help="Serve the target model without a DSpark draft (what `plan` prints when drafting does not pay)."),
        click.option("--capture-cap", type=bounds.SEQS, default=None, help="Upper bound for the graph capture size (default: the profile's, 2048)."),
        click.option("--vllm-version", default=None, help="vLLM release (e.g. 0.33.0) or build name to plan for; maps onto a build in recipes/vllm.yaml."),
        click.option("--build", default=None, help="vLLM build to plan for (recipes/vllm.yaml; default: the GPU arch's release there, the first "
                          "tag the registry holds per `rocm-dspark images`)."),
        click.option("--concurrency", default=None, metavar="C[,C...]", callback=_largest_level,
                     help="Expected concurrent requests: drives the workload rules in the recipe (batch tokens, Engram "
                          "offload). A list (as plan and up take) sizes the plan for its largest level."),
        click.option("--memory-override", is_flag=True, default=False,
                     help="Emit the plan even when the memory model finds no room for KV cache (recorded in the notes)."),
        click.option("--adaptive", type=click.Choice(["auto", "off", "on"]), default="auto", show_default=True,
                     help="auto: on only with a matching, complete probe record; off: block verification; on: require a record."),
        click.option("--state-dir", default=None, help="Where rocm-dspark keeps its state: probe and A/B records, registry "
                     "answers, up's steps (default: $ROCM_DSPARK_STATE_DIR or the XDG state dir)."),
        click.option("--benchmark-synthetic", type=bounds.ACCEPTANCE, default=None, metavar="AL",
                     help="Benchmark only: synthetic acceptance length AL instead of real rejection. Never for serving."),
        click.option("--model-path", default=None, help="Serve from this local path instead of the Hugging Face id."),
        click.option("--served-model-name", "served_name", default=None, help="Name clients use (default: the HF id)."),
        click.option("--host", default=None, help="Address to bind (default: 0.0.0.0)."),
        click.option("--port", type=bounds.PORT, default=None, help="Port (default: 8000)."),
        click.option("--vllm-arg", "extra_args", multiple=True, metavar="--FLAG[=VALUE]",
                     help="Extra vLLM flag, applied last (repeatable)."),
        click.option("--env", "extra_env", multiple=True, metavar="KEY=VALUE", help="Extra environment variable (repeatable)."),
        click.option("--image", default=None, metavar="REF",
                     help="Run this image instead of the build's; the plan follows the vLLM the image reports."),
        click.option("--registry", default=None, metavar="HOST[:PORT]", envvar="ROCM_DSPARK_REGISTRY",
                     help="A mirror: every image maps to the same repository and tag there ($ROCM_DSPARK_REGISTRY)."),
    ]
    # A command's own option of the same name wins (validate's --concurrency is its sweep levels).
    taken = {p.name for p in getattr(fn, "__click_params__", [])}
    for opt in reversed(opts):
        fn = opt(fn)  # click appends the option to fn.__click_params__
        if fn.__click_params__[-1].name in taken:
            fn.__click_params__.pop()
    return fn


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


def _largest_level(ctx, param, value):
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
        raise UsageError(f"--model-path {path!r} does not exist on this machine; pass the directory that holds the "
                         f"checkpoint")
    warn(f"--model-path {path!r} does not exist here; vLLM fails to start unless it exists on the machine that runs it")


def fail(message: str, code: int = EXIT_USAGE):
    click.echo(f"rocm-dspark: error: {message}", err=True)
    sys.exit(code)


def usage_errors(fn):
    """Turn UsageError into one line on stderr and exit status 2, EnvironmentFailure into exit status 3."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UsageError as exc:
            fail(str(exc))
        except EnvironmentFailure as exc:
            fail(str(exc), EXIT_ENVIRONMENT)

    return wrapper
