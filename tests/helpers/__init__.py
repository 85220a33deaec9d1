"""Helpers the fast tests share, one home each (tests/conftest.py re-exports these basics and holds the
fixtures built on the helpers). A helper module never imports tests.conftest: conftest imports them."""

import os
import socket
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


def run_cli(args, *, env=None, cwd=None, input=None, text=True, **_subprocess_kw):
    """The CLI in this process, through click's CliRunner, as `subprocess.run([*CLI, *args], capture_output=True,
    ...)` would run it: a CompletedProcess with the exit status and stdout/stderr apart. `env` replaces the whole
    environment, as it does for a child. For the tests that are not about the process boundary (which keep
    subprocess: exit codes of a real process, no traceback, import cost, closed fds); this saves an interpreter
    start and the imports per call."""
    from click.testing import CliRunner

    from rocm_dspark.cli import main

    overrides = None
    if env is not None:
        overrides = {k: None for k in os.environ if k not in env}
        overrides.update(env)
    old_cwd = os.getcwd()
    with CliRunner().isolation(input=input, env=overrides) as (out, err, _):
        try:
            if cwd is not None:
                os.chdir(cwd)
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            os.chdir(old_cwd)
            sys.stdout.flush()
            sys.stderr.flush()
        stdout, stderr = out.getvalue(), err.getvalue()
    if text:
        stdout, stderr = stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")
    return subprocess.CompletedProcess(list(args), code, stdout, stderr)


def dry_run_only(argv, *a, **k):
    """subprocess.run for an `up --dry-run`: only `docker info`, the read-only check the run makes of its mode,
    answers (a daemon that runs); any other command fails the test."""
    if list(argv)[1:2] == ["info"]:
        return subprocess.CompletedProcess(argv, 0, "28.2.2\n", "")
    raise AssertionError(f"--dry-run ran a command: {argv}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
