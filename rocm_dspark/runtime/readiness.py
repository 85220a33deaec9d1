"""The one readiness wait: every wait for a server (`up`'s starts and its readiness server, `probe`'s live level,
`validate --launch`, the progress display) is poll_until; ReadyCheck is the look at a vLLM server coming up, and
wait_ready the two together, which on timeout says one line naming the URL and the seconds (Readiness.reason).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from rocm_dspark.runtime.client import ServerError, VllmClient, model_ids
from rocm_dspark.runtime.refusal import find_refusal

T = TypeVar("T")

FIRST_POLL_S = 0.05  # a stand-in that answers at once costs tens of milliseconds
MAX_POLL_S = 1.0  # a 511 GB load is still asked once a second
LOG_TAIL_LINES = 40


def poll_until(
    look: Callable[[], T | None],
    deadline_s: float = math.inf,
    *,
    on_miss: Callable[[float], None] | None = None,
    max_s: float = MAX_POLL_S,
) -> T | None:
    """look() until it returns a value (returned) or `deadline_s` seconds pass (None).

    After each miss: on_miss(seconds waited), then a sleep of FIRST_POLL_S, doubling up to `max_s` and never past the
    deadline, so that the last look falls on it."""
    t0, pause = time.monotonic(), min(FIRST_POLL_S, max_s)
    while True:
        got = look()
        if got is not None:
            return got
        elapsed = time.monotonic() - t0
        if elapsed >= deadline_s:
            return None
        if on_miss is not None:
            on_miss(elapsed)
        time.sleep(max(0.0, min(pause, deadline_s - elapsed)))
        pause = min(pause * 2, max_s)


@dataclass(frozen=True)
class Readiness:
    """The answer of a readiness wait: `ready`, `exited` (the process ended first) or `timeout`."""

    status: str
    elapsed_s: float
    exit_code: int | None = None
    refusal: str | None = None  # the exact vLLM line, when it refused the configuration
    last_error: str = ""  # what the last probe saw (connection refused, HTTP 503, ...)
    log_tail: str = ""
    url: str = ""  # the server asked

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    def reason(self) -> str:
        """One line saying what happened."""
        if self.status == "ready":
            return f"ready after {self.elapsed_s:.1f} s"
        if self.status == "exited":
            why = f": {self.refusal}" if self.refusal else ""
            return f"the server exited with status {self.exit_code} after {self.elapsed_s:.1f} s{why}"
        at = f" at {self.url}" if self.url else ""
        return f"not ready after {self.elapsed_s:.1f} s{at} (last probe: {self.last_error or 'nothing'})"


class ReadyCheck:
    """One look at a server coming up, for poll_until: a `ready` or `exited` Readiness, or None (not yet).

    vLLM refuses connections until its engine is built, then /health answers 200 and /v1/models lists the served
    name. exit_code(): the status of what serves (the process, a unit), once it has ended (None while it runs): it
    ends the wait early; log_text(): its log, for vLLM's refusal line and the tail. gate() (the launcher's own
    "serving", a unit's "active"): asked once /health and /v1/models answer; None when it holds, else what is still
    missing (kept as the last probe)."""

    def __init__(
        self,
        client: VllmClient,
        *,
        exit_code: Callable[[], int | None] = lambda: None,
        log_text: Callable[[], str] = lambda: "",
        gate: Callable[[], str | None] | None = None,
    ):
        self.client, self.exit_code, self.log_text, self.gate = client, exit_code, log_text, gate
        self.t0 = time.monotonic()
        self.last_error = ""

    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def __call__(self) -> Readiness | None:
        code = self.exit_code()
        if code is not None:
            return self._final(code)
        self.last_error = self._probe()
        if not self.last_error:
            return Readiness("ready", self.elapsed_s(), url=self.client.base_url)
        return None

    def _probe(self) -> str:
        """ "" when the server serves (and the gate holds), else what it answered."""
        try:
            health = self.client.get("/health", timeout_s=5)
            if health.status != 200:
                return f"/health HTTP {health.status}"
            models = self.client.get("/v1/models", timeout_s=5)
            if models.status != 200 or not model_ids(models):
                return f"/v1/models HTTP {models.status}" + ("" if models.status != 200 else " lists no model")
        except ServerError as exc:
            return str(exc)
        return (self.gate() or "") if self.gate is not None else ""

    def _final(self, code: int | None) -> Readiness:
        """`exited` once what serves has ended with status `code`; `timeout` (None) while it still runs."""
        text = self.log_text()
        return Readiness(
            "timeout" if code is None else "exited",
            self.elapsed_s(),
            exit_code=code,
            refusal=None if code is None else find_refusal(text),
            last_error=self.last_error,
            log_tail="\n".join(text.splitlines()[-LOG_TAIL_LINES:]),
            url=self.client.base_url,
        )

    def timed_out(self) -> Readiness:
        """The answer once the deadline passed; one last look at the process first: it may have died meanwhile."""
        return self._final(self.exit_code())


def wait_ready(check: ReadyCheck, deadline_s: float, *, on_miss: Callable[[float], None] | None = None) -> Readiness:
    """poll_until(check) within `deadline_s`: ready, exited, or timeout."""
    return poll_until(check, deadline_s, on_miss=on_miss) or check.timed_out()
