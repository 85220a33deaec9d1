"""Messages that point the right way (issue 23): did-you-mean, --nodes without --strategy, list-valued
--concurrency, `up`'s GPU line, MI350X's status line, and a short bare `rocm-dspark`."""

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.cli import COMMANDS, cli
from rocm_dspark.recipe.resolve import Selection, resolve
from tests.fuzz_cli import make_runner

RUNNER = make_runner()
CAT = load_catalog()


def error_line(args):
    result = RUNNER.invoke(cli, args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("rocm-dspark: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("args,suggestion", [
    (["--model", "V4.1-Flsh"], "(did you mean V4.1-Flash?)"),
    (["--model", "V4.1-Flash", "--gpu", "mi355"], "(did you mean mi355x?)"),
    (["--model", "V4.1-Flash", "--build", "nightly-3df4ae1"], "(did you mean nightly-3df4ae15?)"),
    (["--model", "V4.1-Flash", "--build", "v0.33"], "(did you mean v0.33.0?)"),
    (["--model", "V4.1-Flash", "--strategy", "multi_node_dp", "--nodes", "2", "--head-address", "10.0.0.1"],
     "(did you mean multi_node_dep?)"),
])
def test_a_typo_gets_the_close_name(args, suggestion):
    assert suggestion in error_line(["recipe", *args])


def test_a_name_far_from_every_known_one_gets_no_guess():
    line = error_line(["recipe", "--model", "V4.1-Flash", "--gpu", "h100"])
    assert "did you mean" not in line and "known GPUs: mi300x, mi325x, mi350x, mi355x" in line


def test_nodes_without_strategy_names_strategy():
    line = error_line(["recipe", "--model", "V4.1-Flash", "--nodes", "2", "--head-address", "10.0.0.1"])
    assert "--strategy" in line and "--dp 1" not in line
    # an explicit --dp keeps the precise message
    line = error_line(["recipe", "--model", "V4.1-Flash", "--nodes", "2", "--dp", "3", "--head-address", "10.0.0.1"])
    assert "--dp 3 must be a multiple of --nodes 2" in line


def test_recipe_concurrency_takes_a_list_and_plans_for_its_largest_level():
    listed = RUNNER.invoke(cli, ["recipe", "--model", "V4.1-Flash", "--gpu", "mi355x", "--concurrency", "1,64",
                                 "--format", "json"])
    single = RUNNER.invoke(cli, ["recipe", "--model", "V4.1-Flash", "--gpu", "mi355x", "--concurrency", "64",
                                 "--format", "json"])
    assert listed.exit_code == 0, listed.stderr
    assert listed.stdout == single.stdout and '"concurrency": 64' in listed.stdout
    assert "every level must be at least 1" in error_line(["recipe", "--model", "V4.1-Flash", "--concurrency", "0,4"])
    assert "comma-separated positive integers" in error_line(["recipe", "--model", "V4.1-Flash", "--concurrency", "a"])
    assert "--concurrency is empty" in error_line(["recipe", "--model", "V4.1-Flash", "--concurrency", ""])


def test_up_gpu_failure_names_no_validate_only_flag(tmp_path, monkeypatch):
    """`up` requires a GPU itself: its fix line must not send the user to validate's --require-gpu."""
    from rocm_dspark.validate import start_checks

    monkeypatch.setenv(start_checks.HOST_ROOT_VAR, str(tmp_path / "host"))  # an empty host: no /dev/kfd
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no amd-smi, no rocminfo
    result = RUNNER.invoke(cli, ["up", "--model", "V4.1-Flash", "--gpu", "mi355x", "--mode", "foreground", "--yes",
                                 "--state-dir", str(tmp_path / "state")])
    last = result.output.strip().splitlines()[-1]
    assert result.exit_code == 1 and last.startswith("rocm-dspark up: step prereq failed: gpus: no AMD GPU"), result.output
    assert "(`up` needs an AMD GPU); fix: run `up` on an MI300-class node" in last and "--require-gpu" not in result.output
    # validate keeps naming its own flag
    from rocm_dspark.validate import host_checks
    from rocm_dspark.validate.context import Context, ValidateOptions

    opts = ValidateOptions(report_dir=tmp_path, require_gpu=True, host_root=str(tmp_path / "host"))
    assert host_checks.gpus(Context(opts, CAT, None, None)).message.endswith("(--require-gpu)")


@pytest.mark.parametrize("gpu", sorted(CAT.models["DeepSeek-V4.1-Flash"].profiles))
def test_every_gpu_gets_a_status_line_that_says_run_validate(gpu):
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu=gpu))
    status = {n.topic: n for n in plan.notes}["status"]
    assert "run `rocm-dspark validate` before taking traffic" in status.short
    assert "not yet run on MI300-class hardware" in status.text
    if gpu == "mi350x":  # verified on the vLLM recipe page; no build in recipes/vllm.yaml has a public MI350X run
        assert plan.status == "verified" and "no public mi350x run of any build" in status.short


def test_bare_command_prints_the_command_list_in_a_few_lines():
    result = RUNNER.invoke(cli, [])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) <= 4
    assert all(name in lines[0] for name in COMMANDS) and "rocm-dspark recipe --model V4.1-Flash" in result.stderr


def test_did_you_mean_names_ties_and_stays_quiet_when_far():
    from rocm_dspark.errors import did_you_mean

    assert did_you_mean("mi30x", ["mi300x", "mi325x", "mi350x"]) == " (did you mean mi300x or mi350x?)"
    assert did_you_mean("0.29.0", ["v0.32.0", "v0.33.0"]) == ""
    assert did_you_mean("V4.1-FLASH ", ["V4.1-Flash"]) == " (did you mean V4.1-Flash?)"
