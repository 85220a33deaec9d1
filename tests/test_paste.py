"""Printed commands paste into bash and run exactly their argv; the prose around them is `#` comments or plain
lines that no shell reads as a command. The renderers know which is which (the plan's argv, the install argvs);
nothing guesses it from a line's first word (that guess broke `journalctl -fu NAME` at 40 columns and printed
`plan`'s title as a `\\`-continued command). bash here is the real one; the commands run are stand-ins (shell
functions that print their argv), since vllm, docker and systemctl must not run on the test machine."""

import json
import shlex
import subprocess

import pytest

from rocm_dspark.launch.launch_facts import docker_run_argv
from rocm_dspark.launch.render import render_docker, render_shell
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.resolve import Selection, resolve
from tests.helpers import run_cli

CAT = load_catalog()
STAND_INS = "".join(f"{name}() {{ printf '%s\\0' {name} \"$@\"; printf '\\n'; }}\n"
                    for name in ("vllm", "docker", "sudo", "journalctl", "rocm-dspark"))


def pasted(text: str, env: dict | None = None) -> list[list[str]]:
    """The argv of every command bash runs from `text` (one list per command), after bash -n accepts it."""
    script = STAND_INS + text
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0, text
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/home/op", **(env or {})}).stdout
    return [ln.split("\0")[:-1] for ln in out.split("\n") if ln]


def _plan():
    long_path = "/models/" + "/".join(["a-rather-long-directory-name"] * 4) + "/DeepSeek-V4.1-Flash"
    return resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x", model_path=long_path, served_name="it's $x"))


@pytest.mark.parametrize("columns", ["40", "60", "100"])
@pytest.mark.parametrize("explain", [False, True])
def test_the_whole_recipe_output_pastes_and_runs_its_argv(monkeypatch, columns, explain):
    monkeypatch.setenv("COLUMNS", columns)
    plan = _plan()
    text = render_shell(plan, explain=explain)
    assert pasted(text) == [list(plan.argv)]
    command, _, rest = text.partition("\n# ")
    assert all(ln.startswith("#") for ln in ("# " + rest).splitlines())  # every note line a comment
    assert all(len(ln) <= int(columns) for ln in ("# " + rest).splitlines() if len(ln.split()) > 2)


@pytest.mark.parametrize("columns", ["40", "100"])
def test_the_whole_docker_output_pastes_and_runs_its_argv(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    plan = _plan()
    text = render_docker(plan)
    hub = "/home/op/.cache/huggingface/hub"  # the shell expands the cache paths (HOME set, HF_* unset)
    expected = docker_run_argv(plan, hf_home="/home/op/.cache/huggingface", hf_hub=hub)
    assert pasted(text) == [expected]
    assert all(ln.startswith("#") for ln in ("# " + text.partition("\n# ")[2]).splitlines())


@pytest.mark.parametrize("columns", ["40", "100"])
def test_launch_install_lines_paste_and_run_each_install_command(tmp_path, columns):
    """Every line under "Install and start:" is a command (launchers.install_commands): at 40 columns the
    journal line broke into `journalctl -fu` and a stray unit name when a first-word guess called it prose."""
    out = tmp_path / "out"
    out.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": columns}
    args = ["launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--format", "systemd", "--output", str(out)]
    p = run_cli(args, env=env)
    assert p.returncode == 0, p.stderr
    block = p.stdout.split("Install and start:\n", 1)[1]
    wanted = json.loads(run_cli([*args, "--json"], env=env).stdout)["install_commands"]
    assert pasted(block) == [shlex.split(c) for c in wanted]
    assert [c.split()[0] for c in wanted][-1] == "journalctl"


@pytest.mark.parametrize("columns", ["40", "80"])
def test_plan_prose_is_wrapped_as_prose_and_its_apply_line_pastes(columns):
    p = run_cli(["plan", "--model", "V4.1-Flash", "--gpu", "mi300x"], env={"PATH": "/usr/bin:/bin", "COLUMNS": columns})
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    apply = next(i for i, ln in enumerate(lines) if ln.startswith("  apply: "))
    command = [lines[apply].removeprefix("  apply: ")]
    while command[-1].endswith("\\"):
        command.append(lines[apply + len(command)])
    (words,) = pasted("\n".join(command))
    assert words[:2] == ["rocm-dspark", "recipe"] and "--num-speculative-tokens" in words
    # Only that command continues with `\`: the title ("rocm-dspark plan: ...") and notes are prose.
    continued = [i for i, ln in enumerate(lines) if ln.endswith("\\")]
    assert all(apply <= i < apply + len(command) for i in continued), [lines[i] for i in continued]
