"""CLI fuzz (issue #14, item 5): 10^3 random command lines over every command and option, in process, and not one
traceback, hang, odd exit status or multi-line usage error. benchmarks/cli_fuzz.py runs 10^5 and counts.
What runs for real and what is stubbed (the bodies of probe runs, validate and plugin status): tests/fuzz_cli.py."""

from hypothesis import HealthCheck, given, settings

from tests.fuzz_cli import COMMAND_TABLE, invocations, make_runner, run_one, stubs

RUNNER = make_runner()


def test_every_command_is_fuzzed():
    assert {"recipe", "list", "launch", "plan", "probe", "validate", "plugin status"} <= set(COMMAND_TABLE)


@settings(max_examples=1000, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(invocations())
def test_random_command_lines_never_crash(argv):
    with stubs():
        outcome = run_one(RUNNER, argv)
    assert outcome.finding is None, f"{outcome.finding}: rocm-dspark {argv!r}"
