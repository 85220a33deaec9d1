"""The one `rocm-dspark recipe` command that applies a recommendation `plan` printed, checked
by resolving it: `plan` never prints an option that `recipe` would refuse without saying so."""

from __future__ import annotations

from rocm_dspark.recipe.k_schedule import format_schedule
from rocm_dspark.recipe.options import selection_argv


def _option_values(speculative_config: dict) -> tuple[dict, str | None]:
    """(the `recipe` option values that select it, the vLLM change a build needs for it)."""
    if not speculative_config:
        return {"no_speculation": True}, None
    if speculative_config.get("enable_adaptive_verification"):
        return {"adaptive": "on"}, "adaptive"
    k = {"num_speculative_tokens": str(speculative_config.get("num_speculative_tokens"))}
    schedule = speculative_config.get("num_speculative_tokens_per_batch_size")
    if schedule:
        return {**k, "k_schedule": format_schedule(schedule)}, "per-batch-size K"
    return k, None


def apply_command(catalog, model, gpu_key: str, speculative_config: dict) -> tuple[list[str], str | None]:
    """The `rocm-dspark recipe` command that applies a `plan` recommendation, checked by resolving it: on the
    profile's own build, else on the first build that contains what it needs. (argv, None) when it resolves,
    (argv, why not) when no build does."""
    from rocm_dspark.errors import UsageError
    from rocm_dspark.recipe.resolve import resolve_plan
    from rocm_dspark.recipe.selection import build_selection

    values, change = _option_values(speculative_config)
    words = selection_argv(values)  # the flags in the options' order, as `recipe --help` lists them
    base = ["rocm-dspark", "recipe", "--model", model.key, "--gpu", gpu_key]
    change = {"adaptive": catalog.adaptive_change, "per-batch-size K": catalog.dynamic_k_change}.get(change, change)
    tries = [[]] + [
        ["--build", name] for name, b in catalog.builds.items() if change and catalog.contains(b, change) is True
    ]
    why = None
    for extra in tries:
        opts = {"model": model.key, "gpu": gpu_key, **values, **({"build": extra[1]} if extra else {})}
        try:
            resolve_plan(catalog, build_selection(opts, catalog))
        except UsageError as exc:
            why = str(exc)  # the last build's reason: it had what the option needs
            continue
        return base + extra + words, None
    return base + words, why
