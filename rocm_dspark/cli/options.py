"""The selection flags shared by `recipe`, `launch`, `probe` and `validate`, and their turning into a plan."""

from __future__ import annotations

import functools
import os
import sys

import click

from rocm_dspark.errors import UsageError

GPU_CHOICES = ("mi300x", "mi325x", "mi350x", "mi355x")


def _env_pair(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key or not (key[0].isalpha() or key[0] == "_") or not all(c.isalnum() or c == "_" for c in key):
        raise UsageError(f"--env {value!r} must be KEY=VALUE with a valid variable name")
    return key, val


def selection_options(fn):
    """Add the selection flags; the command receives them as keyword arguments."""
    opts = [
        click.option("--model", "-m", required=True, help="Model name or alias, e.g. V4.1-Flash."),
        click.option("--gpu", type=click.Choice(GPU_CHOICES, case_sensitive=False), default=None,
                     help="GPU model; detected with amd-smi/rocminfo when omitted."),
        click.option("--gpus-per-node", type=int, default=None, help="GPUs per node (default: the GPU's usual 8)."),
        click.option("--nodes", type=int, default=1, show_default=True, help="Number of nodes (data parallel across nodes)."),
        click.option("--head-address", default=None, help="IP of node 0, needed with --nodes > 1."),
        click.option("--tp", type=int, default=None, help="Tensor parallel size (default: the profile's)."),
        click.option("--dp", type=int, default=None, help="Data parallel size (default: the profile's)."),
        click.option("--ep", type=int, default=None, help="Expert parallel size: 1 (off) or tp x dp."),
        click.option("--max-num-seqs", type=int, default=None, help="Max concurrent sequences (default: the profile's)."),
        click.option("--max-num-batched-tokens", type=int, default=None, help="Token budget per step (default: the profile's)."),
        click.option("--num-speculative-tokens", "-k", "num_speculative_tokens", default=None,
                     help="DSpark draft length K, 1..block size (default: the block size, 5)."),
        click.option("--capture-cap", type=int, default=None, help="Upper bound for the graph capture size (default: the profile's, 2048)."),
        click.option("--vllm-version", default=None, help="vLLM version or build tag to plan for (default: the profile's pinned image)."),
        click.option("--adaptive", type=click.Choice(["auto", "off", "on"]), default="auto", show_default=True,
                     help="auto: on only with a matching, complete probe record; off: block verification; on: require a record."),
        click.option("--state-dir", default=None, help="Probe record directory (default: $ROCM_DSPARK_STATE_DIR or the XDG state dir)."),
        click.option("--benchmark-synthetic", type=float, default=None, metavar="AL",
                     help="Benchmark only: synthetic acceptance length AL instead of real rejection. Never for serving."),
        click.option("--model-path", default=None, help="Serve from this local path instead of the Hugging Face id."),
        click.option("--served-model-name", "served_name", default=None, help="Name clients use (default: the HF id)."),
        click.option("--host", default=None, help="Address to bind (default: 0.0.0.0)."),
        click.option("--port", type=int, default=None, help="Port (default: 8000)."),
        click.option("--vllm-arg", "extra_args", multiple=True, metavar="--FLAG[=VALUE]",
                     help="Extra vLLM flag, applied last (repeatable)."),
        click.option("--env", "extra_env", multiple=True, metavar="KEY=VALUE", help="Extra environment variable (repeatable)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


SELECTION_KEYS = (
    "model", "gpu", "gpus_per_node", "nodes", "head_address", "tp", "dp", "ep", "max_num_seqs",
    "max_num_batched_tokens", "num_speculative_tokens", "capture_cap", "vllm_version", "adaptive",
    "state_dir", "benchmark_synthetic", "model_path", "served_name", "host", "port", "extra_args", "extra_env",
)


def pop_selection(kwargs: dict) -> dict:
    """Split the selection flags out of a command's kwargs."""
    return {k: kwargs.pop(k) for k in SELECTION_KEYS if k in kwargs}


def _parse_k(value) -> int | None:
    if value is None:
        return None
    text = str(value).strip()
    if "," in text:
        raise UsageError(
            f"--num-speculative-tokens {text!r}: one K for every rank; data-parallel ranks must all use the "
            f"same K (vLLM agrees K across DP ranks), so a per-rank K is refused")
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--num-speculative-tokens {text!r} is not an integer in 1..5") from None


def _on_path(name: str) -> bool:
    # shutil.which would do, but importing shutil (bz2, lzma, ...) costs ~2 ms of the recipe's start-up.
    return any(os.access(os.path.join(d, name), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep) if d)


def _detect_gpu(catalog) -> str | None:
    """The catalog key of this host's AMD GPU, or None. The host module (and subprocess) is imported
    only where amd-smi or rocminfo exists: most machines that print a recipe have neither."""
    if not any(_on_path(tool) for tool in ("amd-smi", "rocminfo")):
        return None
    from rocm_dspark.host import detect_gpus, match_catalog_gpu

    return match_catalog_gpu(detect_gpus(), catalog.gpus)


def build_selection(opts: dict, catalog):
    """Flags -> Selection, detecting the GPU when --gpu is absent."""
    from rocm_dspark.resolve import Selection

    gpu, source = opts.get("gpu"), "flag"
    if gpu is None:
        gpu = _detect_gpu(catalog)
        source = "detected" if gpu else "default"
    return Selection(
        model=opts["model"], gpu=gpu.lower() if gpu else None, gpu_source=source,
        gpus_per_node=opts.get("gpus_per_node"), nodes=opts.get("nodes") or 1,
        head_address=opts.get("head_address"), tp=opts.get("tp"), dp=opts.get("dp"), ep=opts.get("ep"),
        max_num_seqs=opts.get("max_num_seqs"), max_num_batched_tokens=opts.get("max_num_batched_tokens"),
        num_speculative_tokens=_parse_k(opts.get("num_speculative_tokens")), capture_cap=opts.get("capture_cap"),
        vllm_version=opts.get("vllm_version"), benchmark_synthetic=opts.get("benchmark_synthetic"),
        model_path=opts.get("model_path"), served_name=opts.get("served_name"), host=opts.get("host"),
        port=opts.get("port"), extra_args=tuple(opts.get("extra_args") or ()),
        extra_env=tuple(_env_pair(e) for e in opts.get("extra_env") or ()),
    )


def verdict_for(opts: dict, catalog, selection):
    """--adaptive off: not proven by choice; auto/on: ask the probe gate (which reads the record store)."""
    from rocm_dspark.resolve import Verdict

    mode = opts.get("adaptive") or "auto"
    if mode == "off":
        return Verdict.not_proven("--adaptive off forces block verification")
    if opts.get("benchmark_synthetic") is not None:
        return Verdict.not_proven("synthetic benchmark mode")
    from rocm_dspark.probe.gate import gate_verdict

    verdict = gate_verdict(catalog, selection, state_dir=opts.get("state_dir"))
    if mode == "on" and not verdict.adaptive_proven:
        raise UsageError(f"--adaptive on needs a probe record proving adaptive verification on this host: {verdict.reason}; run `rocm-dspark probe`")
    return verdict


def plan_from_options(opts: dict):
    """Selection flags -> LaunchPlan (the one path every command uses)."""
    from rocm_dspark.catalog import load_catalog
    from rocm_dspark.resolve import resolve

    catalog = load_catalog()
    selection = build_selection(opts, catalog)
    return resolve(catalog, selection, verdict_for(opts, catalog, selection))


def fail(message: str, code: int = 2):
    click.echo(f"rocm-dspark: error: {message}", err=True)
    sys.exit(code)


def usage_errors(fn):
    """Turn UsageError into one line on stderr and exit status 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UsageError as exc:
            fail(str(exc))

    return wrapper
