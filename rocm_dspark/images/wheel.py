"""This toolkit's wheel, for an image: built from the running toolkit's own source tree with no registry asked
(rocm-dspark is not on PyPI), mounted read-only into a container and installed there with --no-deps, so the
image's vLLM loads the plugin through its entry point. The in-image probe (rocm_dspark.probe.inimage) and the
local-cpu target's served CPU container (rocm_dspark.up.target) both use it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MOUNT = "/rocm-dspark-wheel"  # where the wheel directory is mounted, read-only
INSTALL_DIR = "/tmp/rocm-dspark-toolkit"  # pip installs into the container's own /tmp (the mount stays read-only)


def mount(wheel_dir) -> tuple[str, str]:
    return "-v", f"{wheel_dir}:{MOUNT}:ro"


def pip_install(wheel: str = "*.whl") -> str:
    """The shell line that installs the mounted wheel inside the container."""
    return f"python3 -m pip install -q --no-deps --no-index --target {INSTALL_DIR} {MOUNT}/{wheel}"


def toolkit_source() -> Path | None:
    """The source tree of the running toolkit (its pyproject.toml names rocm-dspark), or None."""
    import rocm_dspark

    root = Path(rocm_dspark.__file__).resolve().parents[1]
    try:
        text = (root / "pyproject.toml").read_text()
    except OSError:
        return None
    return root if 'name = "rocm-dspark"' in text else None


def wheel_path(out_dir) -> Path | None:
    """The file build_wheel writes into out_dir (the source tree's version in the wheel's name), or None where
    there is no source tree to build from."""
    import tomllib

    src = toolkit_source()
    if src is None:
        return None
    version = tomllib.loads((src / "pyproject.toml").read_text())["project"]["version"]
    return Path(out_dir) / f"rocm_dspark-{version}-py3-none-any.whl"


def build_argv(out_dir, src) -> list[str]:
    """`pip wheel` of the running Python (sys.executable read now: a test stands in for it), no registry asked."""
    wheel = ["wheel", "--no-deps", "--no-index", "--no-build-isolation", "-q", "-w", str(out_dir), str(src)]
    return [sys.executable, "-m", "pip", *wheel]


def build_wheel(out_dir: Path, *, timeout_s: float = 600.0) -> Path:
    """Build this toolkit's wheel into out_dir (its old wheels removed first); RuntimeError with one line on
    failure."""
    src = toolkit_source()
    if src is None:
        raise RuntimeError(
            "the running rocm-dspark has no source tree beside it (installed from a wheel?), so no "
            "wheel can be built for the image; install it with `pip install -e <checkout>`"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="rocm-dspark-wheel-src-") as tmp:
        # setuptools writes build/ and *.egg-info beside the sources: build from a copy (symlinks such as
        # rocm_dspark/recipes copied as the files they point to), never in the checkout.
        copy = Path(tmp) / "src"
        copy.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(src / name, copy / name)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        shutil.copytree(src / "rocm_dspark", copy / "rocm_dspark", ignore=ignore)
        proc = subprocess.run(
            build_argv(out_dir, copy),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=tmp,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )
    wheels = sorted(out_dir.glob("rocm_dspark-*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"`pip wheel --no-deps {src}` failed (exit {proc.returncode}): {last}")
    return wheels[0]
