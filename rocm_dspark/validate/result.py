"""One check's outcome, and the statuses a check can end in.

A check is *blocking* when a node that fails it must not take traffic: the run stops there and every
later check is reported `skipped`. Non-blocking checks report problems as `warn` and never stop the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PASS, FAIL, WARN, SKIPPED, NOT_APPLICABLE = "pass", "fail", "warn", "skipped", "not_applicable"
STATUSES = (PASS, FAIL, WARN, SKIPPED, NOT_APPLICABLE)


@dataclass(frozen=True)
class Outcome:
    """What a check function returns; the runner adds name, category, blocking and timing."""

    status: str
    message: str
    value: Any = None
    threshold: Any = None
    evidence: Any = None
    fix: str = ""  # what to do about a fail or warn, where the message does not say (`up`'s prerequisites)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown check status {self.status!r}")


@dataclass(frozen=True)
class Check:
    """One step of the validation, in the order the runner runs them; its name is `category.what`."""

    name: str
    blocking: bool
    run: Callable[[Any], Outcome]
    description: str = ""  # what it means, for the report and the README

    @property
    def category(self) -> str:
        return self.name.partition(".")[0]

    @property
    def needs_server(self) -> bool:
        return self.category not in ("host", "software")
