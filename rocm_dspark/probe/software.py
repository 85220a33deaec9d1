"""The software a probe record is made under: vLLM (version, commit), torch (version, HIP) and ROCm.

Read from files only (vLLM's and torch's version.py found via importlib.util.find_spec, /opt/rocm/.info/version):
the gate runs on the `rocm-dspark recipe` path, which must not import torch or vLLM. This module uses the
standard library alone, so `rocm-dspark up` can also run it, as a script, inside a container image
(`in_image`) and gate a plan that runs there on that image's software.
"""

from __future__ import annotations

import importlib.util
import json  # noqa: F401 (script() appends a line that prints with it)
import os
import re
from pathlib import Path

KEYS = ("vllm_version", "vllm_commit", "torch_version", "hip_version", "rocm_version")


def _package_dir(name: str) -> Path | None:
    """The directory of an installed top-level package, without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _assigned(text: str, name: str) -> str | None:
    """The string literal assigned to `name` in a generated version.py (`x: T = '...'`, `a = x = '...'`);
    None for `= None` or no assignment."""
    m = re.search(
        rf"^(?:\w+\s*=\s*)*{name}\s*(?::[^=\n]*)?=\s*(?:\w+\s*=\s*)*(None|'([^']*)'|\"([^\"]*)\")", text, re.M
    )
    if not m or m.group(1) == "None":
        return None
    return m.group(2) if m.group(2) is not None else m.group(3)


def vllm_facts() -> tuple[str | None, str | None]:
    """(version, commit) of the installed vLLM as vLLM itself reports them (vllm/_version.py)."""
    pkg = _package_dir("vllm")
    if pkg is None:
        return None, None
    text = _read(pkg / "_version.py") or ""
    version = _assigned(text, "__version__") or _assigned(text, "version")
    if version is None:
        import importlib.metadata  # ~20 ms: only when vLLM's own _version.py says nothing

        try:
            version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
    commit = _assigned(text, "__commit_id__") or _assigned(text, "commit_id")
    if commit is None:  # nightly wheels carry it in the local version: 0.30.0.dev12+geed1f3d0.rocm700
        m = re.search(r"\+g([0-9a-f]{7,40})", version)
        commit = m.group(1) if m else None
    if commit and re.fullmatch(r"g[0-9a-f]{7,40}", commit):  # git-describe style 'g<hash>'
        commit = commit[1:]
    return version, commit


def torch_facts() -> tuple[str | None, str | None]:
    """(version, HIP version or None) of the installed torch, from torch/version.py."""
    pkg = _package_dir("torch")
    text = _read(pkg / "version.py") if pkg else None
    if text is None:
        return None, None
    return _assigned(text, "__version__"), _assigned(text, "hip")


def rocm_version() -> str | None:
    text = _read(Path(os.environ.get("ROCM_PATH") or "/opt/rocm") / ".info" / "version")
    return (text or "").strip() or None


def facts() -> dict:
    """This Python's software facts, keyed by KEYS."""
    return dict(zip(KEYS, (*vllm_facts(), *torch_facts(), rocm_version())))


def script() -> str:
    """Python source that prints facts() as one JSON line, for another interpreter (an image's python3)."""
    return Path(__file__).read_text() + "\nprint(json.dumps(facts()))\n"


def parse(text: str) -> dict:
    """script()'s output -> facts (ValueError when it is not that)."""
    from rocm_dspark.inputs import parse_json  # here, not at the top: script() runs this file without the package

    data = parse_json((text.strip().splitlines() or [""])[-1], "the software facts")
    if (
        not isinstance(data, dict)
        or set(data) != set(KEYS)
        or not all(v is None or isinstance(v, str) for v in data.values())
    ):
        raise ValueError(f"not the facts script's output: {text[:200]!r}")
    return data


def in_image(tool: str, image: str, timeout_s: float = 600.0) -> dict:
    """The software facts of `image`, read by its own python3 (no network, removed afterwards); RuntimeError
    with the reason."""
    import subprocess

    argv = [tool, "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", script()]
    try:
        proc = subprocess.run(argv, text=True, capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"`{tool} run --rm {image} python3` failed: {exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"`{tool} run --rm {image} python3` exited {proc.returncode}: {last[0][:300]}")
    try:
        return parse(proc.stdout)
    except ValueError as exc:
        raise RuntimeError(str(exc)) from None
