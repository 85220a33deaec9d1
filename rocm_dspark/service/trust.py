"""When `up`, `down` and `status` may believe `<state>/up/up-state.json` (the probe store's rules, docs/trust.md: it
names a pid `down` signals, a unit it disables and a launcher `up` runs), and one `up` at a time per state dir: the
lock is flock(2) on up/up.lock, held for the whole run, so a crash leaves nothing stale.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import math
import os
import re
import stat
from pathlib import Path
from typing import TypeGuard

from rocm_dspark.errors import UsageError
from rocm_dspark.inputs import NOT_REGULAR, REFUSED, SYMLINK, JSONInputError, NotRead, parse_json, read_regular
from rocm_dspark.probe.store import untrusted_reason

MAX_STATE_BYTES = 1 << 20  # a real state file is a few KiB
LOCK_FILE = "up.lock"
# systemd.unit(5): letters, digits, ":-_.\" and "@" for instances; never a leading "-" (it would be an option).
_UNIT = re.compile(r"^[A-Za-z0-9_:.@\\][A-Za-z0-9_:.@\\-]{0,250}\.service$")


def _fix(path) -> str:
    return f"move {path} away to start over, or pass another --state-dir"


def dir_problem(up_dir: Path) -> str | None:
    """Why nothing in up/ may be believed, or None (the probe store's directory rules, with up/ for probe/)."""
    return untrusted_reason(Path(up_dir).parent, Path(up_dir).name)


def prepare(up_dir: Path) -> None:
    """Create the state dir and up/ 0700 where missing; refuse to write where the state would not be trusted."""
    up_dir = Path(up_dir)
    try:
        up_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        up_dir.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {up_dir}: {exc.strerror or exc}; pass a writable --state-dir") from None
    if problem := dir_problem(up_dir):
        raise UsageError(f"refusing to use the `up` state in {up_dir}: {problem}")


def read_bounded(path: Path, limit: int = MAX_STATE_BYTES) -> bytes | None:
    """The bytes of a regular file of this user or root that others cannot write; None when it is absent.
    Anything else (a FIFO, device, symlink, another user's or a group/world-writable file, a huge one) is a
    UsageError: read without blocking and never more than `limit` bytes (rocm_dspark.inputs.read_regular)."""

    def check(st) -> str | None:
        if st.st_uid not in (os.geteuid(), 0):
            return f"is owned by uid {st.st_uid}, not by this user ({os.geteuid()}) or root"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
        return None

    try:
        return read_regular(path, limit, follow=False, check=check)[0]
    except FileNotFoundError:
        return None
    except NotRead as exc:
        why = {
            SYMLINK: "is a symlink",
            NOT_REGULAR: "is not a regular file (a FIFO, device or socket)",
            REFUSED: str(exc),
        }.get(exc.kind, f"is larger than {limit} bytes")
        raise UsageError(f"state file {path} {why}; {_fix(path)}") from None
    except OSError as exc:
        raise UsageError(f"state file {path} cannot be read ({exc.strerror or exc}); {_fix(path)}") from None


def load_state(up_dir: Path, file_name: str, schema: int, shape=None) -> dict | None:
    """The parsed, trusted, well-shaped state (None when there is none yet); else one UsageError line.
    `shape`: the content check (default check_shape, up-state.json's)."""
    up_dir = Path(up_dir)
    path = up_dir / file_name
    if problem := dir_problem(up_dir):
        if not os.path.lexists(path):
            return None
        raise UsageError(f"the `up` state {path} is not trusted: {problem}")
    data = read_bounded(path)
    if data is None:
        return None

    try:
        parsed = parse_json(data, f"cannot read {path}")  # strict UTF-8, no NaN, no duplicate key
    except JSONInputError as exc:
        raise UsageError(f"{exc}; {_fix(path)}") from None
    if why := (shape or check_shape)(parsed, up_dir, schema):
        raise UsageError(
            f"{path} is not {'an `up` state' if shape is None else 'a canary record'} file ({why}): {_fix(path)}"
        )
    return parsed


def int_in(value, lo: int, hi: float = math.inf) -> TypeGuard[int]:
    """An int (not a bool) from lo to hi."""
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _opt_str(d: dict, key: str) -> bool:
    return d.get(key) is None or isinstance(d.get(key), str)


def service_problem(svc, up_dir: Path) -> str | None:
    """What is wrong with a recorded service, or None. Only the shapes `up` itself records pass."""
    if svc is None:
        return None
    if not isinstance(svc, dict):
        return "service is not an object"
    if not int_in(svc.get("port"), 1, 65535):
        return "service.port is not a TCP port"
    for key in ("host", "log", "base_url", "stopped_at"):
        if not _opt_str(svc, key):
            return f"service.{key} is not a string"
    kind = svc.get("kind")
    if kind == "process":
        if not int_in(svc.get("pid"), 2, 1 << 22):  # Linux pid_max is at most 2^22; 1 is init
            return "service.pid is not a process id"
        if svc.get("start_ticks") is not None and not int_in(svc.get("start_ticks"), 0, 1 << 63):
            return "service.start_ticks is not a number"
        launcher = svc.get("launcher")
        if launcher is not None and not inside(launcher, up_dir / "launch"):
            return f"service.launcher {launcher!r} is not a launcher `up` wrote in {up_dir / 'launch'}"
        return None
    if kind == "systemd":
        unit = svc.get("unit")
        if not isinstance(unit, str) or not _UNIT.match(unit):
            return f"service.unit {unit!r} is not a systemd unit name (NAME.service, no leading '-')"
        return None
    return f"service.kind {kind!r} is neither process nor systemd"


def inside(path, directory: Path) -> bool:
    if not isinstance(path, str) or not path:
        return False
    real, root = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([real, root]) == root and real != root


def check_shape(data, up_dir: Path, schema: int) -> str | None:
    """The state's shape as `up` writes it (rocm_dspark.service.state, schema `schema`), or what differs."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if data.get("schema") != schema:
        return f"schema is not {schema}"
    steps = data.get("steps")
    if not isinstance(steps, dict):
        return "steps is not an object"
    for name, rec in steps.items():
        if not isinstance(rec, dict):
            return f"steps.{name} is not an object"
        for key in ("status", "inputs", "at", "message", "fix"):
            if not _opt_str(rec, key):
                return f"steps.{name}.{key} is not a string"
        seconds = rec.get("seconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int | float)):
            return f"steps.{name}.seconds is not a number"
    launchers = steps.get("launchers")
    out = launchers.get("output") if isinstance(launchers, dict) else None
    if isinstance(out, dict):  # each command's files (up/serve.files_of): `up` runs that launcher on a rerun
        sets = out.get("sets", {})
        shaped = isinstance(sets, dict) and all(isinstance(f, dict) for f in sets.values())
        if not shaped or not isinstance(out.get("files", {}), dict):
            return "steps.launchers.output has the wrong shape"
        for (which, files), key in itertools.product(sets.items(), ("launcher", "unit", "env_file")):
            if files.get(key) is not None and not inside(files[key], up_dir / "launch"):
                where = f"steps.launchers.output.sets.{which}.{key} {files[key]!r}"
                return f"{where} is not a file `up` wrote in {up_dir / 'launch'}"
    if not isinstance(data.get("runs", []), list):
        return "runs is not a list"
    problem = service_problem(data.get("service"), up_dir)
    ready = service_problem(data.get("ready_server"), up_dir)  # down signals it too: the same rules
    return problem or (f"ready_server: {ready}" if ready else None)


@contextlib.contextmanager
def up_lock(up_dir: Path, who: str = "rocm-dspark up"):
    """Hold up/up.lock for one `up` (or canary, `who`) run; a second run on the same state dir refuses and says
    who holds it."""
    fd = _open_lock(up_dir, os.O_RDWR | os.O_CREAT)
    try:
        _flock(fd, fcntl.LOCK_EX, up_dir, who)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {who}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def _open_lock(up_dir: Path, flags: int) -> int:
    path = Path(up_dir) / LOCK_FILE
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot open the lock {path}: {exc.strerror or exc}; remove it if it is not a file") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0):
        os.close(fd)
        raise UsageError(f"the lock {path} is not a regular file of this user; remove it and rerun")
    return fd


def _flock(fd: int, how: int, up_dir: Path, who: str = "rocm-dspark up") -> None:
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        pid, _, held_by = os.pread(fd, 64, 0).decode("ascii", "replace").strip().partition(" ")
        held_by = held_by if held_by in ("rocm-dspark up", "rocm-dspark canary") else "rocm-dspark up"
        raise UsageError(
            f"refusing to start: {'a' if held_by != who else 'another'} `{held_by}` (pid "
            f"{pid or 'unknown'}) is running on the state dir {Path(up_dir).parent}; wait for it to "
            "finish or stop it, then rerun"
        ) from None


def check_usable(up_dir: Path) -> None:
    """--dry-run: refuse what prepare() and up_lock() would refuse, writing nothing."""
    up_dir = Path(up_dir)
    there = next(p for p in (up_dir, *up_dir.parents) if os.path.lexists(p))  # what mkdir -p would create in
    if not there.is_dir() or not os.access(there, os.W_OK | os.X_OK):  # access(2) sees chattr +i and ro mounts
        why = "is not a directory" if not there.is_dir() else "is not writable by this user"
        raise UsageError(f"cannot create {up_dir}: {there} {why}; pass a writable --state-dir")
    if problem := dir_problem(up_dir):
        raise UsageError(f"refusing to use the `up` state in {up_dir}: {problem}")
    if not os.path.lexists(up_dir / LOCK_FILE):
        return  # none yet: up_lock creates it
    fd = _open_lock(up_dir, os.O_RDONLY)
    try:
        _flock(fd, fcntl.LOCK_SH, up_dir)  # shared: a running `up` holds it exclusively
    finally:
        os.close(fd)
