"""Is vLLM installed, and will it load our plugin? Read from package metadata: no vLLM import.

Both `plugin status` (status.py) and the checks' child process (checks.py) report these facts.
"""

from __future__ import annotations

from importlib import metadata

GROUP = "vllm.general_plugins"  # vLLM: plugins/__init__.py DEFAULT_PLUGINS_GROUP
NAME = "rocm_dspark"


def vllm_distributions() -> list[dict]:
    """Installed distributions that provide the top-level `vllm` package (no import of vLLM)."""
    out = []
    for name in dict.fromkeys(metadata.packages_distributions().get("vllm", [])):
        try:
            out.append({"name": name, "version": metadata.version(name)})
        except metadata.PackageNotFoundError:
            continue
    return out


def entry_point_status(vllm_plugins: str | None = None) -> dict:
    """Find the entry point exactly as vLLM's `load_plugins_by_group` does, and apply VLLM_PLUGINS
    (unset: load all; a comma-separated list: only those; empty: none)."""
    found = [ep for ep in metadata.entry_points(group=GROUP) if ep.name == NAME]
    allowed = vllm_plugins is None or NAME in [p.strip() for p in vllm_plugins.split(",") if p.strip()]
    status = {
        "group": GROUP,
        "name": NAME,
        "registered": bool(found),
        "value": None,
        "distribution": None,
        "loads": False,
        "allowed_by_VLLM_PLUGINS": allowed,
        "VLLM_PLUGINS": vllm_plugins,
    }
    if found:
        ep = found[0]
        status["value"] = ep.value
        status["distribution"] = ep.dist.name if ep.dist is not None else None
        try:
            loaded = ep.load()  # imports our package the way vLLM would
            where = (getattr(loaded, "__module__", None), getattr(loaded, "__name__", None))
            status["loads"] = where == ("rocm_dspark.vllm_plugin", "register")
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            status["load_error"] = f"{type(exc).__name__}: {exc}"
    return status
