"""One progress display for `up`, `validate` and `probe`: lines, and a live wait on a starting server.

On a terminal the wait is drawn with `rich` (an optional extra: `pip install 'rocm-dspark[progress]'`):
a spinner, the phase read from the server's log (rocm_dspark.runtime.server_phases) and the elapsed time. Under
journald ($JOURNAL_STREAM), in a pipe, with TERM=dumb or without rich, it prints plain lines instead: one
when the phase changes and a heartbeat every `heartbeat_s` seconds, so a log reader sees progress too.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from rocm_dspark.runtime.readiness import MAX_POLL_S, poll_until
from rocm_dspark.runtime.server_phases import READY, LogFollower, Phase

T = TypeVar("T")


def _fmt(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def wants_rich(stream) -> bool:
    """A terminal a person watches: not journald, not a pipe, not a dumb terminal, and rich importable."""
    if os.environ.get("JOURNAL_STREAM") or os.environ.get("TERM") == "dumb" or os.environ.get("NO_COLOR"):
        return False
    try:
        if not stream.isatty():
            return False
    except (AttributeError, ValueError):
        return False
    import importlib.util

    return importlib.util.find_spec("rich") is not None


class Display:
    """say() prints a line; wait() shows a server starting until poll() returns something."""

    def __init__(
        self,
        stream=None,
        *,
        fancy: bool | None = None,
        heartbeat_s: float = 30.0,
        say: Callable[[str], None] | None = None,
    ):
        self.stream = stream or sys.stderr
        self._say = say
        # a display that hands every line to `say` (how validate's and probe's callers print) is plain
        self.fancy = say is None and (wants_rich(self.stream) if fancy is None else fancy)
        self.heartbeat_s = heartbeat_s
        self._console = None

    def say(self, text: str) -> None:
        if self._say is not None:
            self._say(text)
        elif self._console is not None:
            self._console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def wait(
        self,
        label: str,
        log_path,
        poll: Callable[[], T | None],
        *,
        poll_s: float = MAX_POLL_S,
        deadline_s: float = math.inf,
    ) -> tuple[T | None, Phase | None, float]:
        """poll() until it returns a value or `deadline_s` passes (rocm_dspark.runtime.readiness.poll_until: fast
        at first, then every `poll_s` seconds); show the phase from `log_path`.

        Returns (poll's value, None on timeout; the last phase read from the log; seconds waited)."""
        follower = LogFollower(log_path) if log_path else None
        phase: Callable[[], Phase | None] = follower.poll if follower else lambda: None
        t0 = time.monotonic()
        self.say(f"{label}: server log {log_path}" if log_path else f"{label}: waiting")
        if self.fancy:
            return self._wait_rich(label, phase, poll, poll_s, deadline_s, t0)
        shown, last_beat = None, t0

        def show(elapsed):  # a line when the phase changes, and a heartbeat
            nonlocal shown, last_beat
            text = p.text() if (p := phase()) else "waiting"
            now = time.monotonic()
            if text != shown or now - last_beat >= self.heartbeat_s:
                self.say(f"{label}: {_fmt(elapsed)} {text}")
                shown, last_beat = text, now

        result = poll_until(poll, deadline_s, on_miss=show, max_s=poll_s)
        return result, phase(), time.monotonic() - t0

    def _wait_rich(self, label, phase, poll, poll_s, deadline_s, t0):
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._console = Console(file=self.stream)
        columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
        try:
            with Progress(*columns, console=self._console, transient=False) as bar:
                task = bar.add_task(f"{label}: starting", total=None)

                def show(_elapsed):
                    bar.update(task, description=f"{label}: {p.text() if (p := phase()) else 'waiting'}")

                result = poll_until(poll, deadline_s, on_miss=show, max_s=poll_s)
                last = phase()
                if result is not None:
                    bar.update(task, description=f"{label}: {(last or READY).text()}")
                return result, last, time.monotonic() - t0
        finally:
            self._console = None
