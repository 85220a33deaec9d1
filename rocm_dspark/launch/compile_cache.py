"""The compile cache: what a start compiles (vLLM's torch.compile graphs, inductor's and Triton's kernels) kept on
each host for the next start, one directory per key, so nothing compiled for another image, vLLM, torch or GPU
is ever loaded. This module owns the key, the paths, the environment, the mounts and the log reading; the
launcher (templates/launcher.sh.tmpl, "compile cache") applies them at each start: only the current key's
directory is used, stale keys are named and evicted oldest first above the cap, a full disk refuses.
Where vLLM (vllm/envs.py), inductor (torch/_inductor/runtime/cache_dir_utils.py) and Triton (triton/knobs.py)
read the directories of ENV_DIRS, and why AITER's JIT directory is left alone: docs/compile-cache.md.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

FORMAT = "c1"  # this toolkit's layout of a key directory: a new layout gets a new key
ENV_DIRS = (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"))
CONTAINER_DIR = "/var/cache/rocm-dspark-compile"  # where a container sees its key directory
UNIT_ROOT = "/var/cache/rocm-dspark"  # systemd CacheDirectory=rocm-dspark/<name>, owned by User=
ROOT_ENV = "ROCM_DSPARK_COMPILE_CACHE_DIR"  # the launcher's cache root, overriding its default
CAP_ENV, CAP_MB = "ROCM_DSPARK_COMPILE_CACHE_CAP_MB", 65536  # older keys are evicted above this
MIN_FREE_ENV, MIN_FREE_MB = "ROCM_DSPARK_COMPILE_CACHE_MIN_FREE_MB", 4096  # a start refuses below this
# What vLLM logs about its compile cache (0.32.0 and 0.33.0 alike; docs/compile-cache.md gives the lines).
WARM_LINES = ("Directly load the compiled graph(s) for compile range", "Directly load AOT compilation from path")
COLD_LINES = ("Compiling a graph for compile range", "saved AOT compiled function to")
MISS_LINES = ("Compiling model again due to a load failure",)  # it read the cache, could not load it, compiled


def _word(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_") or "none"


def suffix(gfx: str) -> str:
    """The key's end: GPU target and layout (the launcher puts the image part in front at run time)."""
    return f"-{_word(gfx)}-{FORMAT}"


def image_key(image: str, gfx: str) -> str | None:
    """The key of a container start: the image's digest (None without one: a tag can be re-pushed)."""
    if "@sha256:" not in image:
        return None
    return f"img-{image.rsplit('@sha256:', 1)[1][:12]}{suffix(gfx)}"


def host_versions() -> tuple[str, str]:
    """The vLLM and torch of this Python, from their metadata (no import)."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for dist in ("vllm", "torch"):
        try:
            found.append(version(dist))
        except PackageNotFoundError:
            found.append("none")
    return found[0], found[1]


def host_key(gfx: str, versions: tuple[str, str] | None = None) -> str:
    """The key of a host-mode start: the host's vLLM and torch versions."""
    vllm, torch = versions or host_versions()
    return f"vllm{_word(vllm)}-torch{_word(torch)}{suffix(gfx)}"


def env(directory: str) -> dict[str, str]:
    """The variables that point each tool at `directory` (a key directory, as the process sees it)."""
    return {name: f"{directory}/{sub}" for name, sub in ENV_DIRS}


def docker_args(host_dir: str) -> list[str]:
    """`docker run` words: the key directory mounted, and the environment pointing at it."""
    out = ["-v", f"{host_dir}:{CONTAINER_DIR}"]
    for name, value in env(CONTAINER_DIR).items():
        out += ["-e", f"{name}={value}"]
    return out


def usable(directory: Path) -> str | None:
    """Why this process cannot use `directory` as a key directory (None: it can). The launcher's cache_prepare
    checks the same for its starts; this one serves the in-image probe."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        st = directory.stat()
    except OSError as exc:
        return f"cannot create {directory} ({exc.strerror})"
    if st.st_uid != os.geteuid():
        return f"{directory} belongs to uid {st.st_uid}, not this user (uid {os.geteuid()})"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"{directory} is not writable"
    import shutil

    free_mb = shutil.disk_usage(directory).free // 2**20
    if free_mb < int(os.environ.get(MIN_FREE_ENV) or MIN_FREE_MB):
        return f"{directory}: only {free_mb} MB free on its disk"
    return None


def tree_bytes(path: Path, *, follow: bool = False) -> int:
    """Bytes of the files under `path`; `follow`: a symlink counts as what it points to (HF cache blobs)."""
    size = os.stat if follow else os.lstat
    total = 0
    for base, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += size(os.path.join(base, f)).st_size
    return total


def usage(root: str | os.PathLike) -> dict:
    """{"root", "bytes", "keys": [{"key", "bytes"}]} of a cache root, newest key first ({} keys when absent)."""
    root = Path(root)
    try:
        dirs = sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
    except OSError:
        dirs = []
    keys = [{"key": d.name, "bytes": tree_bytes(d)} for d in dirs]
    return {"root": str(root), "bytes": sum(k["bytes"] for k in keys), "keys": keys}


def purge(root: str | os.PathLike) -> tuple[int, str | None]:
    """Remove a cache root: (bytes removed, None) or (bytes, why some of it stayed)."""
    import shutil

    root = Path(root)
    if not root.exists():
        return 0, None
    size = tree_bytes(root)
    errors: list[str] = []
    shutil.rmtree(root, onerror=lambda _f, path, exc: errors.append(f"{path}: {getattr(exc[1], 'strerror', exc[1])}"))
    return size, (
        f"{len(errors)} entries stayed, e.g. {errors[0]} (files a container wrote as root: sudo rm -rf {root})"
        if errors
        else None
    )


def classify(log: str) -> str:
    """A start's compile cache, read from its server log: reload (vLLM read an entry, failed to load it and compiled
    again), warm (loaded, nothing compiled), cold (compiled), or none (nothing compiled: --enforce-eager)."""
    if any(s in log for s in MISS_LINES):
        return "reload"
    warm, cold = (any(s in log for s in lines) for lines in (WARM_LINES, COLD_LINES))
    return "reload" if warm and cold else "warm" if warm else "cold" if cold else "none"
