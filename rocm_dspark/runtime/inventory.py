"""The GPU health inventory validation reads: HBM size, ECC counts, temperatures, power, per GPU.

One GpuFacts per GPU, merged from whichever tool answered: `amd-smi static|metric --json` first, then
`rocminfo` (name, arch, HBM pool size) and, on hosts without amd-smi, `rocm-smi -a`. Which GPU the host
has (for the recipe) is rocm_dspark.runtime.gpus.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
from typing import NamedTuple

from rocm_dspark.runtime.gpus import amdsmi_json_entries, parse_rocminfo, rocminfo_gpu_blocks, run_tool
from rocm_dspark.runtime.partition import PARTITION_ARGV, parse_partitions


class GpuFacts(NamedTuple):
    # the JSON key records carry; mypy refuses any NamedTuple field that shadows a tuple method (tuple.index)
    index: int  # type: ignore[assignment]
    marketing_name: str = ""
    arch: str = ""
    vram_mb: float | None = None  # HBM size the tool reports (MB = MiB as amd-smi prints it)
    ecc_correctable: int | None = None
    ecc_uncorrectable: int | None = None
    ecc_deferred: int | None = None
    temperature_c: dict = {}  # sensor (edge/hotspot/mem) -> current degrees C
    temperature_limits_c: dict = {}  # e.g. slowdown_hotspot -> limit the device reports
    power_w: float | None = None  # current socket power
    power_cap_w: float | None = None  # the power cap in force
    source: str = ""


class HostInventory(NamedTuple):
    """What the host tools said: the GPUs, which tools exist, and what was run (evidence)."""

    gpus: tuple[GpuFacts, ...]
    tools: dict  # tool name -> path or None
    kfd_present: bool
    commands: tuple[str, ...]  # the commands whose output was used
    problems: tuple[str, ...] = ()  # tool runs that failed or did not parse
    partitions: dict = {}  # GPU index -> compute partition mode (runtime.partition)

    @property
    def amd_host(self) -> bool:
        """An AMD GPU host: the driver's /dev/kfd exists or a tool reported a GPU."""
        return self.kfd_present or bool(self.gpus)

    def no_gpu_reason(self) -> str:
        """Why no GPU was found, in one line (empty when GPUs were found)."""
        if self.gpus:
            return ""
        missing = [t for t in ("amd-smi", "rocminfo") if not self.tools.get(t)]
        if len(missing) == 2 and not self.kfd_present:
            return "no AMD GPU: amd-smi and rocminfo absent and no /dev/kfd"
        if not self.kfd_present:
            return "no AMD GPU: no /dev/kfd (amdgpu driver not loaded) and the tools report no GPU"
        if len(missing) == 2:
            return "/dev/kfd exists but amd-smi and rocminfo are absent: install ROCm's amd-smi to inspect the GPUs"
        return "/dev/kfd exists but amd-smi/rocminfo report no GPU: " + "; ".join(self.problems or ("no output",))


_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")


def _number(value) -> float | None:
    """A reading as amd-smi prints it: 550, {"value": 550, "unit": "W"}, "550 W", "N/A" (-> None)."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = _NUMBER.match(str(value))
    return float(m.group(1)) if m else None


def parse_amdsmi_text_tree(text: str) -> list[dict]:
    """`amd-smi static`/`metric` text -> one nested dict per `GPU: N` block, keys lower-cased like the
    JSON output (`ASIC: / MARKET_NAME: x` -> {"asic": {"market_name": "x"}}), so one extractor reads both."""
    entries: list[dict] = []
    stack: list[tuple[int, dict]] = []  # (indent, section) of the open sections, the GPU's entry first
    for raw in text.splitlines():
        if top := re.match(r"^(GPU|CPU):\s*(\d+)\s*$", raw):
            stack = [(0, {"gpu": int(top.group(2))})] if top.group(1) == "GPU" else []  # CPU blocks are not ours
            entries += [stack[0][1]] if stack else []
        elif stack and (m := re.match(r"^(\s+)([A-Za-z0-9_ .]+?):\s*(.*?)\s*$", raw)):
            indent, key, value = len(m.group(1)), m.group(2).strip().lower().replace(" ", "_"), m.group(3)
            while len(stack) > 1 and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1]
            parent[key] = value or {}
            if not value:  # a section: the lines indented below it are its keys
                stack.append((indent, parent[key]))
    return entries


def _section(entry: dict, key: str) -> dict:
    value = entry.get(key)
    return value if isinstance(value, dict) else {}


# GpuFacts field <- the section and key of an amd-smi entry that hold it; of two for one field, the first wins.
_READINGS = (
    ("vram_mb", "vram", "size"),
    ("vram_mb", "mem_usage", "total_vram"),
    ("ecc_correctable", "ecc", "total_correctable_count"),
    ("ecc_uncorrectable", "ecc", "total_uncorrectable_count"),
    ("ecc_deferred", "ecc", "total_deferred_count"),
    ("power_cap_w", "limit", "socket_power"),
    ("power_w", "power", "socket_power"),
    ("power_cap_w", "power", "power_limit"),
)


def _facts_from_entry(entry: dict, source: str) -> dict:
    """The fields of GpuFacts one amd-smi entry (static and/or metric, JSON or text tree) carries."""
    out: dict = {"index": int(entry.get("gpu", 0))}
    asic = _section(entry, "asic")
    if asic.get("market_name"):
        out["marketing_name"] = str(asic["market_name"])
    if asic.get("target_graphics_version"):
        out["arch"] = str(asic["target_graphics_version"])
    for field, section, key in _READINGS:
        number = _number(_section(entry, section).get(key))
        if number is not None and field not in out:
            out[field] = int(number) if field.startswith("ecc_") else number
    temps = _section(entry, "temperature")
    readings = {k: _number(v) for k, v in temps.items() if _number(v) is not None}
    if readings:
        out["temperature_c"] = readings
    limit = _section(entry, "limit")
    limits = {
        k.replace("_temperature", ""): _number(v)
        for k, v in limit.items()
        if k.endswith("_temperature") and _number(v) is not None
    }
    if limits:
        out["temperature_limits_c"] = limits
    out["source"] = source
    return out


def parse_amdsmi_facts(text: str, source: str = "amd-smi --json") -> list[dict]:
    """Partial GpuFacts fields from `amd-smi static|metric --json` or their text form."""
    if text.lstrip().startswith(("[", "{")):
        entries = amdsmi_json_entries(text)
    else:
        entries = parse_amdsmi_text_tree(text)
        source = source.removesuffix(" --json")
    return [_facts_from_entry(e, source) for e in entries]


def parse_rocm_smi_showall(text: str) -> list[dict]:
    """`rocm-smi -a`: per-GPU series name, temperatures, power and power cap."""
    per: dict[int, dict] = {}
    for line in text.splitlines():
        m = re.match(r"^GPU\[(\d+)\]\s*:\s*(.*?)\s*$", line)
        if not m:
            continue
        facts = per.setdefault(int(m.group(1)), {"index": int(m.group(1)), "source": "rocm-smi -a"})
        body = m.group(2)
        temp = re.match(r"Temperature \(Sensor (\w+)\) \(C\):\s*(-?[\d.]+)", body)
        if temp:
            sensor = {"junction": "hotspot", "memory": "mem"}.get(temp.group(1), temp.group(1))
            facts.setdefault("temperature_c", {})[sensor] = float(temp.group(2))
        if cap := re.match(r"Max Graphics Package Power \(W\):\s*([\d.]+)", body):
            facts["power_cap_w"] = float(cap.group(1))
        if pw := re.match(r"(?:Current|Average) Socket Graphics Package Power \(W\):\s*([\d.]+)", body):
            facts["power_w"] = float(pw.group(1))
        if series := re.match(r"Card [Ss]eries:\s*(.+)", body):
            facts["marketing_name"] = series.group(1).strip()
    return [per[k] for k in sorted(per)]


def rocminfo_facts(text: str) -> list[dict]:
    """`rocminfo`: per GPU agent its name, arch and the size of its first GLOBAL pool in MB (the HBM it exposes)."""
    facts = []
    for agent, (_arch, block) in zip(parse_rocminfo(text), rocminfo_gpu_blocks(text)):
        pool = re.search(r"Segment:\s*GLOBAL[^\n]*\n\s*Size:\s*(\d+)\([^)]*\)\s*KB", block)
        facts.append({**agent._asdict(), "vram_mb": int(pool.group(1)) / 1024 if pool else None})
    return facts


def parse_amdsmi_version(text: str) -> dict:
    """`amd-smi version`: {"tool", "library", "rocm", "amdgpu"} ("N/A" and absent fields are left out)."""
    fields = {
        "AMDSMI Tool": "tool",
        "AMDSMI Library version": "library",
        "ROCm version": "rocm",
        "amdgpu version": "amdgpu",
        "amd_hsmp version": "amd_hsmp",
    }
    out = {}
    for part in text.strip().split("|"):
        key, sep, value = part.partition(":")
        if sep and key.strip() in fields and value.strip() and value.strip() != "N/A":
            out[fields[key.strip()]] = value.strip()
    return out


def merge_facts(*sources: list[dict]) -> list[GpuFacts]:
    """GpuFacts per index; the first source that has a field wins (pass the most precise tool first)."""
    merged: dict[int, dict] = {}
    for facts in itertools.chain(*sources):
        into = merged.setdefault(int(facts.get("index", 0)), {"source": []})
        for key, value in facts.items():
            if key == "source":
                into["source"] += [] if value in into["source"] else [value]
            elif value not in (None, "", {}) and key not in into:
                into[key] = value
    return [GpuFacts(**{**d, "index": i, "source": ", ".join(d["source"])}) for i, d in sorted(merged.items())]


AMDSMI_ARGVS = (
    ("amd-smi", "static", "--asic", "--vram", "--limit", "--json"),
    ("amd-smi", "metric", "--ecc", "--temperature", "--power", "--json"),
)


def detect_argvs() -> tuple[tuple[str, ...], ...]:
    """The commands inventory() runs where the tools are installed (rocm-smi only where amd-smi is not)."""
    return (*AMDSMI_ARGVS, PARTITION_ARGV, ("rocminfo",))


def inventory(root: str = "") -> HostInventory:
    """Run the AMD tools that exist and merge what they report. Never raises; [] GPUs on a non-AMD host.

    `root` prefixes /dev paths (tests point it at a directory laid out like a host)."""
    tools = {t: shutil.which(t) for t in ("amd-smi", "rocminfo", "rocm-smi")}
    commands: list[str] = []
    problems: list[str] = []
    sources: list[list[dict]] = []

    def read(argv, parse) -> None:
        """Run one tool and add what `parse` reads in its output; a failure is a problem, never an error."""
        what = " ".join(argv)
        out = run_tool(list(argv), timeout=60)
        if out is None:
            problems.append(f"`{what}` failed or timed out")
            return
        commands.append(what)
        if not out:
            return
        try:
            found = parse(out)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            problems.append(f"{what} did not parse: {exc}")
            return
        sources.append(found)
        if not found:
            problems.append(f"{what} reported no GPU")

    partitions: dict[int, str] = {}
    if tools["amd-smi"]:
        for argv in AMDSMI_ARGVS:
            read(argv, parse_amdsmi_facts)
        out = run_tool(list(PARTITION_ARGV), timeout=60)  # no --partition is no problem: the mode stays unknown
        if out:
            commands.append(" ".join(PARTITION_ARGV))
            partitions = parse_partitions(out)
    if tools["rocminfo"]:
        read(("rocminfo",), rocminfo_facts)
    if tools["rocm-smi"] and not tools["amd-smi"]:
        read(("rocm-smi", "-a"), parse_rocm_smi_showall)
    gpus = [g for g in merge_facts(*sources) if g.arch or g.marketing_name]
    kfd = os.path.exists(f"{root}/dev/kfd")
    return HostInventory(tuple(gpus), tools, kfd, tuple(commands), tuple(problems), partitions)
