"""Trust of state files beyond probe/ (issue 22, campaign classes "Trust of ab/" and "up-state.json is trusted
as it is found"): the A/B record directory and the fingerprint's host."""

from __future__ import annotations

import os

import pytest

from rocm_dspark.probe import fingerprint


def test_recipe_concurrency_with_a_symlinked_ab_dir_still_prints_a_plan(tmp_path, monkeypatch):
    """The payoff half is read once the proof holds; the proof is stubbed as held (a real one needs an MI300)."""
    from click.testing import CliRunner

    from rocm_dspark.probe import gate
    from tests.helpers.ab_records import PROVEN

    monkeypatch.setattr(gate, "gate_verdict", lambda *a, **k: PROVEN)

    from rocm_dspark.cli import cli
    from rocm_dspark.probe import store

    state = tmp_path / "state"
    (tmp_path / "other" / "ab").mkdir(parents=True, mode=0o700)
    (tmp_path / "other" / "ab" / "20261201T011000Z-0000abcd.json").write_text("{}")
    state.mkdir(mode=0o700)
    store.ensure_key(state)
    (state / "ab").symlink_to(tmp_path / "other" / "ab")
    res = CliRunner().invoke(cli, ["recipe", "--explain", "--model", "V4.1-Flash", "--gpu", "mi300x", "--concurrency",
                                   "64", "--state-dir", str(state)])
    assert res.exit_code == 0, res.output
    assert "vllm serve" in res.output and "is a symlink" in " ".join(res.output.replace("#", " ").split())


def test_the_fingerprint_names_the_host(monkeypatch, tmp_path):
    ident = tmp_path / "machine-id"
    ident.write_text("0123456789abcdef0123456789abcdef\n")
    monkeypatch.setattr(fingerprint, "MACHINE_ID_FILES", (ident,))
    here = fingerprint.host_id()
    assert here.startswith("machine-") and "0123456789abcdef" not in here  # a hash, not the id itself
    ident.write_text("fedcba9876543210fedcba9876543210\n")
    assert fingerprint.host_id() != here
    monkeypatch.setattr(fingerprint, "MACHINE_ID_FILES", (tmp_path / "none",))
    assert fingerprint.host_id() == "hostname-" + os.uname().nodename
    assert fingerprint.host_fingerprint(gpus={"gpu_arch": None, "gpu_name": None, "gpu_count": 0})["host_id"]


# --- up-state.json --------------------------------------------------------------------------------------

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

from click.testing import CliRunner  # noqa: E402

from rocm_dspark.cli import cli  # noqa: E402
from rocm_dspark.errors import UsageError  # noqa: E402
from rocm_dspark.runtime.procfs import start_ticks  # noqa: E402
from rocm_dspark.service.state import FILE, UpState  # noqa: E402


def _plant(state, service=None, steps=None, mode=0o700):
    up = state / "up"
    up.mkdir(parents=True, exist_ok=True)
    state.chmod(mode)
    up.chmod(mode)
    (up / FILE).write_text(json.dumps({"schema": 1, "steps": steps or {}, "service": service, "runs": []}))
    (up / FILE).chmod(0o600)
    return up / FILE


@pytest.fixture
def victim():
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _process(pid):
    return {"kind": "process", "pid": pid, "start_ticks": start_ticks(pid), "host": "127.0.0.1", "port": 8000,
            "base_url": "http://127.0.0.1:8000", "log": "x.log"}


def test_down_does_not_kill_a_pid_planted_in_a_world_writable_state_dir(tmp_path, victim):
    state = tmp_path / "shared"
    _plant(state, _process(victim.pid), mode=0o777)
    r = CliRunner().invoke(cli, ["down", "--state-dir", str(state)])
    assert victim.poll() is None, "down killed the planted pid"
    assert r.exit_code == 2 and "not trusted" in r.output and "mode 0777" in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_down_does_not_kill_a_pid_from_another_users_state_file(tmp_path, victim):
    state = tmp_path / "s"
    path = _plant(state, _process(victim.pid))
    os.chown(path, 4242, 4242)
    r = CliRunner().invoke(cli, ["down", "--state-dir", str(state)])
    assert victim.poll() is None and r.exit_code == 2 and "owned by uid 4242" in r.output


@pytest.mark.parametrize("service,words", [
    ({"kind": "systemd", "unit": "--now.service", "host": "h", "port": 1}, "not a systemd unit name"),
    ({"kind": "systemd", "unit": "-x", "host": "h", "port": 1}, "not a systemd unit name"),
    ({"kind": "process", "pid": "1; rm", "host": "h", "port": 1}, "not a process id"),
    ({"kind": "process", "pid": 1, "host": "h", "port": 1}, "not a process id"),
    ({"kind": "process", "pid": 99, "host": "h", "port": "80"}, "not a TCP port"),
    ({"kind": "process", "pid": 99, "host": "h", "port": 80, "launcher": "/tmp/evil.sh"}, "not a launcher"),
    ({"kind": "ssh", "host": "h", "port": 80}, "neither process nor systemd"),
    ([1, 2], "not an object"),
])
def test_a_planted_service_of_the_wrong_shape_is_one_line(tmp_path, service, words):
    state = tmp_path / "s"
    _plant(state, service)
    for command in (["down"], ["status"]):
        r = CliRunner().invoke(cli, [*command, "--state-dir", str(state)])
        assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, (command, r.output)
        assert len(r.output.strip().splitlines()) == 1


def test_the_stop_command_never_reads_a_unit_name_as_an_option(monkeypatch):
    import subprocess

    from rocm_dspark.service import control

    seen = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: seen.append(argv) or subprocess.CompletedProcess(argv, 0, "", ""))
    control.stop_unit("-H.service")
    assert seen and seen[0][-2:] == ["--", "-H.service"]


def test_up_never_runs_a_launcher_the_state_names_outside_its_launch_dir(tmp_path):
    state = tmp_path / "s"
    evil = tmp_path / "evil.sh"
    _plant(state, steps={"launchers": {"status": "done", "inputs": "x", "at": "t",
                                       "output": {"sets": {"block": {"launcher": str(evil), "unit": None}},
                                                  "files": {}}}})
    with pytest.raises(UsageError, match="is not a file `up` wrote in"):
        UpState.load(state / "up")


@pytest.mark.parametrize("content", [
    "[]", "1", '{"schema": 1, "steps": []}', '{"schema": 1, "steps": {"a": 1}}',
    '{"schema": 1, "steps": {"a": {"status": 5}}}', '{"schema": 1, "steps": {}, "runs": {}}',
    '{"schema": 1, "steps": {"a": {"seconds": "x"}}}', '{"schema": 2, "steps": {}}', "NaN",
    '{"schema": 1, "schema": 1, "steps": {}}', '{"schema": 1, "steps": {}', b'\xff{}',
])
def test_valid_json_of_the_wrong_shape_is_one_line_in_status(tmp_path, content):
    state = tmp_path / "s"
    path = _plant(state)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    r = CliRunner().invoke(cli, ["status", "--state-dir", str(state)])
    assert r.exit_code == 2 and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert "move" in r.output


def test_a_fifo_as_the_state_file_does_not_hang_status(tmp_path):
    state = tmp_path / "s"
    path = _plant(state)
    path.unlink()
    os.mkfifo(path, 0o600)
    proc = subprocess.run([sys.executable, "-m", "rocm_dspark", "status", "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=60, env={**os.environ})
    assert proc.returncode == 2 and "not a regular file" in proc.stderr, proc.stderr


def test_a_huge_state_file_is_refused_unread(tmp_path):
    state = tmp_path / "s"
    path = _plant(state)
    with open(path, "w") as fh:
        fh.truncate(2 << 20)
    r = CliRunner().invoke(cli, ["status", "--state-dir", str(state)])
    assert r.exit_code == 2 and "larger than" in r.output


def test_two_up_runs_on_one_state_dir_do_not_both_run(tmp_path):
    from rocm_dspark.runtime.progress import Display
    from rocm_dspark.up.runner import UpOptions, run_up
    from rocm_dspark.up.steps import Step

    entered, release, ran = threading.Event(), threading.Event(), []

    def start(_run):
        ran.append("start")
        entered.set()
        release.wait(20)
        return {"ok": True}

    steps = (Step("start", "start the server", lambda r: {}, start, lambda r: []),)
    opts = lambda: UpOptions(selection={"model": "V4.1-Flash", "gpu": "mi300x", "state_dir": str(tmp_path)})  # noqa: E731
    codes = []
    first = threading.Thread(target=lambda: codes.append(run_up(opts(), Display(say=lambda s: None), steps=steps)))
    first.start()
    assert entered.wait(20)
    try:
        with pytest.raises(UsageError, match=rf"another `rocm-dspark up` \(pid {os.getpid()}\) is running"):
            run_up(opts(), Display(say=lambda s: None), steps=steps)
    finally:
        release.set()
        first.join(20)
    assert ran == ["start"] and codes == [0]
    assert run_up(opts(), Display(say=lambda s: None), steps=steps) == 0  # the lock went with the first run


def test_a_fifo_as_the_launch_state_does_not_hang_up(tmp_path):
    from rocm_dspark.service.start import launch_state as _launch_state

    os.mkfifo(tmp_path / "launch-state", 0o600)
    t0 = __import__("time").monotonic()
    assert _launch_state(tmp_path, wait_s=1.0) == {}
    assert __import__("time").monotonic() - t0 < 10
    (tmp_path / "launch-state").unlink()
    (tmp_path / "launch-state").write_text('["not", "an object"]')
    assert _launch_state(tmp_path, wait_s=0.6) == {}
    os.symlink("/etc/passwd", tmp_path / "block.log")  # a link where a log should be is not read
    (tmp_path / "launch-state").unlink()
    (tmp_path / "launch-state").write_text("phase=serving\nmode=block\npid=7\nattempt=block exited_before_ready 3 - -\n"
                                           "attempt=block ready - 2026-12-01T00:00:00Z -\n")
    assert _launch_state(tmp_path, wait_s=5) == {"phase": "serving", "mode": "block", "pid": 7, "fell_back": False,
                                                 "attempts": [
        {"mode": "block", "outcome": "exited_before_ready", "exit_status": 3, "started_at": None, "ended_at": None,
         "refusal": None, "log_tail": None},
        {"mode": "block", "outcome": "ready", "exit_status": None, "started_at": "2026-12-01T00:00:00Z",
         "ended_at": None, "refusal": None, "log_tail": None}]}
