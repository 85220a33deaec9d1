"""Renderers: shell round-trips to env + argv through shlex; JSON is complete; docker has the AMD flags."""

import json
import shlex
import subprocess

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.plan import LaunchPlan, Note
from rocm_dspark.launch.render import RENDERERS, render_docker, render_json, render_shell
from rocm_dspark.recipe.resolve import Selection, resolve

CAT = load_catalog()
PROFILES = [(m, g) for m in CAT.models for g in CAT.models[m].profiles]


def split_shell(text):
    # shlex does not join continuation lines; a shell drops each backslash-newline the renderer emits (between
    # words, and inside a long word split into quoted pieces: rocm_dspark/textwidth.py).
    words = shlex.split(text.replace("\\\n", ""), comments=True)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


@pytest.mark.parametrize("model,gpu", PROFILES)
def test_shell_round_trips(model, gpu):
    plan = resolve(CAT, Selection(model=model, gpu=gpu))
    env, argv = split_shell(render_shell(plan))
    assert env == plan.env and tuple(argv) == plan.argv


def test_shell_round_trips_hostile_values(tmp_path):
    plan = resolve(CAT, Selection(
        model="V4.1-Flash", gpu="mi355x", served_name="it's \"$(rm -rf /)\" `x` %h ü",  # a newline: refused
        model_path="/models/with space/$HOME\nx"))
    plan = plan._replace(env={**plan.env, "HF_TOKEN": "a'b\"c$d\ne"})  # a plan value (--env values are never printed)
    env, argv = split_shell(render_shell(plan))
    assert env == plan.env and tuple(argv) == plan.argv
    # And a real bash agrees: run the text with a stand-in `vllm` that records its argv and env.
    stand_in = tmp_path / "vllm"
    stand_in.write_text("#!/bin/sh\nprintf '%s\\0' \"$0\" \"$@\" > \"$OUT_ARGV\"\n"
                        "printf '%s' \"$HF_TOKEN\" > \"$OUT_ENV\"\n")
    stand_in.chmod(0o755)
    out_argv, out_env = tmp_path / "argv", tmp_path / "env"
    subprocess.run(["bash", "-c", render_shell(plan)], check=True, env={
        "PATH": f"{tmp_path}:/usr/bin:/bin", "OUT_ARGV": str(out_argv), "OUT_ENV": str(out_env)})
    recorded = out_argv.read_bytes().split(b"\0")[:-1]
    assert [w.decode() for w in recorded[1:]] == list(plan.argv[1:])
    assert out_env.read_text() == plan.env["HF_TOKEN"]


def test_env_values_given_by_the_operator_are_named_never_printed():
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", extra_env=(("HF_TOKEN", "hf_PLANTED"), ("X", "y"))))
    for fmt in ("shell", "docker", "json"):
        text = RENDERERS[fmt](plan)
        assert "hf_PLANTED" not in text, fmt
    assert "# set in your environment first (given by --env, not printed): HF_TOKEN X" in render_shell(plan)
    assert "--env-file ./rocm-dspark-deepseek-v4-1-flash-mi355x.env" in RENDERERS["docker"](plan)
    assert json.loads(RENDERERS["json"](plan))["secret_env"] == ["HF_TOKEN", "X"]


def test_notes_cannot_break_out_of_comments():
    base = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x"))
    plan = base._replace(notes=(Note("x", "line one\nrm -rf / #"),))
    env, argv = split_shell(render_shell(plan))
    assert tuple(argv) == plan.argv


def test_json_is_valid_and_complete():
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x"))
    data = json.loads(render_json(plan))
    assert data["argv"] == list(plan.argv) and data["env"] == plan.env and data["image"] == plan.image
    assert data["speculative_config"]["enable_adaptive_verification"] is False
    assert {"topic", "text"} <= set(data["notes"][0]) and data["status"] == "experimental"
    assert data["block_argv"] == data["argv"] and data["adaptive_verification"] is False
    # Complete: every plan field, with the structure (build, layout, limits) as plain JSON.
    assert set(data) == set(LaunchPlan._fields)
    assert data["build"]["name"] == plan.build.name and data["build"]["image"] == plan.image
    assert (data["tp"], data["max_num_seqs"], data["capture_size"], data["k"]) == (8, 128, 1024, 5)
    assert '"enable_adaptive_verification":true' in " ".join(data["adaptive_argv"])


def test_docker_has_the_amd_device_flags_and_the_same_command():
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x"))
    text = render_docker(plan)
    words = shlex.split(text.replace("\\\n", ""), comments=True)
    for flag in ("--device=/dev/kfd", "--device=/dev/dri", "--group-add=video", "--ipc=host",
                 "--security-opt=seccomp=unconfined"):
        assert flag in words
    i = words.index(plan.image)
    assert words[i - 2:i] == ["--entrypoint", "vllm"] and tuple(words[i + 1:]) == plan.argv[1:]
    values = [words[j + 1] for j, w in enumerate(words) if w == "-e"]
    assert dict(v.split("=", 1) for v in values if "=" in v) == plan.env
    assert [v for v in values if "=" not in v] == ["HF_TOKEN"]  # passed by name from the caller's environment
    assert '"${HF_HOME:-${HOME:-/root}/.cache/huggingface}:/root/.cache/huggingface"' in text  # expanded by the shell
