"""Errors mean what they say: bad usage exits 2, a failing environment exits 3, each as one line."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from rocm_dspark.cli import LazyGroup
from rocm_dspark.errors import EXIT_ENVIRONMENT, EXIT_USAGE, EnvironmentFailure, UsageError
from rocm_dspark.runtime.client import ServerError
from rocm_dspark.runtime.metrics import CounterReset


@pytest.mark.parametrize("exc, code", [
    (UsageError("--gpu mi999: unknown GPU; use one of mi300x, mi355x"), EXIT_USAGE),
    (ServerError("GET /metrics: connection refused at http://127.0.0.1:8000"), EXIT_ENVIRONMENT),
    (CounterReset("num_drafts 10 -> 2: the server restarted between the two reads"), EXIT_ENVIRONMENT),
    (UsageError("--gpu mi999: unknown GPU;\n  use one of\n  mi300x, mi355x"), EXIT_USAGE),  # folded to one line
    (UsageError("--state-dir '/srv/a  b' is not a directory"), EXIT_USAGE),  # a value's two spaces kept
])
def test_exit_status_follows_the_error_type(exc, code):
    """Through the group that runs every command (rocm_dspark.cli.LazyGroup), as the installed command does."""

    @click.command()
    def cmd():
        raise exc

    class Group(LazyGroup):
        def get_command(self, ctx, name):
            return cmd

    res = CliRunner().invoke(click.group(cls=Group)(lambda: None), ["cmd"])
    assert res.exit_code == code
    one_line = " ".join(line.strip() for line in str(exc).splitlines())
    assert res.output == f"rocm-dspark: error: {one_line}\n"  # one line, no traceback
    assert ("a  b" in res.output) == ("a  b" in str(exc))


def test_environment_failures_are_not_usage_errors():
    assert (EXIT_USAGE, EXIT_ENVIRONMENT) == (2, 3)
    for kind in (ServerError, CounterReset):
        assert issubclass(kind, EnvironmentFailure) and not issubclass(kind, UsageError)
