"""Every command's --help ends with an `Example:` block, and every example parses: no flag in it is unknown."""

from __future__ import annotations

import shlex

import click
import pytest
from click.testing import CliRunner

from rocm_dspark.cli import COMMANDS, cli


def commands():
    out = [((), cli)]
    for name in sorted(COMMANDS):
        cmd = cli.get_command(None, name)
        out.append(((name,), cmd))
        if isinstance(cmd, click.Group):
            out += [((name, sub), cmd.get_command(None, sub)) for sub in cmd.list_commands(None)]
    return out


COMMAND_IDS = [" ".join(path) or "rocm-dspark" for path, _ in commands()]


def examples(help_text: str) -> list[list[str]]:
    block = help_text.split("Example:", 1)[1]
    lines = [ln.strip() for ln in block.splitlines()]
    return [shlex.split(ln)[1:] for ln in lines if ln.startswith("rocm-dspark ")]


@pytest.mark.parametrize("path,cmd", commands(), ids=COMMAND_IDS)
def test_help_has_an_example_that_parses(path, cmd):
    res = CliRunner().invoke(cli, [*path, "--help"])
    assert res.exit_code == 0, res.output
    assert "Example:" in res.output, f"`rocm-dspark {' '.join(path)} --help` has no Example: section"
    found = examples(res.output)
    assert found, "the Example: block names no rocm-dspark command"
    for argv in found:
        if "COMMAND" in argv:
            continue
        assert tuple(argv[:len(path)]) == path, argv
        try:
            cmd.make_context(" ".join(path), argv[len(path):], resilient_parsing=False)
        except click.NoSuchOption as exc:  # an unknown flag is a wrong example
            pytest.fail(f"example `rocm-dspark {shlex.join(argv)}`: {exc.format_message()}")
        except click.UsageError:
            pass  # e.g. a path that does not exist on this machine: the flags themselves are known
