"""What an operator still trips on, part two: unbounded reads, secrets and values passed on unchecked, docs that
drifted. One regression test per item, each failing on the code before its fix; commands run through bash."""

from __future__ import annotations

import json
import os
import re
import resource
import shlex
import subprocess

import pytest

from tests.conftest import CLI, REPO, cli_env

V41 = ["--model", "V4.1-Flash", "--gpu", "mi300x"]


def sh(args, timeout=120, mem_gb=3, **env):
    """The CLI in a subprocess under a memory limit (an unbounded read fails fast instead of eating the host)."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (mem_gb << 30, mem_gb << 30))

    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=cli_env(**env),
                          preexec_fn=limit, check=False)


def one_line(p, code=2):
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert p.returncode == code, (p.returncode, p.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("rocm-dspark: error: ") and "Traceback" not in p.stderr, p.stderr
    return lines[0]


def sparse(path, size, mode=0o644):
    with open(path, "wb") as fh:
        fh.truncate(size)
    os.chmod(path, mode)
    return str(path)


# Bounded reads -------------------------------------------------------------------------------------------
def test_plan_calibrate_refuses_a_device_and_a_huge_file(tmp_path):
    assert "--calibrate /dev/zero: not a regular file" in one_line(sh(["plan", *V41, "--calibrate", "/dev/zero"]))
    os.mkfifo(tmp_path / "fifo")
    assert "not a regular file" in one_line(sh(["plan", *V41, "--calibrate", str(tmp_path / "fifo")], timeout=60))
    big = sparse(tmp_path / "big.csv", (16 << 20) + 1)
    assert "larger than 16 MiB" in one_line(sh(["plan", *V41, "--calibrate", big]))


def test_an_existing_env_file_is_read_with_a_bound(tmp_path):
    env_file = sparse(tmp_path / "x.env", (1 << 20) + 1, 0o600)
    p = sh(["launch", *V41, "--format", "systemd", "--output", str(tmp_path), "--env-file", env_file,
            "--env", "HF_TOKEN"], HF_TOKEN="hf_x")
    assert "--env-file" in one_line(p) and "larger than 1 MiB" in p.stderr


def test_recipe_files_and_state_files_are_read_with_a_bound(tmp_path, recipes_copy):
    (recipes_copy / "gpus.yaml").unlink()
    (recipes_copy / "gpus.yaml").symlink_to("/dev/zero")
    err = one_line(sh(["recipe", *V41], ROCM_DSPARK_RECIPES=str(recipes_copy)))
    assert "gpus.yaml: not a regular file" in err
    state = tmp_path / "state"
    (state / "images").mkdir(parents=True)
    os.mkfifo(state / "images" / "resolved.json")  # a FIFO for the registry cache: read as "no answers", no hang
    p = sh(["recipe", *V41, "--state-dir", str(state)], timeout=60, ROCM_DSPARK_RECIPES=str(REPO / "recipes"))
    assert p.returncode == 0, p.stderr


# Secrets and values --------------------------------------------------------------------------------------
def test_up_warns_of_a_secret_on_the_command_line():
    p = sh(["up", *V41, "--env", "HF_TOKEN=secret123", "--dry-run"])
    assert p.returncode == 0, p.stderr
    assert "warning: --env HF_TOKEN=...: a secret on the command line is visible in shell history" in p.stderr


def test_an_empty_exported_value_is_refused(tmp_path):
    p = sh(["launch", *V41, "--format", "systemd", "--output", str(tmp_path), "--env", "HF_TOKEN"], HF_TOKEN="")
    assert "HF_TOKEN is set but empty" in one_line(p)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_an_env_file_of_another_user_is_refused(tmp_path):
    env_file = tmp_path / "x.env"
    env_file.write_text("HF_TOKEN=hf_theirs\n")
    os.chmod(env_file, 0o600)
    os.chown(env_file, 65534, 65534)
    out = tmp_path / "out"
    out.mkdir()
    p = sh(["launch", *V41, "--format", "systemd", "--output", str(out), "--env-file", str(env_file)])
    assert "is owned by uid 65534, not by you" in one_line(p)
    assert list(out.iterdir()) == []


def test_an_env_file_that_is_not_utf8_is_refused_even_when_kept(tmp_path):
    env_file = tmp_path / "x.env"
    env_file.write_bytes(b"HF_TOKEN=hf_\xff\n")
    os.chmod(env_file, 0o600)
    p = sh(["launch", *V41, "--format", "systemd", "--output", str(tmp_path), "--env-file", str(env_file)])
    assert "not UTF-8 text" in one_line(p)


def test_a_new_env_value_says_how_it_reaches_an_installed_node(tmp_path):
    p = sh(["launch", *V41, "--format", "systemd", "--output", str(tmp_path), "--env", "HF_TOKEN"], HF_TOKEN="hf_new")
    assert p.returncode == 0, p.stderr
    text = p.stdout.replace("\\\n", " ")
    assert "these --env values (HF_TOKEN) do not reach it" in " ".join(text.split())
    cmd = next(ln.strip() for ln in text.splitlines() if ln.strip().startswith("sudo install -m 0600"))
    words = shlex.split(cmd)
    assert words[-2] == str(tmp_path / "rocm-dspark-deepseek-v4-1-flash-mi300x.env") and os.path.isfile(words[-2])
    assert words[-1] == "/etc/rocm-dspark/rocm-dspark-deepseek-v4-1-flash-mi300x.env"
    assert subprocess.run(["bash", "-n", "-c", cmd], check=False).returncode == 0


# Values passed on unchecked -------------------------------------------------------------------------------
@pytest.mark.parametrize("args,words", [
    (["--vllm-arg=--no-such-vllm-flag"], "--vllm-arg --no-such-vllm-flag: vLLM build v0.33.0-rocm72 has no such flag"),
    (["--vllm-arg=--max-model-len=abc"], "reads --max-model-len as an integer such as 65536 or 64k, or auto; 'abc' is not"),
    (["--vllm-arg=--enforce-eager=yes"], "--enforce-eager takes no value in vLLM build v0.33.0-rocm72"),
    (["--vllm-arg=--max-model-len"], "--max-model-len needs a value"),
    (["--host", "a b"], "--host 'a b' is not an IP address or host name"),
    (["--host", "999.1.1.1"], "--host '999.1.1.1' is not an IP address or host name"),
    (["--registry", "host:0"], "PORT 1-65535"),
    (["--registry", "host:99999"], "PORT 1-65535"),
    (["--served-model-name", "a\nb"], "--served-model-name 'a\\nb' holds a control character"),
])
def test_values_are_checked_before_they_reach_a_plan(args, words):
    assert words in one_line(sh(["recipe", *V41, *args]))


@pytest.mark.parametrize("args", [["--vllm-arg=--max-model-len=64k"], ["--vllm-arg=--max-model=4096"],
                                  ["--vllm-arg=--enforce-eager"], ["--vllm-arg=--dtype=bfloat16"], ["--host", "::"],
                                  ["--host", "node-1.example.com"], ["--registry", "[::1]:5000"],
                                  ["--build", "nightly-3df4ae15", "--vllm-arg=--not-known-to-this-table"]])
def test_good_values_still_pass(args):
    p = sh(["recipe", *V41, *args])
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("cap,size", [(8, 8), (512, 512), (1000, 512), (1024, 1024)])
def test_capture_cap_has_one_rule(cap, size):
    p = sh(["recipe", *V41, "--capture-cap", str(cap), "--format", "json"])
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    argv = plan["argv"]
    assert argv[argv.index("--max-cudagraph-capture-size") + 1] == str(size)
    assert any(n["topic"] == "capture overrun" for n in plan["notes"]) == (size < 768), plan["notes"]


@pytest.mark.parametrize("env,words", [({"XDG_STATE_HOME": "TMP/x\nb", "ROCM_DSPARK_STATE_DIR": ""}, "control character"),
                                       ({"XDG_STATE_HOME": "TMP/x\udcff", "ROCM_DSPARK_STATE_DIR": ""}, "not valid UTF-8"),
                                       ({"ROCM_DSPARK_STATE_DIR": "relative"}, "is a relative path")])
def test_the_state_dir_from_the_environment_is_checked_like_the_argument(env, words, tmp_path):
    env = {k: v.replace("TMP", str(tmp_path)) for k, v in env.items()}
    p = subprocess.run([*CLI, "probe", *V41], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=cli_env(**env), check=False)
    assert words in one_line(p)
    assert list(tmp_path.iterdir()) == []


# Text and docs that drifted ----------------------------------------------------------------------------
def _prose(page: str) -> str:
    """A docs page without its fenced blocks."""
    return re.sub(r"```.*?```", "", (REPO / "docs" / page).read_text(), flags=re.S)


def test_recipe_md_names_the_default_builds_and_has_a_row_per_build():
    from rocm_dspark.recipe.catalog import load_catalog

    cat, text = load_catalog(), (REPO / "docs" / "recipe.md").read_text()
    defaults = text[text.index("**Defaults**"):text.index("**Flags carry")]
    flat = " ".join(text.split())
    assert "newest build with public evidence" not in flat and "newest vLLM build with public evidence" not in flat
    for arch, d in cat.arch_defaults.items():
        assert arch in defaults and all(f"`{b}`" in defaults for b in d["builds"]), arch
    assert all(f"\n| `{name}` |" in text for name in cat.builds), [n for n in cat.builds if f"| `{n}` |" not in text]


def test_plan_md_quotes_only_numbers_its_checked_output_prints():
    text = (REPO / "docs" / "plan.md").read_text()
    shown = "".join(re.findall(r"```.*?```", text, flags=re.S))
    prose = _prose("plan.md")
    quoted = re.findall(r"(\d+\.\d+)(?:%| points)", prose)
    assert all(q in shown for q in quoted), [q for q in quoted if q not in shown]
    assert "needs numpy" in prose


def test_no_short_note_is_cut_inside_a_command():
    from rocm_dspark.launch.render import note_lines
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.recipe.resolve import Selection, resolve

    cat, seen = load_catalog(), 0
    for model in cat.models.values():
        for gpu in model.profiles:
            for build in cat.builds:
                try:
                    plan = resolve(cat, Selection(model=model.key, gpu=gpu, build=build))
                except Exception:  # noqa: BLE001 - a build the model cannot run
                    continue
                for line in note_lines(plan.notes):
                    seen += line.startswith("# adaptive verification:")
                    assert line.count("`") % 2 == 0, line
                    assert not (line.startswith("# adaptive verification:") and line.endswith("...")), line
    assert seen > 10


def test_up_has_no_strategy_and_says_it_brings_up_one_node():
    err = one_line(sh(["up", *V41, "--nodes", "2", "--dry-run"]))
    assert "up brings up one node" in err and "add --dp" in err and "pass --strategy" not in err
    p = sh(["up", *V41, "--nodes", "2", "--dp", "2", "--head-address", "10.0.0.1", "--dry-run"])
    assert p.returncode == 0 and "up brings up node 0 of the 2-node group only" in p.stderr, p.stderr
    assert "brings up **one node**" in (REPO / "docs" / "up.md").read_text()
    assert "Probe record directory" not in sh(["up", "--help"]).stdout


def test_the_readmes_multinode_launch_block_runs_in_a_fresh_directory(tmp_path):
    readme = (REPO / "README.md").read_text()
    at = readme.index("--name grp --output out")
    block = readme[readme.rindex("```\n", 0, at) + 4:readme.index("```", at)]
    script = block.split("\nip netns", 1)[0].replace("rocm-dspark ", f"{' '.join(CLI)} ", 1)
    p = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=cli_env(), check=False)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "out" / "grp-node0-head.sh").is_file() and (tmp_path / "out" / "grp-node1-worker.sh").is_file()


def _starts(line: str) -> list[int]:
    return [m.start() for m in re.finditer(r"(?<=  )\S", line)]


def test_list_and_images_columns_line_up(tmp_path):
    out = sh(["list"]).stdout.splitlines()
    i, j = out.index("vLLM builds (recipes/vllm.yaml):"), out.index("Models and profiles:")
    profiles = [ln for ln in out[j:] if ln.startswith("    ")]
    for table in (out[1:i], out[i + 1:j], profiles):  # each a column set: every row's starts, a prefix of the widest
        widest = max((_starts(ln) for ln in table), key=len)
        assert all(widest[:len(_starts(ln))] == _starts(ln) for ln in table), table
    p = sh(["images", "--gpu", "mi300x", "--registry", "127.0.0.1:9", "--http", "--state-dir", str(tmp_path)])
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith(("build", "v0.", "nightly"))]
    head = rows[0]
    for col in ("tag", "in registry", "digest", "answer / role"):
        assert len({head.index(col)} | {len(r[:head.index(col)]) for r in rows}) == 1
        assert all(r[head.index(col) - 2:head.index(col)] == "  " for r in rows[1:]), (col, rows)
    # no registry answered: the reason once (stderr), and no "earlier answers" where there are none
    assert "no answer:" not in p.stdout and "earlier answers" not in p.stdout, p.stdout
    assert "none has before" in p.stdout
    assert p.returncode == 3 and "no registry answered" in one_line(p, 3)


def test_validate_refuses_a_python_that_does_not_exist(tmp_path):
    p = sh(["validate", *V41, "--endpoint", "http://127.0.0.1:9", "--report", str(tmp_path / "r"),
            "--python", "/nonexistent/python"])
    assert "'/nonexistent/python' does not exist" in one_line(p) and not (tmp_path / "r").exists()


def test_cli_md_documents_exit_130():
    text = (REPO / "docs" / "cli.md").read_text()
    assert re.search(r"^\| 130 \| interrupted \(Ctrl-C\)", text, flags=re.M)
