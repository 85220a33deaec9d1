"""User `--env KEY=VALUE` entries, and the guard on the environment the plan decides (docs/recipe.md).

An `--env` reaches vLLM as given, except two kinds, refused because they would change what the plan says it runs:
  * a variable the plan sets (profile, workaround or build layers in rocm_dspark/recipe/resolve.py) with another
    value: its notes explain the value (VLLM_USE_BREAKABLE_CUDAGRAPH on gfx942, the AITER switches).
    STARTUP_ONLY variables pass: they change how long vLLM waits or what it logs, not what it computes.
  * VLLM_PLUGINS without this toolkit's entry point: vLLM reads it as an allow-list (vllm/plugins/__init__.py,
    load_plugins_by_group: `plugin.name in allowed_plugins`; "" matches none), which would silently drop the ROCm
    sparse-SWA backend that adaptive verification needs on builds without the fix.
The environment is part of the launch command the probe fingerprints (rocm_dspark/probe/fingerprint.py
launch_identity), so evidence gathered under another one never turns adaptive verification on.
"""

from __future__ import annotations

from rocm_dspark.errors import UsageError

PLUGIN_NAME = "rocm_dspark"  # pyproject.toml [project.entry-points."vllm.general_plugins"]
# Plan variables an operator may change: readiness and step deadlines and logging, not the computation.
STARTUP_ONLY = frozenset(
    {"VLLM_ENGINE_READY_TIMEOUT_S", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "PYTHONUNBUFFERED", "AITER_TRITON_LOG_LEVEL"}
)


def check_env(key: str, value: str, planned: dict[str, str]) -> None:
    """Refuse one user --env entry that would change a setting the plan decides (UsageError, one line)."""
    if key in planned and planned[key] != value and key not in STARTUP_ONLY:
        raise UsageError(
            f"--env {key}={value}: the plan sets {key}={planned[key]} (see its notes); leave it out, "
            f"or change the recipe in recipes/ so the plan and its notes say what runs"
        )
    if key == "VLLM_PLUGINS" and PLUGIN_NAME not in value.split(","):
        raise UsageError(
            f"--env VLLM_PLUGINS={value}: vLLM loads only the plugins named there, so rocm-dspark's "
            f"attention plugin would not load; add {PLUGIN_NAME} to the list (e.g. "
            f"VLLM_PLUGINS={PLUGIN_NAME}{',' + value if value else ''})"
        )
