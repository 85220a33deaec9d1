"""Which mono decode path a vLLM 0.33.0 server runs (`--monokernel`), read from its log: the whole layer, the
FFN launch, or off, and why.

vLLM logs the path once per process (`logger.info_once`) in vllm/models/deepseek_v41/amd/mono_decode.py: while
the model is built, which path each kind of layer takes (:427, :438, :464, :467, :477, :486), and at the first
decode step the kernels take, "... active" (:693, :762). An opt-in that cannot run raises "--monokernel <why>."
(:384), and the generated launcher then says it starts without the flag (launcher.sh.tmpl drop_monokernel). A
log holding several starts is read from its last "starting vLLM" line on; a flag dropped before it stays dropped.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from rocm_dspark.runtime.refusal import find_mono_refusal

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_P = "DSv4.1 mono decode"
# (key, pattern): each is one of the wheel's format strings with its %s / %d as a group.
PATTERNS = (
    ("off", re.compile(_P + r" off for some layers: (.+)")),  # :427
    ("draft_ffn", re.compile(_P + r": the FFN launch for the DSpark draft layers \((\d+) / (\d+) routing\)")),  # :438
    ("draft_off", re.compile(_P + r" off for the draft layers: (.+)")),  # :464
    ("ffn", re.compile(_P + r": the FFN launch for layers with (.+)")),  # :467
    ("draft_whole", re.compile(_P + r": the DSpark draft layers$")),  # :477
    ("whole", re.compile(_P + r": the whole standard backbone layers$")),  # :486
    ("active", re.compile(_P + r" (draft )?layer active \(decode steps of <= (\d+) rows\)")),  # :693
    ("ffn_active", re.compile(_P + r" FFN launch active \(decode steps of <= (\d+) rows\)")),  # :762
)
_START = re.compile(r"rocm-dspark\[[^\]]*\]: starting vLLM with ")
_DROPPED = re.compile(r"rocm-dspark\[[^\]]*\]: starting the same plan without --monokernel: (.+)")
WHOLE, FFN, OFF = "whole layer", "FFN launch", "off"


class MonoPath(NamedTuple):
    path: str  # WHOLE, FFN or OFF: what the backbone's decode steps take
    active: bool  # a decode step took the kernels ("... active")
    rows: int | None  # the kernels take decode steps of at most this many rows
    ffn_only: tuple[str, ...] = ()  # why some layers run the FFN launch only (mono_decode.py:467)
    off: tuple[str, ...] = ()  # why some layers, or all (the refusal, a dropped flag), run vLLM's own path
    draft: str = ""  # the DSpark draft layers' path (WHOLE, FFN, OFF; "" when not logged)

    def text(self) -> str:
        if self.path == OFF:
            return "off: " + "; ".join(self.off or ("no layer takes the mono decode kernels",))
        active = (
            f"active (decode steps of <= {self.rows} rows)"
            if self.active
            else "not active yet (no decode step has taken it)"
        )
        ffn_only = "the FFN launch only for layers with" if self.path == WHOLE else "not the whole layer: layers with"
        parts = [f"{self.path}, {active}", *(f"{ffn_only} {w}" for w in self.ffn_only)]
        parts += [f"off for some layers: {w}" for w in self.off]
        parts += [f"draft layers: {self.draft}"] if self.draft else []
        return "; ".join(parts)


def read(log_text: str) -> MonoPath | None:
    """The mono decode path of the last start in `log_text`; None when nothing in it is about mono decode."""
    found: dict[str, list[re.Match]] = {}
    dropped = None
    for raw in log_text.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        if _START.search(line):
            found = {}
        elif m := _DROPPED.search(line):
            dropped = m.group(1)
        elif _P in line:
            key, m = next(((k, m) for k, pat in PATTERNS if (m := pat.search(line))), ("", None))
            if m:
                found.setdefault(key, []).append(m)
    refusal = find_mono_refusal(log_text.split("starting vLLM with ")[-1])
    if refusal:
        return MonoPath(OFF, False, None, off=(refusal,))
    if not found:
        return MonoPath(OFF, False, None, off=(f"started without --monokernel: {dropped}",)) if dropped else None

    def whys(key: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m.group(1) for m in found.get(key, ())))

    active = [m for m in found.get("active", ()) if not m.group(1)]  # the backbone's, not the draft's
    rows = [int(m.group(2)) for m in active] + [int(m.group(1)) for m in found.get("ffn_active", ())]
    draft = WHOLE if "draft_whole" in found else FFN if "draft_ffn" in found else OFF if "draft_off" in found else ""
    if "whole" in found or active:
        path, on = WHOLE, bool(active)
    elif "ffn" in found or "ffn_active" in found:
        path, on = FFN, "ffn_active" in found
    else:
        return MonoPath(OFF, False, None, off=whys("off") or tuple(f"draft layers: {w}" for w in whys("draft_off")))
    return MonoPath(path, on, max(rows, default=None), whys("ffn"), whys("off"), draft)


def read_file(path: str | os.PathLike | None) -> MonoPath | None:
    """read() over a log file, line by line (a long-running server's log is large); None without one."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = "".join(ln for ln in f if _P in ln or "monokernel" in ln or "starting vLLM with" in ln)
    except OSError:
        return None
    return read(text)
