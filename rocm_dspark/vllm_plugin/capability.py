"""Should the plugin patch this process? A pure rule over the capability table (recipes/vllm.yaml).

The facts (which vLLM releases refuse adaptive verification for DeepSeek-V4.1 on ROCm, which
support it natively) live in the table; this module only decides, and says why in one line.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    patch: bool
    reason: str  # one line, for the log and `plugin status`


def platform_name(platform) -> str:
    """'rocm', 'cuda', 'cpu', ... (ROCm's torch device_type is 'cuda', so use vLLM's enum)."""
    enum = getattr(platform, "_enum", None)
    return enum.name.lower() if enum is not None else str(getattr(platform, "device_type", "unknown"))


def capability_for(vllm_version: str):
    """(capability, None) from recipes/vllm.yaml, or (None, "why not") when it cannot be read."""
    try:
        from rocm_dspark.recipe.catalog import load_catalog

        return load_catalog().vllm_capability(vllm_version), None
    except Exception as exc:  # noqa: BLE001 - a plugin must not raise into vLLM; the reason is logged
        return None, f"{type(exc).__name__}: {exc}"


def decide(
    vllm_version: str, cap, capability_error: str | None = None, *, is_rocm: bool, platform_name: str
) -> Decision:
    """`cap`: recipes/vllm.yaml's catalog.Capability for this release, or None (capability_error says why).
    The rule, first match wins: no table -> nothing; no V4.1 -> nothing; native AV -> nothing;
    not ROCm -> nothing; no backport entry -> nothing; a refusing release on ROCm -> patch."""
    if cap is None:
        return Decision(
            False,
            f"cannot tell whether vLLM {vllm_version} needs it "
            f"({capability_error or 'no capability entry'}); doing nothing",
        )
    where = f"recipes/vllm.yaml range '{cap.versions}'"
    if not cap.supports_v41:
        return Decision(False, f"vLLM {vllm_version} has no DeepSeek-V4.1 ({where}); nothing to patch")
    if cap.native_adaptive_on_rocm_v41 or not cap.refuses_adaptive_on_rocm_v41:
        return Decision(
            False,
            f"vLLM {vllm_version} supports adaptive verification for DeepSeek-V4.1 on ROCm "
            f"natively ({where}); nothing to patch",
        )
    if not is_rocm:
        return Decision(
            False,
            f"platform is {platform_name}, not ROCm: vLLM {vllm_version} does not use its ROCm "
            "DeepSeek-V4.1 classes here; nothing to patch",
        )
    if not cap.backport:
        return Decision(
            False,
            f"vLLM {vllm_version} refuses adaptive verification for DeepSeek-V4.1 on ROCm, but "
            f"{where} has no backport entry naming what to patch; doing nothing",
        )
    return Decision(True, f"vLLM {vllm_version} refuses adaptive verification for DeepSeek-V4.1 on ROCm ({where})")
