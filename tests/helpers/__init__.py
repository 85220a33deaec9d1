"""Helpers the fast tests share, one home each (tests/conftest.py re-exports these basics and holds the
fixtures built on the helpers). A helper module never imports tests.conftest: conftest imports them."""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
CLI = [sys.executable, "-m", "rocm_dspark"]


def cli_env(**extra):
    """Environment for running the CLI in a subprocess: no AMD tools on PATH unless a test adds them."""
    env = dict(os.environ)
    env.update(extra)
    return env
