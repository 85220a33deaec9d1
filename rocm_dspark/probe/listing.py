"""Where probe records are, and which names in probe/ are candidates: one listing, nothing opened.

The gate's first step on every `rocm-dspark recipe`: with no candidate it decides without reading a file, so the
store's trust rules (rocm_dspark.probe.store) are imported only when a record is there to check.
"""

import os
from pathlib import Path

from rocm_dspark.errors import UsageError
from rocm_dspark.statedir import ENV_VAR, state_dir

SUBDIR = "probe"


def records_dir(explicit: str | os.PathLike | None = None) -> Path:
    return state_dir(explicit) / SUBDIR


def _os_error(directory, exc: OSError) -> UsageError:
    return UsageError(
        f"cannot read the probe record directory {directory}: {exc.strerror or exc}; pass --state-dir or set {ENV_VAR}"
    )


def record_names(directory: Path) -> list[str]:
    """Candidate record names (temp files of a write in progress start with '.'). One listing, no stat."""
    try:
        return sorted((n for n in os.listdir(directory) if n.endswith(".json") and not n.startswith(".")), reverse=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise _os_error(directory, exc) from None
