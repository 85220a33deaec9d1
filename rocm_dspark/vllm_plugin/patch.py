"""Swap the SWA backend of vLLM's ROCm DeepSeek-V4.1 attention layer, now or when it is imported.

DeepSeek-V4.1 never asks the attention selector for its SWA backend: each layer reads the class
attribute `DeepseekV41ROCMAiterMLAAttention.swa_backend_cls` (so `--attention-backend` and
`register_backend()` cannot reach it). We replace that attribute. vLLM's ROCm module pulls in
torch, triton and aiter, so instead of importing it from `register()` we patch it right after
vLLM imports it (an import hook): a process that never builds a V4.1 model never pays, and is
never touched.
"""

from __future__ import annotations

import importlib
import importlib.abc
import logging
import sys

TARGET_MODULE = "vllm.models.deepseek_v41.amd.rocm"
TARGET_CLASS = "DeepseekV41ROCMAiterMLAAttention"

logger = logging.getLogger("rocm_dspark.vllm_plugin")


def import_target():
    return importlib.import_module(TARGET_MODULE)


def is_patched(module) -> bool:
    from rocm_dspark.vllm_plugin.swa_backend import MARKER

    return MARKER in vars(getattr(module, TARGET_CLASS).swa_backend_cls)


def forward_is_patched(module) -> bool:
    from rocm_dspark.vllm_plugin.swa_forward import METHOD, ORIGINAL

    return hasattr(vars(getattr(module, TARGET_CLASS)).get(METHOD), ORIGINAL)


def patch_module(module) -> list[str]:
    """Replace the SWA backend and wrap the layer's decode so SWA-only layers run our attention
    (swa_forward.py says where). Idempotent. Returns what was replaced, as 'attr: old -> new'."""
    from rocm_dspark.vllm_plugin.swa_backend import make_swa_backend
    from rocm_dspark.vllm_plugin.swa_forward import METHOD, make_forward_decode

    attn = getattr(module, TARGET_CLASS)
    replaced = []
    if not is_patched(module):
        original = attn.swa_backend_cls
        attn.swa_backend_cls = make_swa_backend(original)
        replaced.append(f"{TARGET_CLASS}.swa_backend_cls: {original.__name__} -> {attn.swa_backend_cls.__name__}")
    if not forward_is_patched(module):
        try:
            from vllm.platforms import current_platform

            # vLLM's SWA reader decodes with this same value (FNUZ on gfx942, OCP on gfx950).
            fnuz = bool(current_platform.is_fp8_fnuz())
            setattr(attn, METHOD, make_forward_decode(getattr(attn, METHOD), fnuz=fnuz))
        except Exception as exc:  # noqa: BLE001 - the backend swap stands on its own; say why the decode did not
            logger.warning("rocm-dspark: could not wrap %s.%s (%s: %s); vLLM's decode attention stays",
                           TARGET_CLASS, METHOD, type(exc).__name__, exc)
        else:
            replaced.append(f"{TARGET_CLASS}.{METHOD}: SWA-only layers run rocm-dspark's Triton attention "
                            f"(fp8_ds_mla, {'FNUZ' if fnuz else 'OCP'} e4m3), other cases vLLM's kernel")
    return replaced


def unpatch_module(module) -> bool:
    """Put vLLM's own backend and decode back (for `plugin status` and tests). True if something changed."""
    from rocm_dspark.vllm_plugin.swa_backend import MARKER
    from rocm_dspark.vllm_plugin.swa_forward import METHOD, ORIGINAL

    attn = getattr(module, TARGET_CLASS)
    changed = False
    original = vars(attn.swa_backend_cls).get(MARKER)
    if original is not None:
        attn.swa_backend_cls = original
        changed = True
    wrapper = vars(attn).get(METHOD)
    if hasattr(wrapper, ORIGINAL):
        original_method = getattr(wrapper, ORIGINAL)
        inherited = next((vars(c)[METHOD] for c in attn.__mro__[1:] if METHOD in vars(c)), None)
        if original_method is inherited:
            delattr(attn, METHOD)  # it was inherited: leave the class as vLLM defined it
        else:
            setattr(attn, METHOD, original_method)
        changed = True
    return changed


def _patch_and_log(module) -> None:
    try:
        replaced = patch_module(module)
    except Exception as exc:  # noqa: BLE001 - never break vLLM's import; say why instead
        logger.warning("rocm-dspark: could not patch %s (%s: %s); vLLM's own backend stays", TARGET_MODULE,
                       type(exc).__name__, exc)
        return
    if replaced:
        logger.info("rocm-dspark: replaced %s (ALWAYS under adaptive verification; decode metadata from the device "
                    "query_start_loc); the V4.1 indexer and sparse-MLA builder keep vLLM's answers", "; ".join(replaced))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds TARGET_MODULE through the other finders and patches it after it executes."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _patch_and_log(module)

        loader.exec_module = exec_then_patch
        return spec


def patch_now_or_on_import() -> str:
    """'patched' (module already imported), 'already' (patched before) or 'hooked' (on import)."""
    module = sys.modules.get(TARGET_MODULE)
    if module is not None:
        if is_patched(module) and forward_is_patched(module):
            return "already"
        _patch_and_log(module)
        return "patched" if is_patched(module) else "failed"
    if any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        return "already"
    sys.meta_path.insert(0, _PatchOnImport())
    return "hooked"
