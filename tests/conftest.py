import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def recipes_copy(tmp_path, monkeypatch):
    """A private copy of recipes/ that a test may break; ROCM_DSPARK_RECIPES points at it."""
    dst = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", dst)
    monkeypatch.setenv("ROCM_DSPARK_RECIPES", str(dst))
    return dst


def cli_env(**extra):
    """Environment for running the CLI in a subprocess: no AMD tools on PATH unless a test adds them."""
    env = dict(os.environ)
    env.update(extra)
    return env


CLI = [sys.executable, "-m", "rocm_dspark"]
