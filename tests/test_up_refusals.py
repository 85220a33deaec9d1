"""`up`'s refusals that need no step's result come before the first line of the plan, and the dry run refuses
what the run would refuse (the state dir, the lock) or reports it (the mode's daemon and systemd). Run through
bash, as an operator pastes them, or in process (tests/helpers.run_cli) where bash adds nothing to what is checked."""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CLI, cli_env
from tests.helpers import run_cli

UP = " ".join(CLI) + " up --model V4.1-Flash --gpu mi300x"


def bash(cmd: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=cli_env(**env), check=False)


def refused(p, code=2) -> str:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == "", p.stdout  # nothing of the plan printed first
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rocm-dspark: error: "), p.stderr
    return lines[0]


@pytest.mark.parametrize("flags, env, says", [
    ("--mode systemd", {}, "would run vLLM as root"),
    ("--mode systemd --service-user 'a b'", {}, "is not one systemd accepts"),
    ("--mode container --ready-port 8000", {}, "--ready-port 8000 is vLLM's port"),
    ("--target local-cpu --model-path MODEL", {"ROCM_DSPARK_UP_LOCAL_CHECK": "nope"}, "not JSON"),
])
@pytest.mark.parametrize("dry", [True, False])
def test_refusals_that_need_no_step_come_first(flags, env, says, dry, tmp_path):
    if "would run vLLM as root" in says and os.geteuid() != 0:
        pytest.skip("the root refusal needs a run as root")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    state = tmp_path / "state"
    flags = flags.replace("MODEL", str(tmp_path / "m"))
    cmd = f"{UP} {flags} {'--dry-run' if dry else ''} --state-dir {state}"
    if dry and "service-user" in flags:  # one pasted through bash (the quoted user), the rest in process
        line = refused(bash(cmd, **env))
    else:
        line = refused(run_cli(shlex.split(cmd)[len(CLI):], env=cli_env(**env)))
    assert says in line
    assert not state.exists()  # the real run refuses before it creates anything


def _dir_cases(tmp_path: Path):
    regular = tmp_path / "file"
    regular.write_text("")
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    yield "a regular file", regular, "is not a directory"
    if os.geteuid() == 0:
        os.chown(other, 4321, 4321)
        yield "another user's dir", other, "owned by uid 4321"
    immutable = tmp_path / "immutable"
    immutable.mkdir(mode=0o700)
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(immutable)], capture_output=True).returncode == 0:
        yield "an immutable dir", immutable, "not writable"


def test_dry_run_refuses_the_state_dirs_the_run_refuses(tmp_path):
    seen = []
    try:
        for what, path, says in _dir_cases(tmp_path):
            seen.append(what)
            dry = refused(bash(f"{UP} --mode container --dry-run --state-dir {shlex.quote(str(path))}"))
            assert says in dry, (what, dry)
            real = refused(bash(f"{UP} --mode container --state-dir {shlex.quote(str(path))}"))
            assert real.split(": ")[2] == dry.split(": ")[2], (what, real, dry)  # the same refusal
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path / "immutable")], capture_output=True, check=False)
    assert "a regular file" in seen


def test_dry_run_refuses_a_state_dir_another_up_holds(tmp_path):
    up = tmp_path / "s" / "up"
    up.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "s", 0o700)
    fd = os.open(up / "up.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another `up` holds it (flock is per open file: this process counts)
        os.write(fd, b"4242\n")
        line = refused(bash(f"{UP} --mode container --dry-run --state-dir {tmp_path / 's'}"))
        assert "another `rocm-dspark up` (pid 4242) is running" in line
    finally:
        os.close(fd)
    p = bash(f"{UP} --mode container --dry-run --state-dir {tmp_path / 's'}")
    assert p.returncode == 0, p.stderr


def _before_plan(p) -> list[str]:
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    return lines[:next(i for i, ln in enumerate(lines) if ln.startswith("# [ 1/10]"))]


def test_dry_run_reports_a_daemon_that_does_not_answer(tmp_path):
    sock = f"unix://{tmp_path}/no-daemon.sock"
    head = " ".join(_before_plan(bash(f"{UP} --mode container --dry-run --state-dir {tmp_path / 's'}", DOCKER_HOST=sock)))
    assert "the run would stop at step 3 on this host: docker:" in head, head
    if shutil.which("docker") or shutil.which("podman"):
        assert "does not answer" in head
        # No --mode: container is picked where docker exists and systemd does not; the dry run says it cannot run.
        if not Path("/run/systemd/system").exists():
            auto = " ".join(_before_plan(bash(f"{UP} --dry-run --state-dir {tmp_path / 's'}", DOCKER_HOST=sock)))
            assert "would stop at step 3 on this host: docker:" in auto, auto


def test_dry_run_reports_systemd_unusable(tmp_path):
    if Path("/run/systemd/system").exists():
        pytest.skip("systemd is the init system here: nothing to report")
    head = " ".join(_before_plan(bash(f"{UP} --mode systemd --service-user vllm --dry-run --state-dir {tmp_path}")))
    assert "would stop at step 3 on this host: systemd: systemd is not the init system here" in head, head
