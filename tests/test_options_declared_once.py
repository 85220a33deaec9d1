"""The selection and cluster flags are declared once (rocm_dspark/recipe/options.py): the click options,
the library's keys and the words `up` gives back to a command all come from the same records."""

from __future__ import annotations

import click
import pytest

from rocm_dspark.cli.launch import launch
from rocm_dspark.cli.probe import probe
from rocm_dspark.cli.recipe import recipe
from rocm_dspark.cli.up import up
from rocm_dspark.cli.validate import validate
from rocm_dspark.recipe.options import CLUSTER_KEYS, CLUSTER_OPTIONS, SELECTION_KEYS, SELECTION_OPTIONS, selection_argv
from rocm_dspark.recipe.plan import Selection


def parsed(command: click.Command, words: list[str]) -> dict:
    """What click hands the command for `words` (its real parser, nothing invoked)."""
    with command.make_context("rocm-dspark", list(words), resilient_parsing=False) as ctx:
        return dict(ctx.params)


# A value for every option, in the form the command receives it (concurrency: recipe keeps the largest level).
VALUES = {
    "model": "V4.1-Flash", "gpu": "mi355x", "gpus_per_node": 4, "nodes": 2, "head_address": "10.0.0.1", "tp": 4,
    "dp": 2, "ep": 8, "max_num_seqs": 64, "max_num_batched_tokens": 8192, "num_speculative_tokens": "4",
    "k_schedule": "1-16:5,17-64:4", "no_speculation": True, "capture_cap": 512, "vllm_version": "0.33.0",
    "build": "v0.33.0-rocm", "concurrency": 16, "memory_override": True, "adaptive": "off", "state_dir": "/srv/st",
    "benchmark_synthetic": 2.5, "model_path": "/models/v41 flash", "served_name": "v41", "host": "127.0.0.1",
    "port": 9000, "extra_args": ("--enforce-eager", "--max-model-len=8192"), "extra_env": ("HF_HOME",),
    "image": "rocm/vllm:v0.33.0", "registry": "mirror.local:5000",
}


def test_every_option_has_a_value_here_so_the_round_trip_covers_it():
    assert set(VALUES) == set(SELECTION_KEYS)


def test_selection_argv_parses_back_to_the_same_values_through_each_command():
    words = selection_argv(VALUES)
    for command in (recipe, launch, up):
        got = parsed(command, words)
        for key in SELECTION_KEYS:
            if command is up and key == "concurrency":
                continue  # up's own --concurrency (its levels) wins over the selection's
            assert got[key] == VALUES[key], (command.name, key)


def test_defaults_and_unset_values_are_left_out():
    assert selection_argv({"model": "V4.1-Flash", "nodes": 1, "adaptive": "auto", "gpu": None, "extra_args": (),
                           "memory_override": False, "host": ""}) == ["--model", "V4.1-Flash"]
    assert selection_argv({"model": "m", "state_dir": "/x", "port": 1}, exclude=("state_dir",)) == ["--model", "m",
                                                                                                   "--port", "1"]


def test_an_env_value_is_never_written_only_its_name():
    words = selection_argv({"model": "m", "extra_env": ("HF_TOKEN=hf_secret", "A=b=c")})
    assert words == ["--model", "m", "--env", "HF_TOKEN", "--env", "A"] and "hf_secret" not in " ".join(words)


def test_a_zero_valued_option_is_written():
    assert selection_argv({"node_rank": 0}, options=CLUSTER_OPTIONS) == ["--node-rank", "0"]


@pytest.mark.parametrize("command, records", [(recipe, SELECTION_OPTIONS + CLUSTER_OPTIONS),
                                              (launch, SELECTION_OPTIONS + CLUSTER_OPTIONS),
                                              (up, SELECTION_OPTIONS), (probe, SELECTION_OPTIONS),
                                              (validate, SELECTION_OPTIONS)])
def test_each_command_declares_these_options_from_the_records(command, records):
    params = {p.name: p for p in command.params}
    for o in records:
        if command in (up, validate) and o.key == "concurrency":
            continue  # their own --concurrency: the levels
        p = params[o.key]
        assert tuple(p.opts) + tuple(p.secondary_opts) == o.flags and p.help == o.help
        assert p.required == o.required or command is probe and o.key == "model"  # `probe --show` needs no model


def test_the_library_keys_are_the_records_and_the_plan_takes_them():
    # Selection carries every selection key but the gate's mode and the state dir (read apart, not planned).
    assert set(SELECTION_KEYS) - {"adaptive", "state_dir"} <= set(Selection._fields)
    assert CLUSTER_KEYS[0] == "strategy" and len(set(SELECTION_KEYS + CLUSTER_KEYS)) == len(SELECTION_KEYS + CLUSTER_KEYS)


def options_table() -> list[str]:
    """docs/cli.md's table of the shared flags, from the records."""
    from rocm_dspark.cli import bounds

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    def value(o) -> str:
        if o.switch:
            return "switch"
        if o.choices:
            return ", ".join(o.choices)
        if o.type:
            t = getattr(bounds, o.type)
            return f"{t.lo}..{t.hi}" if isinstance(t.hi, int) else f"{t.lo:g}..{t.hi:g}"
        return o.metavar or "text"

    rows = ["| flag | value | default | commands | what |", "|---|---|---|---|---|"]
    for records, where in ((SELECTION_OPTIONS, "recipe, launch, up, probe, validate"), (CLUSTER_OPTIONS, "recipe, launch")):
        for o in records:
            default = "required" if o.required else ("" if o.default in (None, False) else f"`{o.default}`")
            rows.append(f"| {', '.join(f'`{f}`' for f in o.flags)} | {cell(value(o))} | {default} | {where} | "
                        f"{cell(o.help)} |")
    return rows


def test_docs_cli_options_table_is_the_records():
    import os
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
    text = page.read_text()
    start, end = "<!-- options-table: generated by tests/test_options_declared_once.py -->\n", "\n<!-- /options-table -->"
    i, j = text.index(start) + len(start), text.index(end)
    want = "\n".join(options_table())
    if os.environ.get("ROCM_DSPARK_UPDATE_DOCS") == "1":
        page.write_text(text[:i] + want + text[j:])
        return
    assert text[i:j] == want, "docs/cli.md's options table is stale: rerun with ROCM_DSPARK_UPDATE_DOCS=1"
