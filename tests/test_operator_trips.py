"""What an operator still trips on: Ctrl-C, unbounded reads, stdout, late refusals, values passed on unchecked.
One regression test per item, each failing on the code before its fix."""

from __future__ import annotations

import os
import subprocess

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from tests.conftest import CLI, cli_env

V41 = ["--model", "V4.1-Flash", "--gpu", "mi300x"]


def run(args, **kw):
    return CliRunner().invoke(cli, args, **kw)


def one_line_error(r, code=2):
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert r.exit_code == code, r.output
    assert len(lines) == 1 and lines[0].startswith("rocm-dspark: error: "), r.output
    return lines[0]


# Interrupts and resources ------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [["up", *V41, "--dry-run"], ["plan", *V41],
                                  ["validate", *V41, "--endpoint", "http://127.0.0.1:9", "--report", "OUT/r"],
                                  ["launch", *V41, "--output", "OUT"]])
def test_ctrl_c_exits_130_from_every_command(args, monkeypatch, tmp_path):
    from rocm_dspark.recipe import catalog

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(catalog, "load_catalog", interrupted)
    r = run([a.replace("OUT", str(tmp_path)) for a in args])
    assert r.exit_code == 130, (r.exit_code, r.output)
    assert "interrupted" in r.output


def test_stdout_errors_exit_3_naming_stdout():
    env = cli_env()
    with open("/dev/full", "w") as full:
        p = subprocess.run([*CLI, "recipe", *V41], stdout=full, stderr=subprocess.PIPE, text=True, env=env, check=False)
    assert p.returncode == 3 and "stdout" in p.stderr, (p.returncode, p.stderr)
    p = subprocess.run(f"{' '.join(CLI)} recipe {' '.join(V41)} --format json >&-", shell=True,
                       stderr=subprocess.PIPE, text=True, env=env, check=False)
    assert p.returncode == 3 and "stdout is closed" in p.stderr, (p.returncode, p.stderr)


def test_an_interrupted_validate_leaves_no_empty_report_dir(monkeypatch, tmp_path):
    from rocm_dspark.validate import report, runner

    real_prepare = report.prepare_dir

    def prepare_then_stop(path, force):
        real_prepare(path, force)
        os.makedirs(os.path.join(path, "launch"), exist_ok=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner.report, "prepare_dir", prepare_then_stop)
    out = tmp_path / "rep"
    r = run(["validate", *V41, "--endpoint", "http://127.0.0.1:9", "--report", str(out)])
    assert r.exit_code == 130, r.output
    assert not out.exists()
