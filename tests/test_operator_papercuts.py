"""Issue 30: what an operator trips on. One regression test per item, each failing on the code before its fix."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from tests.conftest import CLI, cli_env
from tests.helpers.recipes import _break
from tests.helpers import run_cli as run_cli_in_process

V41 = ["--model", "V4.1-Flash", "--gpu", "mi300x"]


def run(args, **kw):
    return CliRunner().invoke(cli, args, **kw)


def one_line_error(r, code=2):
    lines = r.output.strip().splitlines()
    assert r.exit_code == code, r.output
    assert len(lines) == 1 and lines[0].startswith("rocm-dspark: error: "), r.output
    return lines[0]


# 1 -------------------------------------------------------------------------------------------------------
def test_a_symlinked_env_file_is_refused_whatever_its_mode(tmp_path):
    target = tmp_path / "passwd"
    target.write_text("root:x:0:0::/root:/bin/sh\n")
    for mode in (0o644, 0o600):
        target.chmod(mode)
        link = tmp_path / f"link{mode:o}.env"
        link.symlink_to(target)
        r = run(["launch", *V41, "--format", "systemd", "--output", str(tmp_path), "--env-file", str(link)])
        line = one_line_error(r)
        assert "symbolic link" in line and "chmod" not in line, line
        assert oct(target.stat().st_mode & 0o777) == oct(mode) and "root:x" in target.read_text()


# 2 -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["VLLM_ROCM_USE_AITER", "OMP_NUM_THREADS"])
def test_a_repeated_env_cannot_change_a_plan_owned_value(key):
    plan = json.loads(run(["recipe", *V41, "--format", "json"]).output)
    planned = plan["env"][key]
    r = run(["recipe", *V41, "--env", f"{key}={planned}", "--env", f"{key}=7{planned}"])
    assert "the plan sets" in one_line_error(r)


# 3 -------------------------------------------------------------------------------------------------------
def test_up_with_env_hf_token_does_not_warn_anonymous(monkeypatch, tmp_path):
    from rocm_dspark.usecase.launch_plan import plan_from_options
    from rocm_dspark.validate import start_checks

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no token file either
    opts = {"model": "V4.1-Flash", "gpu": "mi300x", "extra_env": ("HF_TOKEN=hf_x",)}
    token = start_checks.checkpoint(plan_from_options(opts), None, needs_download=True)["hf token"]
    assert token.status == "pass" and "--env HF_TOKEN" in token.message, token


# 4 -------------------------------------------------------------------------------------------------------
def test_k8s_launch_names_the_secret_its_manifest_needs(tmp_path):
    r = run(["launch", *V41, "--format", "k8s", "--name", "svc", "--output", str(tmp_path), "--env", "FOO=bar"])
    assert r.exit_code == 0, r.output
    text = (tmp_path / "svc.k8s.yaml").read_text()
    assert "name: svc-env" in text and "Secret svc-env with FOO" in r.output, r.output
    assert "a Secret hf-token and" not in r.output


# 5 -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cap", ["1", "6", "7"])
def test_capture_cap_error_names_a_value_that_runs(cap):
    import re

    line = one_line_error(run(["recipe", *V41, "--capture-cap", cap]))
    seqs = re.search(r"--max-num-seqs (\d+) or less", line)
    at_least = re.search(r"raise the cap to at least (\d+)", line)
    assert seqs or at_least, line
    fix = ["--max-num-seqs", seqs.group(1), "--capture-cap", cap] if seqs else ["--capture-cap", at_least.group(1)]
    assert run(["recipe", *V41, *fix]).exit_code == 0, (line, fix)


# 6 -------------------------------------------------------------------------------------------------------
def test_a_newline_in_a_recipe_base_arg_is_one_line_naming_file_and_key(recipes_copy):
    path = _break(recipes_copy, "models/deepseek-v4.1-flash.yaml", '  - [--max-model-len, "1048576"]',
                  '  - [--max-model-len, "1\\n$(touch x)"]')
    r = run_cli_in_process(["recipe", *V41], capture_output=True, text=True,
                       env=cli_env(ROCM_DSPARK_RECIPES=str(recipes_copy)))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and str(path) in r.stderr and "base_args" in r.stderr, r.stderr


# 7 -------------------------------------------------------------------------------------------------------
def test_cost_table_refuses_json_booleans(tmp_path):
    table = tmp_path / "c.json"
    table.write_text(json.dumps({"verify": [[1, 2.0], [True, False]]}))
    line = one_line_error(run(["plan", "--gpu", "mi300x", "--cost-table", str(table)]))
    assert "boolean" in line and "verify[1][0]" in line, line


# 8 -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env", ["ü=1", "変数=1", "Aé=1"])
def test_k8s_env_names_must_be_ascii(tmp_path, env):
    r = run(["launch", *V41, "--format", "k8s", "--output", str(tmp_path), "--env", env])
    assert "variable name" in one_line_error(r) and not list(tmp_path.iterdir())


def test_k8s_service_names_start_with_a_letter(tmp_path):
    r = run(["launch", *V41, "--format", "k8s", "--name", "1abc", "--output", str(tmp_path)])
    assert "start with a lower-case letter" in one_line_error(r) and not list(tmp_path.iterdir())


# 9 -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,flag", [
    (["recipe", *V41, "--state-dir", ""], "--state-dir"),
    (["launch", *V41, "--output", ""], "--output"),
    (["launch", *V41, "--name", " "], "--name"),
    (["launch", *V41, "--format", "systemd", "--user", ""], "--user"),
    (["validate", *V41, "--endpoint", "http://127.0.0.1:9", "--report", ""], "--report"),
    (["status", "--state-dir", ""], "--state-dir"),
    (["plan", "--gpu", "mi300x", "--plot", ""], "--plot"),
    (["up", *V41, "--dry-run", "--name", ""], "--name"),
])
def test_every_empty_path_or_name_is_refused(tmp_path, monkeypatch, args, flag):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(run(args))
    assert f"{flag} is empty" in line and not list(tmp_path.iterdir()), line


# 10 ------------------------------------------------------------------------------------------------------
def test_a_missing_model_path_is_warned_for_elsewhere_and_refused_here(tmp_path):
    r = run(["recipe", *V41, "--model-path", "/nonexistent"])
    assert r.exit_code == 0 and "warning: --model-path '/nonexistent' does not exist here" in r.output
    line = one_line_error(run(["up", *V41, "--dry-run", "--model-path", "/nonexistent"]))
    assert "does not exist on this machine" in line
    for cmd in (["recipe"], ["launch", "--output", str(tmp_path)]):  # a refusal stays one line (cli_fuzz found it)
        assert "unknown model" in one_line_error(run([*cmd, "--model", "nope", "--model-path", "/nonexistent"]))


def test_local_cpu_wants_a_config_in_the_model_dir(tmp_path):
    from rocm_dspark.usecase.launch_plan import plan_from_options
    from rocm_dspark.validate import start_checks

    plan = plan_from_options({"model": "V4.1-Flash", "gpu": "mi300x"})
    check = start_checks.checkpoint(plan, str(tmp_path), needs_download=False)["model path"]
    assert check.status == "fail" and "config.json" in check.message
    (tmp_path / "config.json").write_text("{}")
    assert start_checks.checkpoint(plan, str(tmp_path), needs_download=False)["model path"].status == "pass"


# 11 ------------------------------------------------------------------------------------------------------
def test_validate_endpoint_not_a_url_is_usage(tmp_path):
    line = one_line_error(run(["validate", *V41, "--endpoint", "not-a-url", "--report", str(tmp_path / "r")]))
    assert "base URL" in line and not (tmp_path / "r").exists()


# 12 ------------------------------------------------------------------------------------------------------
def test_plan_concurrency_has_recipe_s_bound():
    from rocm_dspark.cli.bounds import MAX_SEQS

    big = str(MAX_SEQS + 1)
    assert f"at most {MAX_SEQS}" in one_line_error(run(["recipe", *V41, "--concurrency", big]))
    assert f"at most {MAX_SEQS}" in one_line_error(run(["plan", "--gpu", "mi300x", "--concurrency", big]))


# 13 ------------------------------------------------------------------------------------------------------
def test_up_dry_run_with_a_misspelt_gpu_prints_nothing_first():
    r = run_cli_in_process(["up", "--model", "V4.1-Flash", "--dry-run", "--gpu", "mi30x"], capture_output=True,
                       text=True, env=cli_env())
    assert r.returncode == 2 and r.stdout == "" and "did you mean mi300x" in r.stderr, (r.stdout, r.stderr)


# 14 ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("var,expect", [("XDG_STATE_HOME", "{d}/rocm-dspark/launch/"),
                                        ("ROCM_DSPARK_STATE_DIR", "{d}/launch/")])
def test_shell_launch_says_where_state_goes_as_the_launcher_does(tmp_path, monkeypatch, var, expect):
    monkeypatch.delenv("ROCM_DSPARK_STATE_DIR", raising=False)
    monkeypatch.setenv(var, str(tmp_path / "st"))
    r = run(["launch", *V41, "--output", str(tmp_path)])
    assert r.exit_code == 0 and expect.format(d=tmp_path / "st") in r.output, r.output


# 15 ------------------------------------------------------------------------------------------------------
def test_stale_texts_are_gone():
    from tests.conftest import REPO

    for cmd in ("recipe", "launch", "probe"):
        assert "newest with public evidence" not in " ".join(run([cmd, "--help"]).output.split())
    assert "fallback model on the floating `nightly` build" not in (REPO / "README.md").read_text()
    flash = run(["recipe", "--model", "V4-Flash", "--gpu", "mi300x", "--explain"]).output
    assert "no public V4.1 run" not in flash and "no public DeepSeek-V4-Flash run" in flash
    synopsis = (REPO / "docs" / "launch.md").read_text().split("```")[1]
    assert "k8s" in synopsis


# 16 ------------------------------------------------------------------------------------------------------
def test_a_missing_optional_dependency_exits_3_in_one_line():
    code = "import sys; sys.modules['numpy'] = None; from rocm_dspark.cli import main; main(['plan', '--gpu', 'mi300x'])"
    r = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, env=cli_env())
    assert r.returncode == 3 and r.stderr.strip().splitlines() == [
        "rocm-dspark: error: this command needs numpy; install it with pip install 'rocm-dspark[planner]'"], r.stderr


def test_an_unreachable_registry_exits_3_from_images_and_launch_pull(recipes_copy, tmp_path):
    """The registry is a closed loopback port (real); `docker` is a stand-in that holds no image (no daemon here
    for a fast test)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    vllm = recipes_copy / "vllm.yaml"
    vllm.write_text(vllm.read_text().replace("image: vllm/vllm-openai-rocm:", f"image: 127.0.0.1:{port}/vllm/vllm-openai-rocm:"))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    docker = bindir / "docker"
    docker.write_text("#!/bin/sh\necho 'Error: No such image' >&2\nexit 1\n")
    docker.chmod(0o755)
    env = cli_env(ROCM_DSPARK_RECIPES=str(recipes_copy), PATH=f"{bindir}:{os.environ['PATH']}")
    out = tmp_path / "out"
    out.mkdir()
    for args in (["images", "--gpu", "mi300x", "--http"],
                 ["launch", *V41, "--container", "--pull", "--output", str(out)]):
        r = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 3 and "Traceback" not in r.stderr, (args, r.returncode, r.stderr)
    assert not list(out.iterdir())


# 17 ------------------------------------------------------------------------------------------------------
def test_security_doc_says_what_the_score_misses_in_container_mode(tmp_path):
    from rocm_dspark.launch.launch_facts import DOCKER_RUN_FLAGS
    from tests.conftest import REPO

    r = run(["launch", *V41, "--format", "systemd", "--container", "--name", "svc", "--output", str(tmp_path)])
    assert r.exit_code == 0 and "docker" in next(line for line in (tmp_path / "svc.service").read_text().splitlines()
                                                 if line.startswith("SupplementaryGroups="))
    doc = " ".join((REPO / "docs" / "security.md").read_text().split())
    part = doc[doc.index("What the score does not cover in container mode"):][:1500]
    loosened = [f.split("=", 1)[1] for f in DOCKER_RUN_FLAGS if f.startswith(("--cap-add=", "--security-opt="))]
    assert loosened and all(flag in part for flag in loosened), loosened
    for phrase in ("SupplementaryGroups=docker", "root-level privileges", "root-equivalent",
                   "https://docs.docker.com/engine/install/linux-postinstall/",
                   "https://docs.docker.com/engine/security/seccomp/"):
        assert phrase in part, phrase


# 19 ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("group", [[], ["plugin"]])
def test_help_command_lists_show_whole_summaries(group):
    out = run([*group, "--help"]).output
    listed = out[out.index("Commands:"):].splitlines()[1:]
    assert listed and all(not line.rstrip().endswith("...") and len(line) <= 80 for line in listed), listed


# 18 ------------------------------------------------------------------------------------------------------
def _over(text: str, width: int) -> list[str]:
    """Lines past `width`, except one that is a single word after its indent or comment mark (a URL, a long
    path), with or without its ` \\` continuation."""
    def words(ln: str) -> int:
        try:
            return len(shlex.split(ln.lstrip(" #").removesuffix(" \\")))
        except ValueError:  # a comment's own quote: read as blank-separated words
            return len(ln.split())
    return [ln for ln in text.splitlines() if len(ln) > width and words(ln) > 1]


def _bash_words(text: str) -> list[str]:
    """The words bash reads from a printed command line (continuations joined)."""
    out = subprocess.run(["bash", "-c", "printf '%s\\0' " + text], capture_output=True, text=True, check=True).stdout
    return out.split("\0")[:-1]


def _bash_argv(text: str) -> list[str]:
    """The words bash runs for a printed `vllm serve` command (vllm a function that prints them)."""
    script = "vllm() { printf '%s\\0' vllm \"$@\"; }\n" + text
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    return out.split("\0")[:-1]


@pytest.mark.parametrize("columns", [None, "60"])
def test_recipe_fits_the_width_and_its_command_still_runs(monkeypatch, columns):
    import shlex

    from rocm_dspark import textwidth

    if columns:
        monkeypatch.setenv("COLUMNS", columns)
    width = int(columns or textwidth.PIPE_WIDTH)
    plan = json.loads(run(["recipe", *V41, "--concurrency", "64", "--format", "json"]).output)
    for explain in ([], ["--explain"]):
        text = run(["recipe", *V41, "--concurrency", "64", *explain]).output
        assert not _over(text, width), _over(text, width)
        command = text.split("\n# ")[0]
        assert _bash_argv(command) == plan["argv"]
        env = [f"{k}={v}" for k, v in plan["env"].items()]
        assert shlex.split(command.replace("\\\n", "")) == env + plan["argv"]
    assert any(ln.startswith("#   ") for ln in run(["recipe", *V41, "--explain"]).output.splitlines())  # hanging


def test_plan_and_up_dry_run_fit_the_width():
    import re
    import shlex

    from rocm_dspark import textwidth

    text = run(["plan", "--gpu", "mi300x,mi355x", "--nodes", "2"]).output
    table = [ln for ln in text.splitlines() if " | " in ln or (ln and not ln.strip("-"))]
    assert table and all(len(ln) <= textwidth.MAX_TABLE for ln in table)
    assert not _over("\n".join(ln for ln in text.splitlines() if ln not in table), 100)
    apply = re.search(r"  apply: (.*?)\n(?!    --)", text, re.S).group(1)
    assert shlex.split(apply.replace("\\\n", ""))[:2] == ["rocm-dspark", "recipe"]
    dry = run(["up", *V41, "--dry-run"]).output
    assert not _over(dry, 100), _over(dry, 100)
    said = next(ln for ln in re.sub(r"\n *#   ", " ", dry).splitlines() if "its command (" in ln)
    plan = json.loads(run(["recipe", *V41, "--format", "json"]).output)
    assert shlex.split(said.split("run it): ", 1)[1])[-len(plan["argv"]):] == plan["argv"]  # a comment, word for word


def test_launch_fits_the_width_and_its_run_line_pastes(tmp_path):
    """The shell launcher's "run it" line was one 221-column line (session 5's note): the command now stands on
    its own line, quoted, and the prose wraps."""
    import shlex

    out = tmp_path / "a dir with spaces"
    out.mkdir()
    text = run(["launch", *V41, "--output", str(out)]).output
    assert not _over(text, 100), _over(text, 100)
    lines = text.splitlines()
    command = lines[lines.index("Run it:") + 1:next(i for i, ln in enumerate(lines) if ln.startswith("State, logs"))]
    assert shlex.split("\n".join(command).replace("\\\n", "")) == [str(out / "rocm-dspark-deepseek-v4-1-flash-mi300x.sh")]
    assert _bash_words("\n".join(command)) == [str(out / "rocm-dspark-deepseek-v4-1-flash-mi300x.sh")]


def test_a_warning_never_comes_before_a_refusal():
    """Found by tests/test_cli_fuzz.py on the merged tree: --env's secret warning, then a later option's error,
    made two lines. Warnings wait for the command to succeed (rocm_dspark.errors.warn)."""
    r = run(["launch", "--model", "V4.1-Flash", "--k-per-batch-size", "-", "--env", "_TOKEN=x"])
    assert r.exit_code == 2 and r.output.strip().count("\n") == 0 and "warning" not in r.output, r.output
    ok = run(["recipe", "--model", "V4.1-Flash", "--env", "_TOKEN=x"])
    assert ok.exit_code == 0 and "warning: --env _TOKEN=...: a secret on the command line" in ok.output
