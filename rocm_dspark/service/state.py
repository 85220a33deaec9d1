"""The `up` state file: which steps finished, with a hash of their inputs, and the service that runs.

`<state dir>/up/up-state.json`, rewritten atomically after every change, so a crash or Ctrl-C leaves the last
complete version. A step counts as done for a rerun only when it finished and its inputs hash the same;
each step's inputs include the previous step's output, so a change anywhere redoes everything after it.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

from rocm_dspark.atomic import write_atomic
from rocm_dspark.errors import UsageError
from rocm_dspark.service.trust import load_state

SCHEMA = 1
FILE = "up-state.json"
DONE, FAILED, INTERRUPTED, SKIPPED, RUNNING = "done", "failed", "interrupted", "skipped", "running"


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def digest(value) -> str:
    """A stable hash of JSON-able inputs (key order does not matter)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def up_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "up"


class UpState:
    """The parsed state file; save() writes it atomically."""

    def __init__(self, path: Path, data: dict | None = None):
        self.path = Path(path)
        self.data = data or {"schema": SCHEMA, "created_at": utc_now(), "steps": {}, "service": None, "runs": []}

    @classmethod
    def load(cls, directory: Path) -> UpState:
        """The state as found, only if it may be believed (rocm_dspark.service.trust: the probe store's rules)."""
        return cls(Path(directory) / FILE, load_state(Path(directory), FILE, SCHEMA))

    @property
    def exists(self) -> bool:
        return self.path.exists()

    def save(self) -> None:
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # 0600: the recorded command line and plan may carry --env values (tokens) given on it.
            write_atomic(self.path, json.dumps(self.data, indent=1, default=str) + "\n", mode=0o600)
        except OSError as exc:
            raise UsageError(f"cannot write {self.path}: {exc.strerror or exc}; pass a writable --state-dir") from None

    # -- steps ----------------------------------------------------------------------------------
    def step(self, name: str) -> dict | None:
        return self.data["steps"].get(name)

    def is_done(self, name: str, inputs_hash: str) -> bool:
        rec = self.step(name)
        return bool(rec and rec.get("status") in (DONE, SKIPPED) and rec.get("inputs") == inputs_hash)

    def mark(
        self,
        name: str,
        status: str,
        inputs_hash: str,
        *,
        output=None,
        message: str = "",
        fix: str = "",
        seconds: float | None = None,
    ) -> None:
        rec = {"status": status, "inputs": inputs_hash, "at": utc_now(), "message": message}
        if fix:
            rec["fix"] = fix
        if seconds is not None:
            rec["seconds"] = round(seconds, 1)
        old = self.step(name) or {}
        if output is not None:
            rec["output"] = output
        elif status in (FAILED, INTERRUPTED, RUNNING) and (previous := old.get("output") or old.get("previous_output")):
            rec["previous_output"] = previous  # what the last good run produced (e.g. the report) stays visible
        self.data["steps"][name] = rec
        self.save()

    def output(self, name: str):
        return (self.step(name) or {}).get("output")

    # -- the service ----------------------------------------------------------------------------
    @property
    def service(self) -> dict | None:
        return self.data.get("service")

    def set_service(self, service: dict | None) -> None:
        self.data["service"] = service
        self.save()

    # -- model loads and readiness ----------------------------------------------------------------
    def _keep(self, key: str, entry: dict, last: int) -> None:
        """Append `entry` to the list under `key`, keep its `last` entries, save."""
        kept = self.data.setdefault(key, [])
        kept.append(entry)
        del kept[:-last]
        self.save()

    def add_load(self, entry: dict, replace: bool = False) -> None:
        """Record one model load (rocm_dspark.service.start.load); `replace`: update the entry of the same run and n."""
        loads = self.data.get("loads") or []
        entry = {**entry, "run": len(self.data.get("runs", []))}
        if replace and loads and (loads[-1].get("run"), loads[-1].get("n")) == (entry["run"], entry["n"]):
            loads.pop()
        self._keep("loads", entry, 50)

    def add_mode_change(self, entry: dict) -> None:
        """The served verification mode changed (a load of the other command): counted, the last 20 kept."""
        self.data["mode_changes_total"] = int(self.data.get("mode_changes_total") or 0) + 1
        self._keep("mode_changes", entry, 20)

    @property
    def readiness(self) -> dict:
        """{"ready": bool, "phase": "serving" | "proving" | "stopped", "why"}: whether a load balancer may send
        traffic (`rocm-dspark status --ready` exits 0 only when ready)."""
        return self.data.get("readiness") or {"ready": False, "phase": "none", "why": "no service started yet"}

    def set_readiness(self, ready: bool, phase: str, why: str) -> None:
        self.data["readiness"] = {"ready": ready, "phase": phase, "why": why, "at": utc_now()}
        self.save()

    def note_run(self, entry: dict) -> None:
        self._keep("runs", entry, 20)  # the last 20 invocations are enough history
