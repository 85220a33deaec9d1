"""Which AMD GPUs this host has: `amd-smi static --asic --json` first, `rocminfo` as the fallback.

The parsers take the tools' text so they are tested against real recorded outputs (tests/fixtures/host,
sources in its SOURCES.md); `detect_gpus()` runs the tools when they exist and returns [] when no AMD GPU
(or no tool) is present. The health inventory validation reads (HBM, ECC, temperatures, power) is
rocm_dspark.runtime.inventory.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import NamedTuple


class GpuAgent(NamedTuple):
    # the JSON key records carry; mypy refuses any NamedTuple field that shadows a tuple method (tuple.index)
    index: int  # type: ignore[assignment]
    marketing_name: str
    arch: str  # gfx942 / gfx950 / ... ("" when unknown)
    source: str  # which tool said so


GFX_TARGET = re.compile(r"\b(gfx[0-9]{3,4}[a-z]?)\b")


def rocminfo_gpu_blocks(text: str) -> list[tuple[str, str]]:
    """`rocminfo`'s GPU agents as (gfx target, the agent's block): blocks whose `Name:` is a gfx target."""
    out = []
    for block in re.split(r"\n\*{5,}\s*\nAgent \d+\s*\n\*{5,}", text)[1:]:
        name = re.search(r"^\s*Name:\s*(\S+)", block, re.M)
        device_type = re.search(r"^\s*Device Type:\s*(\S+)", block, re.M)
        if name and GFX_TARGET.fullmatch(name.group(1)) and (not device_type or device_type.group(1) == "GPU"):
            out.append((name.group(1), block))
    return out


def parse_rocminfo(text: str) -> list[GpuAgent]:
    """GPU agents from `rocminfo` (CPU agents are skipped)."""
    agents = []
    for i, (arch, block) in enumerate(rocminfo_gpu_blocks(text)):
        marketing = re.search(r"^\s*Marketing Name:\s*(.*?)\s*$", block, re.M)
        agents.append(GpuAgent(i, marketing.group(1) if marketing else "", arch, "rocminfo"))
    return agents


def amdsmi_json_entries(text: str) -> list[dict]:
    """The per-GPU objects of any `amd-smi ... --json` output: a list (ROCm 6.x), {"gpu_data": [...]}
    (newer releases) or one object. ValueError (one line) when it is not strict JSON: no NaN, no duplicate key."""
    from rocm_dspark.inputs import parse_json

    data = parse_json(text, "amd-smi --json output")
    if isinstance(data, dict):
        data = data.get("gpu_data", [data])
    if not isinstance(data, list):
        raise ValueError("amd-smi JSON is neither a list nor an object")
    return [e for e in data if isinstance(e, dict)]


def parse_amdsmi_static_json(text: str) -> list[GpuAgent]:
    """`amd-smi static --json`: per GPU {gpu, asic: {market_name, target_graphics_version}}."""
    agents = []
    for i, entry in enumerate(amdsmi_json_entries(text)):
        asic = entry["asic"] if isinstance(entry.get("asic"), dict) else {}
        name, arch = str(asic.get("market_name", "")), str(asic.get("target_graphics_version", ""))
        agents.append(GpuAgent(int(entry.get("gpu", i)), name, arch, "amd-smi static --json"))
    return agents


def match_catalog_gpu(agents: list[GpuAgent], gpus: dict) -> str | None:
    """Catalog key of the first agent whose marketing name names a known part (longest name wins)."""
    for agent in agents:
        best, best_len = None, 0
        for key, spec in gpus.items():
            for name in (*spec.marketing_names, key):
                if name.lower() in agent.marketing_name.lower() and len(name) > best_len:
                    best, best_len = key, len(name)
        if best:
            return best
    return None


def run_tool(argv: list[str], timeout: float = 20.0) -> str | None:
    if not shutil.which(argv[0]):
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def detect_gpus() -> list[GpuAgent]:
    """AMD GPUs on this host; [] when neither amd-smi nor rocminfo is present or they see no GPU."""
    out = run_tool(["amd-smi", "static", "--asic", "--json"])
    if out:
        try:
            agents = parse_amdsmi_static_json(out)
            if agents:
                return agents
        except (ValueError, TypeError, AttributeError):
            pass
    out = run_tool(["rocminfo"])
    return parse_rocminfo(out) if out else []
