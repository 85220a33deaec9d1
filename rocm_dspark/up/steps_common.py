"""What `up`'s step modules share (steps, serve, prove, target): the failure every step raises, the up directory's
JSON files and the toolkit's wheel built there."""

from __future__ import annotations

import json
from pathlib import Path

from rocm_dspark.runtime.actions import Failed as StepFailed  # noqa: F401 - what a step raises: one line and its fix


def write_json(run, name: str, data) -> Path:
    """A JSON file in the up directory, 0600 (it may hold the plan's --env values)."""
    from rocm_dspark.atomic import write_atomic

    run.dir.mkdir(parents=True, exist_ok=True)
    return write_atomic(run.dir / name, json.dumps(data, indent=1, default=str) + "\n", mode=0o600)


def out_hash(run, step: str) -> str | None:
    """The hash of what `step` produced in this run (a later step's inputs include it)."""
    from rocm_dspark.service.state import digest

    out = run.outputs.get(step)
    return digest(out) if out is not None else None


def build_wheel(run, use: str) -> Path:
    """This toolkit's wheel in the up directory (rocm_dspark.images.wheel), for an image to install."""
    from rocm_dspark.images import wheel

    try:
        built = wheel.build_wheel(run.dir / "wheel")
    except RuntimeError as exc:
        raise StepFailed(
            str(exc),
            "install rocm-dspark from a source checkout (`pip install -e .`), or run `rocm-dspark probe` inside the "
            "image yourself (docs/adaptive-verification.md)",
        ) from None
    run.display.say(f"  built {built.name} (pip wheel --no-deps, no registry); {use}")
    return built
