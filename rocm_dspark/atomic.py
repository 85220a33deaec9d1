"""All-or-nothing file writes that never surprise (docs/cli.md, "Writes"): readers never see half a file, a failed
write leaves nothing behind, and only a regular file (or nothing) at the named path is ever replaced: a directory,
symlink, device, FIFO or socket there is refused (as root, renaming over /dev/zero would replace the device node).
Every file gets an explicit mode before any content is written, so a secret file is never readable by others, even
for a moment; text is strict UTF-8.

The check and the rename are separate system calls; a process that can swap the target in between could also
write the directory itself, so this protects against mistakes and stale paths, not a hostile co-owner.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rocm_dspark.errors import UsageError


def check_target(path: Path, what: str = "output") -> None:
    """UsageError unless `path` may be (re)placed by a file: absent or a regular file, in a directory."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UsageError(f"{what} {str(path)!r}: {exc.strerror or exc}") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise UsageError(f"{what} {str(path)!r} is a symlink; refusing to replace or follow it: name the real file")
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{what} {str(path)!r} is a directory; name a file inside it")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(
                f"{what} {str(path)!r} exists and is not a regular file (a device, FIFO or socket); "
                "refusing to replace it"
            )
    if not path.parent.is_dir():
        raise UsageError(f"{what} {str(path)!r}: folder {str(path.parent)!r} does not exist; create it first")


def _bytes(data: bytes | str, path: Path) -> bytes:
    if isinstance(data, bytes):
        return data
    try:
        return data.encode("utf-8", errors="strict")
    except UnicodeEncodeError:
        raise UsageError(
            f"the text for {str(path)!r} holds bytes that are not UTF-8 (from a non-UTF-8 argument or path); use UTF-8"
        ) from None


def write_files_atomic(files: Sequence[tuple[Path, bytes | str, int]], what: str = "output") -> None:
    """Write each (path, data, mode) to a temp file in its directory, fsync, then rename them all. Every target is
    checked (check_target) and encoded before the first byte is written; on any error every temp file is removed
    and the error propagates."""
    planned = []
    for path, data, mode in files:
        path = Path(path)
        if not isinstance(mode, int) or mode & ~0o7777:
            raise ValueError(f"mode {mode!r} for {path}")
        check_target(path, what)
        planned.append((path, _bytes(data, path), mode))
    temps: list[tuple[str, Path]] = []
    try:
        for path, data, mode in planned:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:200]}.", suffix=".tmp", dir=path.parent)
            temps.append((tmp, path))
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fh.fileno(), mode)
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        for tmp, path in temps:
            check_target(path, what)  # again, just before the rename
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in temps:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes | str, mode: int, what: str = "output") -> Path:
    write_files_atomic([(Path(path), data, mode)], what)
    return Path(path)
