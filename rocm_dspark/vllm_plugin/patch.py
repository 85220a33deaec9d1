"""The backport of vllm#58151 onto vLLM 0.30-0.32: declarations on vLLM's own classes, no kernel, no metadata.

On a release whose capability entry (recipes/vllm.yaml `backport`) names them, this adds what 0.33.0 added for
DeepSeek-V4.1 adaptive verification (AV) on ROCm (side by side: docs/adaptive-verification.md, "The plugin"):

* The compressed sparse-MLA and sparse-SWA builders answer ALWAYS to `get_cudagraph_support` under AV (0.33
  `models/deepseek_v41/amd/rocm.py` `DeepseekV41ROCMAiter{MLASparse,SparseSWA}MetadataBuilder`). Here: a
  declaration-only subclass of the builder each backend's `get_builder_cls()` returns, returned by it instead, as
  0.33 wires its own; the backends, and the names vLLM compares (`ROCM_FLASHMLA_SPARSE_DSV4`, attention.py /
  amd/model.py), stay vLLM's.
* `supports_device_cpu_query_lens_mismatch()` = V4's `is_rocm() or ...` on every indexer backend the entry names,
  the MXFP4 one included (0.33 drops V4.1's override with V3.2's CUDA-only answer); explicit, so it works whether
  the release overrides (0.31/0.32) or inherits (0.30).
* K=1 only: `_rocm_supports_flattened_device_query_lens` also accepts `DeepseekV41ForCausalLM` where the entry
  names it (0.31+); 0.30 has none, so K=1 stays refused there (the indexer builder keeps UNIFORM_BATCH: fail-closed).

Why declarations are enough: vLLM's own builders already build every role from the device query_start_loc
(docs/adaptive-verification.md; tests/slow/test_backport_real.py checks it on vLLM's classes).

vLLM's ROCm module imports torch, triton and aiter, so `register()` installs an import hook and the patch
lands right after vLLM imports that module. Every patched object carries MARKER (what it replaced), so
patching is idempotent and `unpatch` restores vLLM's classes exactly.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys

ATTENTION_CLASS = "DeepseekV41ROCMAiterMLAAttention"
#: (role, attribute of ATTENTION_CLASS holding the backend whose builder gets the declaration)
BUILDER_ROLES = (("compressed sparse-MLA", "backend_cls"), ("sliding-window (SWA)", "swa_backend_cls"))
MISMATCH = "supports_device_cpu_query_lens_mismatch"
V41_ARCH = "DeepseekV41ForCausalLM"
#: Set on every class or module we change: the object it replaced (_ABSENT: the attribute was inherited).
MARKER = "rocm_dspark_backport"
_ABSENT = "inherited"

logger = logging.getLogger("rocm_dspark.vllm_plugin")


def _av_on(vllm_config) -> bool:
    spec = getattr(vllm_config, "speculative_config", None)
    return bool(spec is not None and getattr(spec, "enable_adaptive_verification", False))


def declared_builder(base_builder: type) -> type:
    """vLLM 0.33's declaration on `base_builder`: ALWAYS under AV, the base's own answer otherwise."""
    from vllm.v1.attention.backend import AttentionCGSupport

    class Declared(base_builder):
        @classmethod
        def get_cudagraph_support(cls, vllm_config, kv_cache_spec):
            if _av_on(vllm_config):
                return AttentionCGSupport.ALWAYS
            return super().get_cudagraph_support(vllm_config, kv_cache_spec)

    Declared.__name__ = Declared.__qualname__ = "RocmDspark" + base_builder.__name__
    Declared.__module__ = __name__
    setattr(Declared, MARKER, base_builder)
    return Declared


def _set(owner, name: str, value) -> None:
    """Replace owner.name, remembering vLLM's own (once) in owner.MARKER[name]."""
    if MARKER not in vars(owner):
        setattr(owner, MARKER, {})
    vars(owner)[MARKER].setdefault(name, vars(owner).get(name, _ABSENT))
    setattr(owner, name, value)


def _restore(owner) -> bool:
    saved = vars(owner).get(MARKER)
    if not isinstance(saved, dict):
        return False
    for name, original in saved.items():
        if original == _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    delattr(owner, MARKER)
    return True


def _in_this_vllm(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:  # a parent package of that name is not in this vLLM
        return False


def _indexer_backend(backport: dict, ref: str):
    """'Class' (in indexer_module) or 'module:Class'; None when that module is not in this vLLM."""
    module_name, _, cls = ref.rpartition(":") if ":" in ref else (backport["indexer_module"], "", ref)
    return getattr(importlib.import_module(module_name), cls) if _in_this_vllm(module_name) else None


def _rocm_or(original):
    def supports_device_cpu_query_lens_mismatch(cls) -> bool:
        # vLLM 0.33 (#58151): V4.1 inherits V4's answer; ROCm flattens per token from device decode lengths.
        from vllm.platforms import current_platform

        return bool(current_platform.is_rocm()) or bool(original())

    return classmethod(supports_device_cpu_query_lens_mismatch)


def _k1_predicate(original):
    def rocm_supports_flattened_device_query_lens(vllm_config) -> bool:
        from vllm.platforms import current_platform

        model_config = vllm_config.model_config
        return bool(original(vllm_config)) or bool(
            current_platform.is_rocm() and model_config is not None and V41_ARCH in model_config.architectures
        )

    return rocm_supports_flattened_device_query_lens


def patch_module(rocm, backport: dict) -> list[str]:
    """Apply the backport to vLLM's imported ROCm module; idempotent. Returns what it changed, one line each
    (empty when everything was already in place)."""
    changed = []
    attn = getattr(rocm, ATTENTION_CLASS)
    for role, attr in BUILDER_ROLES:
        backend = getattr(attn, attr)
        if MARKER in vars(backend):
            continue
        base = backend.get_builder_cls()
        declared = declared_builder(base)
        _set(backend, "get_builder_cls", staticmethod(lambda declared=declared: declared))
        changed.append(
            f"{role}: {backend.__name__}.get_builder_cls() -> {declared.__name__} "
            f"(subclass of vLLM's {base.__name__}: ALWAYS under AV, else vLLM's answer)"
        )
    for ref in backport["indexer_backends"]:
        backend = _indexer_backend(backport, ref)
        if backend is None or MARKER in vars(backend):
            continue
        _set(backend, MISMATCH, _rocm_or(getattr(backend, MISMATCH)))
        changed.append(f"indexer: {backend.__name__}.{MISMATCH}() -> is_rocm() or vLLM's answer")
    name = backport.get("k1_predicate")
    if name:
        indexer = importlib.import_module(backport["indexer_module"])
        if MARKER not in vars(indexer):
            if not hasattr(indexer, name):
                raise AttributeError(f"{indexer.__name__} has no {name} (recipes/vllm.yaml backport.k1_predicate)")
            _set(indexer, name, _k1_predicate(getattr(indexer, name)))
            changed.append(f"indexer (K=1): {name}() also accepts {V41_ARCH} on ROCm under AV")
    return changed


def k1_state(backport: dict) -> str:
    """One line: what K=1 does with this release and the plugin."""
    if backport.get("k1_predicate"):
        return f"K=1 flattens under AV ({backport['k1_predicate']} extended to {V41_ARCH})"
    return (
        "K=1 stays refused: this release's indexer has no ROCm flatten predicate, so its builder keeps "
        "UNIFORM_BATCH at next_n=2 (use K>=2)"
    )


def unpatch_module(rocm, backport: dict) -> bool:
    """Put vLLM's own classes back (for `plugin status` and tests). True if something changed."""
    attn = getattr(rocm, ATTENTION_CLASS)
    owners = [getattr(attn, attr) for _, attr in BUILDER_ROLES]
    owners += [b for b in (_indexer_backend(backport, r) for r in backport["indexer_backends"]) if b is not None]
    owners.append(importlib.import_module(backport["indexer_module"]))
    return any([_restore(o) for o in owners])


def is_patched(rocm) -> bool:
    attn = getattr(rocm, ATTENTION_CLASS)
    return all(MARKER in vars(getattr(attn, attr)) for _, attr in BUILDER_ROLES)


def _patch_and_log(module, backport: dict) -> None:
    try:
        changed = patch_module(module, backport)
    except Exception as exc:  # noqa: BLE001 - never break vLLM's import; say why instead
        logger.warning(
            "rocm-dspark: could not backport vllm#58151 onto %s (%s: %s); vLLM's classes may be "
            "partly patched, so adaptive verification must stay off",
            module.__name__,
            type(exc).__name__,
            exc,
        )
        return
    if changed:
        logger.info(
            "rocm-dspark: backported vllm#58151 (declarations only, vLLM's kernels and builders): %s; %s",
            "; ".join(changed),
            k1_state(backport),
        )


def run_after_exec(loader, after) -> None:
    """Make this one `loader` call after(module) right after it executes a module (other loaders keep theirs)."""
    exec_module = loader.exec_module

    def exec_then(module):
        exec_module(module)
        after(module)

    loader.exec_module = exec_then


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds one of the backport's ROCm modules through the other finders and patches it after it executes."""

    def __init__(self, backport: dict):
        self.backport = backport

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.backport["rocm_modules"]:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            backport = self.backport
            run_after_exec(spec.loader, lambda module: _patch_and_log(module, backport))
        return spec


def patch_now_or_on_import(backport: dict) -> str:
    """'patched' (module already imported), 'already' (patched before), 'hooked' (on import) or 'failed'."""
    for name in backport["rocm_modules"]:
        module = sys.modules.get(name)
        if module is not None:
            if is_patched(module):
                return "already"
            _patch_and_log(module, backport)
            return "patched" if is_patched(module) else "failed"
    if any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        return "already"
    sys.meta_path.insert(0, _PatchOnImport(backport))
    return "hooked"


def import_target(backport: dict):
    """The first of the backport's ROCm module names this vLLM has, imported."""
    for name in backport["rocm_modules"]:
        if _in_this_vllm(name):
            return importlib.import_module(name)
    raise ImportError(f"none of {', '.join(backport['rocm_modules'])} is in this vLLM")
