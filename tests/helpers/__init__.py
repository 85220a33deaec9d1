"""Helpers the fast tests share, one home each (tests/conftest.py re-exports these basics and holds the
fixtures built on the helpers). A helper module never imports tests.conftest: conftest imports them."""

import os
import subprocess
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


def dry_run_only(argv, *a, **k):
    """subprocess.run for an `up --dry-run`: only `docker info`, the read-only check the run makes of its mode,
    answers (a daemon that runs); any other command fails the test."""
    if list(argv)[1:2] == ["info"]:
        return subprocess.CompletedProcess(argv, 0, "28.2.2\n", "")
    raise AssertionError(f"--dry-run ran a command: {argv}")
