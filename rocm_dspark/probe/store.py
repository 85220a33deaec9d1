"""Where probe and A/B records live, and which of them may be trusted: docs/trust.md states the rules (directories
as OpenSSH's StrictModes, files opened O_NOFOLLOW|O_NONBLOCK within MAX_RECORD_BYTES, the HMAC under host.key,
a signed finished_at that the file's mtime does not contradict, newest by content, MAX_TOTAL_BYTES in all).

Layout: `<state dir>/{probe,ab,calibration}/<id>.json` and `<state dir>/host.key` (this host's HMAC key, 0600),
the state directory as rocm_dspark.statedir finds it. With no `*.json` name in probe/ (the common case, on every
`rocm-dspark recipe`) the gate costs one listing.
"""

# No __future__ annotations: NamedTuple would compile each string annotation at import (benchmarks/recipe_latency.py).

import json
import os
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

from rocm_dspark.errors import UsageError
from rocm_dspark.inputs import GREW, NOT_REGULAR, NotRead, read_regular
from rocm_dspark.probe.listing import SUBDIR, _os_error, record_names, records_dir  # noqa: F401 (public here too)
from rocm_dspark.statedir import ENV_VAR, state_dir  # noqa: F401 (store.state_dir is public)

KEY_FILE = "host.key"
MAX_RECORD_BYTES = 1 << 20  # a real record is a few KiB; its live log is a separate file
MAX_TOTAL_BYTES = 64 << 20  # all candidates together
CLOCK_SKEW_S = 300


# --- trust -----------------------------------------------------------------------------------------


def _sole_member_group(st: os.stat_result) -> bool:
    """Is the file's group the owner's private group (no other member)? OpenSSH's StrictModes rule."""
    import grp
    import pwd

    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
        group = grp.getgrgid(st.st_gid)
    except KeyError:
        return False
    return group.gr_name == owner and all(m == owner for m in group.gr_mem)


def _writable_by_others(st: os.stat_result, *, sticky_ok: bool) -> bool:
    if sticky_ok and st.st_mode & stat.S_ISVTX:
        return False
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and not _sole_member_group(st)


def _dir_problem(path: str, st: os.stat_result, me: int, *, sticky_ok: bool = False) -> str | None:
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid not in (me, 0):
        return f"{path} is owned by uid {st.st_uid}, not by this user ({me}) or root"
    if _writable_by_others(st, sticky_ok=sticky_ok):
        return f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}); run: chmod go-w {path}"
    return None


def untrusted_reason(state: Path, subdir: str = SUBDIR) -> str | None:
    """Why records under `state` cannot be trusted, or None. Checks the state dir, its ancestors and the record
    directory `subdir` (probe/, or ab/ for A/B records: the same rules)."""
    me = os.geteuid()
    try:
        real = os.path.realpath(state)
        for ancestor in reversed(Path(real).parents):  # "/" first
            problem = _dir_problem(str(ancestor), os.stat(ancestor), me, sticky_ok=True)
            if problem:
                return problem
        problem = _dir_problem(str(state), os.stat(real), me)
        if problem:
            return problem
        st = os.lstat(os.path.join(real, subdir))
    except FileNotFoundError:
        return None  # nothing there yet: nothing to trust
    except OSError as exc:
        return f"cannot check {state}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"{state / subdir} is a symlink; records must live in a real directory"
    return _dir_problem(str(state / subdir), st, me)


class Candidate(NamedTuple):
    name: str
    data: bytes | None  # None: not read, see error
    mtime: float
    error: str | None


def read_candidates(directory: Path, names: list[str]) -> tuple[list[Candidate], str | None]:
    """Read every named file in `directory` (probe/) by the rules above; (candidates, over_budget_reason)."""
    me = os.geteuid()
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _os_error(directory, exc) from None
    out: list[Candidate] = []
    total = 0

    class OverBudget(Exception):
        pass

    def check(st) -> str | None:
        if st.st_uid not in (me, 0):
            return f"owned by uid {st.st_uid}"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return "writable by other users"
        if st.st_size > MAX_RECORD_BYTES:
            return f"larger than {MAX_RECORD_BYTES} bytes"
        if total + st.st_size > MAX_TOTAL_BYTES:
            raise OverBudget
        return None

    try:
        for name in names:
            try:
                data, st = read_regular(name, MAX_RECORD_BYTES, follow=False, dir_fd=dir_fd, check=check)
            except OverBudget:
                return out, (
                    f"the records in {directory} hold more than {MAX_TOTAL_BYTES >> 20} MiB; "
                    "move old ones away so every record can be read"
                )
            except NotRead as exc:
                # check() refuses a file over MAX_RECORD_BYTES before read_regular could call it TOO_LARGE
                why = f"grew past {MAX_RECORD_BYTES} bytes while read" if exc.kind == GREW else str(exc)
                out.append(Candidate(name, None, exc.st.st_mtime if exc.kind != NOT_REGULAR and exc.st else 0.0, why))
                continue
            except OSError as exc:
                out.append(Candidate(name, None, 0.0, exc.strerror or str(exc)))
                continue
            total += len(data)
            out.append(Candidate(name, data, st.st_mtime, None))
    finally:
        os.close(dir_fd)
    return out, None


class Checked(NamedTuple):
    """One candidate file after the trust rules: `record` when it parses, `problem` when it may not count."""

    path: Path
    record: object | None  # what `parse` returned
    problem: str | None  # None: trusted
    note: str | None  # a note for an ignored file


class Loaded(NamedTuple):
    checked: list  # [Checked], parsed records newest first (by signed content), then the rest
    untrusted: str | None  # set when nothing in the directory may be trusted at all

    @property
    def trusted(self) -> list:
        return [(c.path, c.record) for c in self.checked if c.problem is None]

    @property
    def notes(self) -> list[str]:
        return [c.note for c in self.checked if c.note]


def load_signed(
    directory: Path, names: list[str] | None, parse, *, kind: str, label: str, need_key: bool = True
) -> Loaded:
    """Every named candidate in `directory` (probe/, ab/ or calibration/; None: all of them), checked by the rules
    above.

    parse(data) turns JSON into a record with `.id` and `.finished_at`, raising record.RecordError. `kind`
    names the format in notes ("probe record"), `label` prefixes a record's id ("record", "A/B record").
    need_key=False still reads (for `probe --show`) when no key exists; nothing unsigned is trusted."""
    from rocm_dspark.probe.record import RecordError, parse_text

    names = record_names(directory) if names is None else names
    if not names:
        return Loaded([], None)
    problem = untrusted_reason(directory.parent, directory.name)
    if problem:
        return Loaded([], problem)
    key = read_key(directory.parent)
    if key is None and need_key:
        return Loaded(
            [],
            f"no usable host key {directory.parent / KEY_FILE} (it must be a 0600 file of this user, made by "
            "`rocm-dspark probe`), so no record here can be verified",
        )
    candidates, over = read_candidates(directory, names)
    if over:
        return Loaded([], over)

    records, rest = [], []
    for c in candidates:
        path = directory / c.name
        if c.data is None:
            rest.append(Checked(path, None, c.error, f"{c.name} is not trusted ({c.error}): ignored"))
            continue
        try:
            data = parse_text(c.data)  # inputs.parse_json: strict UTF-8, no NaN, no duplicate key
            record = parse(data)
        except RecordError as exc:
            rest.append(Checked(path, None, str(exc), f"{c.name} is not a valid {kind} ({exc}): ignored"))
            continue
        if record.id + ".json" != c.name:
            why = f"holds {label} {record.id} (renamed file)"
            rest.append(Checked(path, None, why, f"{c.name} {why}: ignored"))
            continue
        if key is None or not isinstance(data, dict) or not verify(data, key):  # parse() saw an object
            why = f"is not signed with this host's key ({KEY_FILE})"
            records.append(Checked(path, record, why, f"{label} {record.id} {why}: ignored"))
            continue
        when = time_problem(record.finished_at, c.mtime)
        why = f"is not trusted: {when}" if when else None
        records.append(Checked(path, record, why, f"{label} {record.id} {why}: ignored" if why else None))
    records.sort(key=lambda c: (c.record.finished_at, c.record.id), reverse=True)
    return Loaded(records + rest, None)


# --- the host key and signatures -------------------------------------------------------------------


def read_key(state: Path) -> bytes | None:
    """This host's key, or None when there is none (no record was ever written here) or it is unsafe."""

    def check(st) -> str | None:
        unsafe = st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size != 64
        return "not a 0600 key file of this user" if unsafe else None

    try:
        return bytes.fromhex(read_regular(state / KEY_FILE, 64, follow=False, check=check)[0].decode("ascii"))
    except (OSError, NotRead, ValueError, UnicodeDecodeError):
        return None


def ensure_key(state: Path) -> bytes:
    """Read the host key, creating it on the first probe: 256 random bits written to a 0600 temp file, fsynced,
    then hard-linked into place (link fails if the name exists, so two first probes race safely: the loser
    reads the winner's complete key). A reader never sees a half-written key."""
    key = read_key(state)
    if key is not None:
        return key
    import secrets
    import tempfile

    path = state / KEY_FILE
    fd, tmp = tempfile.mkstemp(prefix=f".{KEY_FILE}.", suffix=".tmp", dir=state)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, secrets.token_hex(32).encode("ascii"))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        try:
            os.link(tmp, path, follow_symlinks=False)
        except FileExistsError:
            pass  # another first probe linked its complete key first: use that one
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(tmp)
    key = read_key(state)
    if key is None:
        raise UsageError(
            f"{path} exists but is not a usable host key (a 0600 regular file of this user holding "
            "64 hex digits); remove it (records signed with it will no longer count)"
        )
    return key


def signature(data: dict, key: bytes) -> str:
    import hashlib
    import hmac

    from rocm_dspark.probe.record import canonical

    return hmac.new(key, canonical({k: v for k, v in data.items() if k != "hmac"}), hashlib.sha256).hexdigest()


def verify(data: dict, key: bytes) -> bool:
    import hmac

    given = data.get("hmac")
    return isinstance(given, str) and hmac.compare_digest(given, signature(data, key))


# --- time ------------------------------------------------------------------------------------------


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def time_problem(finished_at: str, mtime: float) -> str | None:
    """A signed finish time that its file contradicts (written before it finished) or that lies in the future."""
    try:
        ts = datetime.strptime(finished_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except (TypeError, ValueError):
        return f"finished_at {finished_at!r} is not a UTC time"
    if ts > utc_now().timestamp() + CLOCK_SKEW_S:
        return f"it claims to finish at {finished_at}, in the future"
    if ts > mtime + CLOCK_SKEW_S:
        return f"it claims to finish at {finished_at}, after its file was last written"
    return None


def new_record_id(moment: datetime) -> str:
    import secrets  # not at import time: the gate (recipe path) only reads

    return f"{moment:%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


# --- writing ---------------------------------------------------------------------------------------


def prepare_dir(directory: Path) -> None:
    """Create the record directory (and the state dir) 0700 if needed, and refuse to write where records
    would not count."""
    try:
        directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create the record directory {directory}: {exc.strerror or exc}; "
            f"pass --state-dir or set {ENV_VAR} to a writable directory"
        ) from None
    problem = untrusted_reason(directory.parent, directory.name)
    if problem:
        raise UsageError(f"refusing to write records where they would not be trusted: {problem}")


def write_record(directory: Path, data: dict) -> Path:
    """Sign `data` with this host's key (created on the first write) and write it as <id>.json in `directory`
    (probe/ or ab/): a temp file in the same directory, fsynced, then renamed, so readers never see half a file."""
    from rocm_dspark.atomic import write_atomic

    try:
        prepare_dir(directory)
        signed = dict(data, hmac=signature(data, ensure_key(directory.parent)))
        return write_atomic(directory / f"{data['id']}.json", json.dumps(signed, indent=1) + "\n", mode=0o644)
    except OSError as exc:
        raise UsageError(
            f"cannot write the record to {directory}: {exc.strerror or exc}; "
            f"pass --state-dir or set {ENV_VAR} to a writable directory"
        ) from None
