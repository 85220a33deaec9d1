"""All-or-nothing file writes: readers never see half a file, a failed write leaves nothing behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_files_atomic(files: list[tuple[Path, bytes | str, int]]) -> None:
    """Write each (path, data, mode) to a temp file in its directory, fsync, then rename them all.

    The mode is set before any content is written, so a secret file is never readable by others,
    even for a moment. On any error every temp file is removed and the error propagates.
    """
    temps: list[tuple[str, Path]] = []
    try:
        for path, data, mode in files:
            path = Path(path)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            temps.append((tmp, path))
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fh.fileno(), mode)
                fh.write(data.encode("utf-8") if isinstance(data, str) else data)
                fh.flush()
                os.fsync(fh.fileno())
        for tmp, path in temps:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in temps:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise


def write_atomic(path: Path, data: bytes | str, mode: int = 0o644) -> Path:
    write_files_atomic([(Path(path), data, mode)])
    return Path(path)
