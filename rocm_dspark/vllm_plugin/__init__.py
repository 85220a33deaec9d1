"""rocm-dspark's vLLM plugin: the backport of vllm#58151 (adaptive verification for DeepSeek-V4.1 on ROCm).

vLLM 0.30-0.32 refuse adaptive verification (AV) for V4.1 on ROCm: the V4.1 indexer backend answers
`supports_device_cpu_query_lens_mismatch()` False, and the compressed sparse-MLA and sparse-SWA builders
report UNIFORM_BATCH where AV needs ALWAYS. vLLM 0.33.0 (#58151) changed only those declarations; its
kernels and metadata builds were already the same. On a refusing release on ROCm this plugin adds the
same declarations to vLLM's own classes (patch.py), as recipes/vllm.yaml's `backport` entry for that
release names them. `rocm-dspark plugin status` shows what is patched and vLLM's own verdict.

Entry point (pyproject.toml): `vllm.general_plugins: rocm_dspark = rocm_dspark.vllm_plugin:register`.
vLLM calls it in every process and swallows its exceptions, so `register()` is idempotent, cheap
(stdlib + the recipes table; vLLM's ROCm module is patched only when vLLM itself imports it), and
logs exactly one line on the `rocm_dspark.vllm_plugin` logger saying what it did or why not.

Public API: register() (the entry point) and register_with() (the same decision, inputs given);
status.plugin_status() (vLLM's own checks, in a child Python running checks.py) and status.format_table(),
what `rocm-dspark plugin status` prints.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger("rocm_dspark.vllm_plugin")


@dataclass(frozen=True)
class RegisterResult:
    action: str  # "hooked" | "patched" | "already" | "skipped" | "failed"
    message: str


def register_with(
    *, vllm_version: str, capability, is_rocm: bool, platform_name: str, capability_error: str | None = None
) -> RegisterResult:
    """Decide from the capability entry and act: patch vLLM's ROCm module (now, or when imported)."""
    from rocm_dspark.vllm_plugin import capability as cap_rule
    from rocm_dspark.vllm_plugin import patch

    decision = cap_rule.decide(vllm_version, capability, capability_error, is_rocm=is_rocm, platform_name=platform_name)
    if not decision.patch:
        return RegisterResult("skipped", f"rocm-dspark: did nothing: {decision.reason}")
    backport = capability.backport
    action = patch.patch_now_or_on_import(backport)
    what = "vllm#58151's declarations on vLLM's own classes"
    text = {
        "hooked": f"will backport {what} when {' or '.join(backport['rocm_modules'])} is imported",
        "patched": f"backported {what}",
        "already": f"{what} are already in place in this process",
        "failed": f"could not backport {what}; vLLM keeps refusing adaptive verification",
    }[action]
    if action != "failed":
        text += "; " + patch.k1_state(backport)
    return RegisterResult(action, f"rocm-dspark: {decision.reason}: {text}")


def _ensure_visible() -> None:
    # vLLM configures only its own "vllm" logger; without a handler our INFO line would vanish.
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s", "%m-%d %H:%M:%S"))
        logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def register() -> RegisterResult:
    """vLLM's general-plugin entry point: one log line, never an exception."""
    _ensure_visible()
    try:
        import vllm  # vLLM is importing us, so this is already loaded in practice
        from vllm.platforms import current_platform

        from rocm_dspark.vllm_plugin import capability as cap_rule

        version = str(getattr(vllm, "__version__", "unknown"))
        cap, error = cap_rule.capability_for(version)
        result = register_with(
            vllm_version=version,
            capability=cap,
            capability_error=error,
            is_rocm=bool(current_platform.is_rocm()),
            platform_name=cap_rule.platform_name(current_platform),
        )
    except Exception as exc:  # noqa: BLE001 - vLLM swallows plugin errors; make ours visible instead
        result = RegisterResult("failed", f"rocm-dspark: did nothing: {type(exc).__name__}: {exc}")
    (logger.warning if result.action == "failed" else logger.info)("%s", result.message)
    return result
