"""What an operator still trips on, part two: unbounded reads, secrets and values passed on unchecked, docs that
drifted. One regression test per item, each failing on the code before its fix; commands run through bash."""

from __future__ import annotations

import os
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
