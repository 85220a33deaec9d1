import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(autouse=True)
def private_state_dir(tmp_path_factory, monkeypatch):
    """Probe records of the developer's own machine must not change what the tests see."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("ROCM_DSPARK_STATE_DIR", str(state))
    monkeypatch.delenv("COLUMNS", raising=False)  # output widths as in a pipe (rocm_dspark/textwidth.py), not this shell's
    return state


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
