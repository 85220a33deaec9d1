"""Races and bounds (issue 22, item 7): concurrent `up` runs, integer options (the host key's race: tests/test_store.py)."""

from __future__ import annotations

import time

import click
import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.cli.bounds import BoundedFloat, BoundedInt
from tests.fuzz_cli import COMMAND_TABLE

# --- every numeric option has a bound and a one-line error ----------------------------------------------




NUMERIC = [(name, opt) for name, cmd in sorted(COMMAND_TABLE.items()) for opt in cmd.params
           if isinstance(opt, click.Option) and not opt.is_flag
           and isinstance(opt.type, (click.types.IntParamType, click.types.FloatParamType, BoundedInt, BoundedFloat))]


def test_there_are_numeric_options_to_check():
    assert len(NUMERIC) > 30


@pytest.mark.parametrize("command,opt", NUMERIC, ids=[f"{c}:{o.opts[0]}" for c, o in NUMERIC])
def test_every_numeric_option_has_both_bounds(command, opt):
    t = opt.type
    if isinstance(t, (BoundedInt, BoundedFloat)):
        assert t.lo is not None and t.hi is not None
    else:
        assert isinstance(t, click.IntRange) and t.min is not None and t.max is not None, (command, t)


def _argv(command, opt, value):
    argv = command.split()
    if any(p.name == "model" and p.required for p in COMMAND_TABLE[command].params):
        argv += ["--model", "V4.1-Flash"]
    return [*argv, f"{max(opt.opts, key=len)}={value}"]


@pytest.mark.parametrize("command,opt", NUMERIC, ids=[f"{c}:{o.opts[0]}" for c, o in NUMERIC])
@pytest.mark.parametrize("value", ["9" * 400, "-" + "9" * 400, "9" * 5000, "nan", "1e308"])
def test_a_huge_value_is_one_line_exit_2(tmp_path, monkeypatch, command, opt, value):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROCM_DSPARK_STATE_DIR", str(tmp_path / "state"))
    if value in ("nan", "1e308") and isinstance(opt.type, (BoundedInt, click.IntRange)):
        value = "9" * 30
    t0 = time.monotonic()
    r = CliRunner().invoke(cli, _argv(command, opt, value))
    assert time.monotonic() - t0 < 20
    assert r.exit_code == 2 and r.exception is None or isinstance(r.exception, SystemExit), r.output
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rocm-dspark: error: "), r.output


def test_400_digit_batched_tokens_is_one_line():
    r = CliRunner().invoke(cli, ["recipe", "--model", "V4.1-Flash", "--max-num-batched-tokens", "9" * 400])
    assert r.exit_code == 2 and r.output.strip() == (
        "rocm-dspark: error: --max-num-batched-tokens must be at most 2147483647, got a 400-digit number")


@pytest.mark.parametrize("extra", [[], ["--format", "k8s"]])
def test_a_billion_nodes_is_refused_fast(extra):
    t0 = time.monotonic()
    r = CliRunner().invoke(cli, ["recipe", "--model", "V4.1-Flash", "--strategy", "multi_node_dep", "--nodes",
                                 "1000000000", "--head-address", "10.0.0.1", *extra])
    assert time.monotonic() - t0 < 5 and r.exit_code == 2
    assert "--nodes must be at most 1024, got 1000000000" in r.output
    r = CliRunner().invoke(cli, ["plan", "--model", "V4.1-Flash", "--nodes", "1000000000"])
    assert r.exit_code == 2 and "--nodes must be at most 1024" in r.output
