"""Where probe records live: `<state dir>/probe/<id>.json`, written atomically, read newest first.

State directory, first that is set: `--state-dir`, then rocm_dspark.launch_facts.STATE_ROOTS
(`$ROCM_DSPARK_STATE_DIR`, `$XDG_STATE_HOME/rocm-dspark`, `~/.local/state/rocm-dspark`). Record ids start with the UTC time, so names sort by age.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from rocm_dspark.errors import UsageError
from rocm_dspark.launch_facts import STATE_ROOTS, state_root

ENV_VAR = STATE_ROOTS[0].variable  # ROCM_DSPARK_STATE_DIR
SUBDIR = "probe"
MAX_READ = 50  # the gate looks at the newest records only; older ones stay for the operator


def state_dir(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    root = state_root()  # the rule the generated launcher follows too
    return Path(root).expanduser() if root else Path.home() / ".local" / "state" / "rocm-dspark"


def records_dir(explicit: str | os.PathLike | None = None) -> Path:
    return state_dir(explicit) / SUBDIR


def record_files(directory: Path, limit: int | None = MAX_READ) -> list[Path]:
    """Record files, newest first (temp files of a write in progress start with '.' and are skipped)."""
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".json") and not n.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except PermissionError:
        raise UsageError(f"cannot read the probe record directory {directory}: permission denied; "
                         f"pass --state-dir or set {ENV_VAR}") from None
    names.sort(reverse=True)
    return [directory / n for n in (names[:limit] if limit else names)]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def new_record_id(moment: datetime) -> str:
    import secrets  # not at import time: the gate (recipe path) only reads

    return f"{moment:%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


def write_json_atomic(path: Path, data: dict) -> Path:
    """Write to a temp file in the same directory, fsync, then rename: readers never see half a file."""
    from rocm_dspark.atomic import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, json.dumps(data, indent=1, sort_keys=False) + "\n", mode=0o644)


def write_record(directory: Path, data: dict) -> Path:
    try:
        return write_json_atomic(directory / f"{data['id']}.json", data)
    except OSError as exc:
        raise UsageError(f"cannot write the probe record to {directory}: {exc.strerror or exc}; "
                         f"pass --state-dir or set {ENV_VAR} to a writable directory") from None
