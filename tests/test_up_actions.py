"""`up --dry-run` is a bash script: pasted into bash with stand-ins on PATH (each records its argv), it runs
exactly the argv the executor (rocm_dspark/runtime/actions.py) runs for the same actions, whatever the target, the
mode or the state dir's name; every other line is a comment. The stand-ins stand for what cannot run here
(amd-smi, rocminfo, docker, systemctl, sudo) and for what must not (sh -c useradd, install into /etc)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.runtime import actions

BASH = shutil.which("bash") or "/bin/bash"
TOOLS = ("amd-smi", "rocminfo", "docker", "systemctl", "sudo", "sh", "install", "journalctl", "vllm", "python")
V41 = ["--model", "V4.1-Flash", "--gpu", "mi300x"]
CASES = {
    "node container": [*V41, "--mode", "container", "--concurrency", "64"],
    "node systemd": [*V41, "--mode", "systemd", "--service-user", "vllm", "--concurrency", "64"],
    "node host": [*V41, "--mode", "foreground", "--concurrency", "64"],
    "local-cpu": ["--model", "V4.1-Flash", "--target", "local-cpu", "--concurrency", "4"],
    "local-cpu container": ["--model", "V4.1-Flash", "--target", "local-cpu", "--mode", "container",
                            "--image", "cpu-vllm:test", "--concurrency", "4"],
}
HOSTILE = ["plain", "it's \"quoted\"", "$(touch pwned)`id`", "new\nline", "ünï cödé ✓", "-dash; rm -rf x"]


@pytest.fixture
def standins(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        # A POSIX sh recorder, not a Python one: a dry run runs about 30 commands twice, and an interpreter start
        # each was most of this test's time. Each word goes in as A<word>NUL (argv cannot hold a NUL), E NUL ends.
        f = bin_dir / tool
        f.write_text("#!/bin/sh\n{ printf 'A%s\\0' \"${0##*/}\" \"$@\"; printf 'E\\0'; } >> \"$REC\"\n")
        f.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("REC", os.devnull)
    monkeypatch.setenv("COLUMNS", "60")  # narrow: most commands wrap
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    return bin_dir


def _records(path) -> list:
    """The recorded command lines, each [program name, *args] (the recorder's format: standins above)."""
    records: list = [[]]
    for token in (path.read_bytes().split(b"\0")[:-1] if path.exists() else []):
        if token == b"E":
            records.append([])
        else:
            assert token.startswith(b"A"), token
            records[-1].append(os.fsdecode(token[1:]))
    assert records[-1] == [], "a record without its end mark"
    return records[:-1]


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("case", list(CASES))
def test_the_dry_run_pasted_into_bash_runs_what_the_executor_runs(case, name, standins, tmp_path, monkeypatch):
    state = tmp_path / name
    state.mkdir()
    model = tmp_path / "model"
    model.mkdir()
    rendered: list = []
    real_render = actions.render
    monkeypatch.setattr(actions, "render", lambda acts, *a, **k: (rendered.extend(acts), real_render(acts, *a, **k))[1])
    flags = CASES[case] + (["--model-path", str(model)] if "local-cpu" in case else [])
    r = CliRunner().invoke(cli, ["up", *flags, "--dry-run", "--state-dir", str(state)])
    if "\n" in name:  # refused before anything is printed, as the real run refuses it
        assert r.exit_code == 2 and r.output.startswith("rocm-dspark: error: --state-dir") and not rendered, r.output
        return
    assert r.exit_code == 0, r.output
    runs = [a for a in rendered if isinstance(a, actions.Run)]
    assert runs, "no command in the dry run"

    monkeypatch.setenv("REC", str(tmp_path / "executor"))
    for a in runs:
        actions.execute(a)
    executed = _records(tmp_path / "executor")
    assert executed or case.startswith("local-cpu"), "the stand-ins recorded nothing"
    env = {**os.environ, "REC": str(tmp_path / "bash")}
    proc = subprocess.run([BASH, "-c", r.output], env=env, capture_output=True, text=True, cwd=tmp_path)
    pasted = _records(tmp_path / "bash")
    assert pasted == executed, (proc.stderr, r.output)  # local-cpu: its one command is the launcher, not yet written
    assert not (tmp_path / "pwned").exists()
    # every line bash reads is a command of the executor's, a continuation, or a comment: no stray word
    assert "command not found" not in proc.stderr, proc.stderr


def test_a_note_wraps_as_comments_and_a_command_only_between_words():
    long = actions.Say("word " * 40)
    cmd = actions.Run(("sh", "-c", "id -u vllm >/dev/null 2>&1 || useradd --home-dir /var/lib/rocm-dspark vllm"),
                      root=True)
    lines = actions.render([long, cmd], "    ", 40)
    assert all(ln.lstrip().startswith("#") for ln in lines[:-2]) and len(lines) > 3
    import shlex

    assert shlex.split("\n".join(lines[-2:]).replace("\\\n", "")) == actions.argv_of(cmd)
    assert all(ln.endswith(" \\") for ln in lines[-2:-1])  # broken between words only
