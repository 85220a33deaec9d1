"""Read what a running (or finished) launcher wrote in its state directory, for `up`, `status` and validate.

The launcher writes `launch-state` as `key=value` lines, one `attempt=` line per start (the launcher template
says which), and each start's output in `<mode>.log`: vLLM's refusal line and the log tail of a failed start are
read here from the log, with launch_facts' rule.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rocm_dspark.inputs import NotRead, read_regular
from rocm_dspark.launch import launch_facts

STATE_FILE = "launch-state"
REFUSED_FILE = "adaptive-refused"
ATTEMPT_FIELDS = ("mode", "outcome", "exit_status", "started_at", "ended_at")
_KEYS = frozenset("phase mode pid started_at updated_at ready_at monokernel cache_key cache_dir warmup".split())
_LIMIT = 256 * 1024  # the state file is a few hundred bytes; of a log, the last 256 KiB carry its tail
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _tail(path: Path, limit: int = _LIMIT) -> str | None:
    """The last `limit` bytes of a regular file as text, or None (absent, a FIFO or device, a symlink)."""
    try:
        return read_regular(path, limit, follow=False, tail=True)[0].decode("utf-8", "replace")
    except (OSError, NotRead):
        return None


def _none(value: str):
    return None if value in ("", "-") else value


def _attempt(line: str, directory: Path) -> dict | None:
    words = line.split()
    if len(words) != len(ATTEMPT_FIELDS):
        return None
    a = dict(zip(ATTEMPT_FIELDS, map(_none, words)))
    a["exit_status"] = int(a["exit_status"]) if (a["exit_status"] or "").isdigit() else None
    a["refusal"] = a["log_tail"] = None
    if a["outcome"] == "skipped_refused_before":
        memo = (_tail(directory / REFUSED_FILE, 8192) or "").splitlines()
        a["refusal"] = memo[2] if len(memo) > 2 else None
    elif a["outcome"] != "ready":
        # a start vLLM refused for --monokernel: its log was kept beside the next start's
        mono = a["outcome"] == "refused_monokernel"
        log = _tail(directory / f"{a['mode']}{'-monokernel' if mono else ''}.log")
        if log is not None:
            a["refusal"] = launch_facts.find_mono_refusal(log) if mono else launch_facts.find_refusal(log)
            lines = [_CONTROL.sub("", _ANSI.sub("", ln))[:2000] for ln in log.splitlines()[-40:]]
            a["log_tail"] = "\n".join(lines)
    return a


def read(directory: str | os.PathLike) -> dict:
    """The launcher's state in `directory`; {} when there is none (not written yet, unreadable, not a file)."""
    directory = Path(directory)
    text = _tail(directory / STATE_FILE, 64 * 1024)
    if not text:
        return {}
    values: dict = {}
    attempts = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "attempt":
            a = _attempt(value, directory)
            if a is not None:
                attempts.append(a)
        elif key in _KEYS:
            values[key] = _none(value)
    if "phase" not in values:
        return {}
    if values.get("pid") is not None:
        values["pid"] = int(values["pid"]) if values["pid"].isdigit() else None
    # Fell back: block runs although the first start tried (or skipped) adaptive verification.
    values["fell_back"] = values.get("mode") == "block" and bool(attempts) and attempts[0]["mode"] == "adaptive"
    values["attempts"] = attempts
    return values
