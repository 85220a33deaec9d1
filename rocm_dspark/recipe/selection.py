"""Option values -> Selection: the operator's choices, with the GPU detected and this host's registry answers
read (the use case above it, rocm_dspark.usecase.launch_plan, goes on to the plan and the gate's verdict).

The keys are rocm_dspark.recipe.options' (the click options' names); nothing below the CLI imports click. Light imports
only: this is on the `rocm-dspark recipe` path.
"""

from __future__ import annotations

import os
import re
import time

from rocm_dspark.errors import UsageError, warn
from rocm_dspark.images import pick
from rocm_dspark.recipe.options import SELECTION_KEYS, SELECTION_OPTIONS
from rocm_dspark.recipe.plan import Selection

ADAPTIVE_MODES = next(o.choices for o in SELECTION_OPTIONS if o.key == "adaptive")


def env_pair(value: str) -> tuple[str, str]:
    """KEY=VALUE, or KEY alone: the value of KEY in this environment (so a secret stays off the command line)."""
    key, sep, val = value.partition("=")
    # ASCII letters, digits and '_', not starting with a digit: a C identifier, which Kubernetes' env var
    # names (printable ASCII), POSIX shells and systemd's EnvironmentFile= all take.
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise UsageError(
            f"--env {value!r} must be KEY=VALUE (or KEY, taken from this environment) with a variable "
            f"name of ASCII letters, digits and '_' (not starting with a digit)"
        )
    if not sep:
        if key not in os.environ:
            raise UsageError(f"--env {key}: {key} is not set in this environment; export it first or give {key}=VALUE")
        if not os.environ[key]:  # most likely a token that did not get exported: an empty one fails later, far away
            raise UsageError(
                f"--env {key}: {key} is set but empty in this environment; export its value, or give "
                f"{key}= to pass it empty on purpose"
            )
        return key, os.environ[key]
    from rocm_dspark.recipe.secret_env import is_credential

    if is_credential(key):  # the value is in shell history and `ps` now, though in none of our files
        warn(
            f"--env {key}=...: a secret on the command line is visible in shell history "
            f"and to other users (ps); export {key} and pass --env {key}, or write it into the 0600 env file"
        )
    return key, val


def parse_k(value) -> int | None:
    if value is None:
        return None
    text = str(value).strip()
    if "," in text:
        raise UsageError(
            f"--num-speculative-tokens {text!r}: one K for every rank; data-parallel ranks must all use the "
            f"same K (vLLM agrees K across DP ranks), so a per-rank K is refused"
        )
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--num-speculative-tokens {text!r} is not an integer in 1..5") from None


def _on_path(name: str) -> bool:
    # shutil.which would do, but importing shutil (bz2, lzma, ...) costs ~2 ms of the recipe's start-up.
    return any(os.access(os.path.join(d, name), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep) if d)


def detect_gpu(catalog) -> str | None:
    """The catalog key of this host's AMD GPU, or None. The host module (and subprocess) is imported
    only where amd-smi or rocminfo exists: most machines that print a recipe have neither."""
    if not any(_on_path(tool) for tool in ("amd-smi", "rocminfo")):
        return None
    from rocm_dspark.runtime.gpus import detect_gpus, match_catalog_gpu

    return match_catalog_gpu(detect_gpus(), catalog.gpus)


def build_selection(opts: dict, catalog) -> Selection:
    """Option values -> Selection, detecting the GPU when none is given. The GPU must be a catalog key. An option
    named as a Selection field is taken as given, unless read below."""
    gpu, source = opts.get("gpu"), "flag"
    if gpu is None:
        gpu = detect_gpu(catalog)
        source = "detected" if gpu else "default"
    else:
        gpu = catalog.find_gpu(gpu).key  # one line naming the known GPUs for anything else
    as_given = Selection(**{k: opts[k] for k in SELECTION_KEYS if k in opts and k in Selection._fields})
    return as_given._replace(
        gpu=gpu,
        gpu_source=source,
        nodes=opts.get("nodes") or 1,
        head_address=_head_address(opts.get("head_address")),
        num_speculative_tokens=parse_k(opts.get("num_speculative_tokens")),
        memory_override=bool(opts.get("memory_override")),
        extra_args=tuple(opts.get("extra_args") or ()),
        extra_env=tuple(env_pair(e) for e in opts.get("extra_env") or ()),
        images=_registry_answers(opts),
        today=time.strftime("%Y-%m-%d", time.gmtime()),
        k_schedule=_schedule(opts.get("k_schedule")),
        no_speculation=bool(opts.get("no_speculation")),
        image=pick.check_ref(opts["image"]) if opts.get("image") is not None else None,
        registry=pick.check_mirror(opts["registry"]) if opts.get("registry") else None,
        image_software=opts.get("image_software"),
    )


def _head_address(value):
    """--head-address on every path (legacy --nodes/--dp included): the strategies' one rule and message."""
    if value is None:
        return None
    from rocm_dspark.recipe.strategies import check_address

    return check_address(value)


def _registry_answers(opts: dict) -> tuple:
    """This host's cached registry answers (rocm_dspark.images.cache); () when there are none."""
    from rocm_dspark.images import cache
    from rocm_dspark.statedir import state_dir

    try:
        return cache.for_selection(state_dir(opts.get("state_dir")))
    except UsageError:  # no home directory: nothing recorded, the plan says "unresolved"
        return ()


def _schedule(value):
    if value is None:
        return None
    from rocm_dspark.recipe.k_schedule import parse_schedule

    return parse_schedule(value)
