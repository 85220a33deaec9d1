"""Copy the installed closure of some distributions out of a venv (for scripts/build_cpu_test_image.sh).

    VENV/bin/python scripts/venv_closure.py freeze ROOT...             name==version of the closure, sorted
    VENV/bin/python scripts/venv_closure.py copy SITE BIN PYTHON [--drop D]... ROOT...

The closure is what `pip install ROOT...` would have installed: each root's requirements whose markers hold
(with the extras asked for), followed transitively, read from the venv's own metadata. `copy` copies exactly the
files each distribution's RECORD lists under site-packages into SITE (so an editable install or a test extra in
the venv stays out) and writes each one's console scripts into BIN, run by PYTHON (the path where they will run:
inside the image, not this machine's path to it). --drop leaves a distribution
(and what only it needs) out. Runs with the venv's python: it reads that interpreter's distributions.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(roots: list[str], drop: set[str]) -> dict[str, md.Distribution]:
    seen: dict[str, tuple[md.Distribution, frozenset]] = {}
    todo = [(r, frozenset()) for r in roots]
    while todo:
        name, extras = todo.pop()
        if canonicalize_name(name) in drop:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # a requirement the venv does not hold (setup_vllm_cpu.sh drops torchvision & co.)
        key = canonicalize_name(dist.metadata["Name"])
        had = seen.get(key)
        if had is not None and extras <= had[1]:
            continue
        extras = extras | (had[1] if had else frozenset())
        seen[key] = (dist, extras)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
                todo.append((req.name, frozenset(req.extras)))
    return {k: d for k, (d, _) in seen.items()}


def copy(dists: dict[str, md.Distribution], site: Path, bindir: Path, python: str) -> None:
    for dist in dists.values():
        base = Path(dist.locate_file(""))
        for f in dist.files or []:
            if f.parts[0] == "..":  # bin/ scripts: written below, for PYTHON
                continue
            src, dst = base / f, site / f
            if src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst, follow_symlinks=False)
        for ep in dist.entry_points.select(group="console_scripts"):
            module, _, attr = ep.value.partition(":")
            script = bindir / ep.name
            # The __main__ guard as pip writes it: vLLM's engine starts with spawn, which re-imports __main__.
            script.write_text(f"#!{python}\nimport sys\nfrom {module} import {attr.split('.')[0]}\n"
                              f"if __name__ == '__main__':\n    sys.exit({attr}())\n")
            os.chmod(script, 0o755)


def main(argv: list[str]) -> int:
    mode, rest = argv[0], argv[1:]
    drop = set()
    while "--drop" in rest:
        i = rest.index("--drop")
        drop.add(canonicalize_name(rest[i + 1]))
        del rest[i:i + 2]
    if mode == "freeze":
        dists = closure(rest, drop)
    elif mode == "copy":
        site, bindir, python, roots = Path(rest[0]), Path(rest[1]), rest[2], rest[3:]
        dists = closure(roots, drop)
        copy(dists, site, bindir, python)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for key in sorted(dists):
        print(f"{key}=={dists[key].version}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
