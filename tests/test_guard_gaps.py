"""Guard gaps (issue 22 campaign): a joined short option that argparse reads as a plan-owned setting, and an
option appended after a workaround's flag that undoes it."""

from __future__ import annotations

import argparse

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.vllm_args import normalise

WITH_REPLAY_FLAG = ["--model", "V4.1-Flash", "--gpu", "mi355x", "--build", "nightly-rocm100-ac9126e5"]


def test_argparse_reads_a_joined_short_option_as_the_option():
    # vLLM's FlexibleArgumentParser is a stdlib ArgumentParser: this is the reading the guard must match.
    p = argparse.ArgumentParser()
    p.add_argument("--nnodes", "-n", type=int)
    p.add_argument("--node-rank", "-r", type=int)
    assert p.parse_args(["-n2", "-r1"]) == argparse.Namespace(nnodes=2, node_rank=1)


@pytest.mark.parametrize("token", ["-n2", "-n=2", "-r1", "-nfoo"])
def test_a_joined_short_option_reaching_a_plan_owned_setting_is_refused(token):
    with pytest.raises(UsageError, match="conflicts with what the plan decides"):
        normalise(token)


def test_recipe_refuses_a_joined_short_option_in_one_line():
    r = CliRunner().invoke(cli, ["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--vllm-arg=-n2"])
    assert r.exit_code == 2 and "read by vLLM as -n 2" in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("token", ["--swa-bounded-replay", "--swa_bounded_replay", "--swa-bounded",
                                   "--no-swa-bounded-replay=1"])
def test_an_option_undoing_a_workaround_is_refused(token):
    r = CliRunner().invoke(cli, ["recipe", *WITH_REPLAY_FLAG, f"--vllm-arg={token}"])
    assert r.exit_code == 2, r.output
    assert "undoes --no-swa-bounded-replay, which workaround rocm-no-swa-bounded-replay adds" in r.output


def test_repeating_the_workaround_flag_or_a_build_without_it_is_fine():
    r = CliRunner().invoke(cli, ["recipe", *WITH_REPLAY_FLAG, "--vllm-arg=--no-swa-bounded-replay"])
    assert r.exit_code == 0 and "--no-swa-bounded-replay" in r.output
    # v0.33.0 contains vllm#57906: the workaround's flag is left out, so nothing is undone.
    r = CliRunner().invoke(cli, ["recipe", "--model", "V4.1-Flash", "--gpu", "mi355x", "--vllm-version", "0.33.0",
                                 "--vllm-arg=--swa-bounded-replay"])
    assert r.exit_code == 0, r.output
