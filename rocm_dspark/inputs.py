"""Reading the files a user names (cost tables, server descriptions, recipe data) and the state files: bounded, strict
UTF-8, strict JSON, one-line errors that name the file (docs/cli.md, "Encoding"). read_regular is the one bounded
read (the state dir's readers use it too, with O_NOFOLLOW), parse_json the one JSON reader.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from rocm_dspark.errors import UsageError

MAX_BYTES = 16 << 20


def read_at_most(fd: int, limit: int, chunk_size: int = 1 << 16) -> bytes:
    """Up to `limit` bytes from `fd` (a caller that passes its maximum + 1 sees a file that is too long)."""
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(fd, min(left, chunk_size))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class NotRead(Exception):
    """Why read_regular did not read a file: `kind` (SYMLINK, NOT_REGULAR, TOO_LARGE, GREW, REFUSED), `st` its
    fstat once opened, and for REFUSED the caller's own reason as the message."""

    def __init__(self, kind: str, st: os.stat_result | None = None, why: str = ""):
        super().__init__(why or kind)
        self.kind, self.st = kind, st


SYMLINK, NOT_REGULAR, TOO_LARGE, GREW, REFUSED = "a symlink", "not a regular file", "too large", "grew", "refused"


def read_regular(
    path: str | os.PathLike,
    limit: int,
    *,
    follow: bool = True,
    dir_fd: int | None = None,
    tail: bool = False,
    check=None,
) -> tuple[bytes, os.stat_result]:
    """The one bounded read of a file: (bytes, its fstat). Opened without blocking (O_NONBLOCK: a FIFO cannot
    hang the reader) and, with follow=False, never through a symlink (O_NOFOLLOW); then it must be a regular file.
    `check(st)` may name a reason to refuse the opened file (its owner, its mode): NotRead REFUSED. `tail`: its
    last `limit` bytes; else all of it, NotRead TOO_LARGE past `limit` (GREW: it grew past it while read).
    FileNotFoundError when it is absent; any other OSError as the kernel gave it."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    chunk = 1 << 20 if limit > 1 << 20 else 1 << 16  # few reads of a large file; no 1 MiB ask for a small one
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise NotRead(SYMLINK) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRead(NOT_REGULAR, st)
        if check is not None and (why := check(st)):
            raise NotRead(REFUSED, st, why)
        if tail:
            os.lseek(fd, max(0, st.st_size - limit), os.SEEK_SET)
            return read_at_most(fd, limit, chunk), st
        if st.st_size > limit:
            raise NotRead(TOO_LARGE, st)
        data = read_at_most(fd, limit + 1, chunk)
        if len(data) > limit:
            raise NotRead(GREW, st)
        return data, st
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, what: str, *, max_bytes: int = MAX_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`; UsageError `"{what} {path}: ..."` otherwise.
    A path the user names may be a symlink (read_regular follows it here; the state dir's readers do not)."""
    p = Path(path) if str(path).isprintable() else ascii(str(path))  # a control character cannot split the line
    try:
        raw, _ = read_regular(path, max_bytes)
    except FileNotFoundError:
        raise UsageError(f"{what} {p}: no such file") from None
    except NotRead as exc:
        why = "not a regular file" if exc.kind == NOT_REGULAR else f"larger than {max_bytes >> 20} MiB"
        raise UsageError(f"{what} {p}: {why}") from None
    except OSError as exc:
        raise UsageError(f"{what} {p}: cannot read: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        hint = " (it looks like UTF-16)" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise UsageError(
            f"{what} {p}: not UTF-8 text{hint}: byte {exc.start} cannot be decoded; save it as UTF-8"
        ) from None


class JSONInputError(UsageError, ValueError):
    """Text that is not strict JSON. The message is one line, `"{what}: ..."`; `detail` is the problem alone,
    for a reader that reports it in its own words (a record the gate ignores, rocm_dspark.probe.record). A
    ValueError too, as json's own errors are: a reader that caught json.loads's error still catches this."""

    def __init__(self, what: str, message: str, detail: str):
        super().__init__(f"{what}: {message}")
        self.detail = detail


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str | bytes, what: str):
    """The one strict JSON reader for what comes from outside this process (evidence, records, state files,
    operator-supplied JSON): NaN/Infinity, duplicate keys, bytes that are not UTF-8, nesting past Python's
    recursion limit and integers past its digit limit raise JSONInputError naming `what`, in one line."""
    import json

    what = what if what.isprintable() else ascii(what)  # a newline in a path cannot split the line
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONInputError(
                what, f"not UTF-8 text: byte {exc.start} cannot be decoded", f"not UTF-8: byte {exc.start}"
            ) from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise JSONInputError(
            what, f"line {exc.lineno}: malformed JSON: {exc.msg}", f"line {exc.lineno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise JSONInputError(what, "JSON nested too deeply", "nested too deeply") from None
    except ValueError as exc:  # duplicate key, NaN, an integer past the digit limit
        first = (str(exc).splitlines() or [""])[0].split(";")[0]
        raise JSONInputError(what, f"malformed JSON: {first}", first) from None


def load_json(path: str | os.PathLike, what: str, *, max_bytes: int = MAX_BYTES):
    """read_text, then parse_json: a user's JSON file, bounded and strict."""
    return parse_json(read_text(path, what, max_bytes=max_bytes), f"{what} {Path(path)}")
