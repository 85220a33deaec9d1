"""--model-path in container modes: the checkpoint is bind-mounted read-only at the same path."""

import os

from rocm_dspark.errors import UsageError


def check_model_path(path: str) -> str:
    """The path as mounted, or one line saying why it cannot be (before anything is written or started)."""
    if not os.path.isabs(path):
        raise UsageError(
            f"--model-path {path!r}: give an absolute path in container mode (it is mounted at the same "
            f"path inside the image), e.g. {os.path.abspath(path)!r}"
        )
    if ":" in path or "," in path:
        raise UsageError(f"--model-path {path!r}: docker's -v cannot mount a path with ':' or ','; move or link it")
    if not os.path.exists(path):
        raise UsageError(f"--model-path {path!r} does not exist on this host; nothing was written")
    return path
