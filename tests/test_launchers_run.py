"""Run generated launchers for real, with a stand-in `vllm` (and `docker`) on PATH.

The stand-in is an instrument, not a fake of vLLM's behaviour we could observe: it records its exact argv
(NUL-separated bytes) and environment, then either refuses the configuration the way vLLM 0.32 words it,
dies, or runs a real HTTP server on the plan's host/port that answers /health and /v1/models (late, never,
or at once). So the launcher's quoting, readiness wait, fallback, state file and process-group stop are all
exercised against real processes and a real socket. Nothing here needs an AMD GPU.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rocm_dspark.launch import launch_state
from rocm_dspark.launch.launch_facts import DOCKER_RUN_FLAGS
from rocm_dspark.launch.launchers import write_launchers
from rocm_dspark.recipe.plan import LaunchPlan

# vLLM 0.32.0's refusal (recipes PR #963), as the stand-in prints it before exiting 1.
REFUSAL = (
    "ValueError: Adaptive verification trims verification requests on device, which the "
    "DeepseekV41IndexerBackend attention backend does not support. Pass enable_adaptive_verification=false"
)

STANDIN = r'''
import json, os, signal, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ME = os.environ["STANDIN_ME"]
REC = os.environ["STANDIN_RECORD_DIR"]
argv = [os.fsencode(a) for a in sys.argv]
stem = os.path.join(REC, f"{time.time_ns()}-{ME}-{os.getpid()}")
with open(stem + ".argv", "wb") as f:
    f.write(b"\0".join(argv))
with open(stem + ".env", "wb") as f:
    f.write(b"\0".join(k + b"=" + v for k, v in sorted(os.environb.items())))

if ME == "docker" and sys.argv[1] in ("rm", "stop", "pull"):
    sys.exit(0)
if ME == "docker" and sys.argv[1:3] == ["image", "inspect"]:  # what `docker image inspect` prints, abridged
    repo = sys.argv[3].rsplit(":", 1)[0]
    print(json.dumps([{"Id": "sha256:" + "a" * 64, "RepoTags": [sys.argv[3]],
                       "RepoDigests": [repo + "@sha256:" + os.environ.get("STANDIN_DIGEST", "b" * 64)]}], indent=4))
    sys.exit(0)

def arg(name, default):
    a = sys.argv
    return a[a.index(name) + 1] if name in a else default

adaptive = any('"enable_adaptive_verification":true' in a for a in sys.argv)
mode = "adaptive" if adaptive else "block"
def knob(name, default=""):
    return os.environ.get(f"STANDIN_{name}_{mode.upper()}", os.environ.get(f"STANDIN_{name}", default))

pids = [os.getpid()]
if knob("WORKER") == "1":  # a child in the same process group, like vLLM's EngineCore
    pids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid)
with open(stem + ".pids", "w") as f:
    f.write(" ".join(map(str, pids)))
if knob("IGNORE_TERM") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: (print("stand-in: SIGTERM, shutting down", flush=True), os._exit(0)))

print(f"stand-in {ME} ({mode}) starting; INFO non-default args: {sys.argv[1:]!r}", flush=True)
if adaptive and os.environ.get("STANDIN_REFUSE_ADAPTIVE") == "1":
    time.sleep(float(os.environ.get("STANDIN_REFUSE_AFTER", "0.5")))
    print("(EngineCore pid=1) ERROR Traceback (most recent call last):", flush=True)
    print("\x1b[31m" + os.environ["STANDIN_REFUSAL"] + "\x1b[0m", file=sys.stderr, flush=True)
    sys.exit(1)
if knob("DIE_AFTER"):
    time.sleep(float(knob("DIE_AFTER")))
    print("stand-in: dying before ready", flush=True)
    sys.exit(int(knob("DIE_STATUS", "3")))
time.sleep(float(knob("READY_AFTER", "0")))  # nothing listens until then: connection refused, like vLLM

health_never = knob("HEALTH") == "never"
models_never = knob("MODELS") == "never"
served = arg("--served-model-name", "m")

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            code, body = (503, b"") if health_never else (200, b"")
        elif self.path == "/v1/models":
            code = 503 if models_never else 200
            body = json.dumps({"object": "list", "data": [{"id": served, "object": "model"}]}).encode()
        else:
            code, body = 404, b""
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

host = arg("--host", "127.0.0.1")
srv = ThreadingHTTPServer(("127.0.0.1" if host == "0.0.0.0" else host, int(arg("--port", "8000"))), H)
print("stand-in: listening", flush=True)
if knob("EXIT_AFTER_READY"):
    import threading
    def later():
        time.sleep(float(knob("EXIT_AFTER_READY")))
        os._exit(int(knob("EXIT_STATUS", "0")))
    threading.Thread(target=later, daemon=True).start()
srv.serve_forever()
'''

SPEC = {"method": "dspark", "num_speculative_tokens": 5, "draft_sample_method": "probabilistic",
        "rejection_sample_method": "block", "enable_adaptive_verification": True}
HOSTILE = [
    "with space",
    "it's \"quoted\"",
    "$(touch /tmp/pwned-by-launcher-test)",
    "`id`",
    "line1\nline2",
    "100% %n %h",
    "ünïcødé ✓ 模型",
    "back\\slash\\",
    "tab\there",
    "$HOME ${PATH} $'x' \\x41",
    "--flag=*glob*?[a]",
    "",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_plan(port: int, *, adaptive: bool = True, model: str = "deepseek-ai/DeepSeek-V4.1-Flash",
              served: str = "deepseek-ai/DeepSeek-V4.1-Flash", env: dict | None = None,
              extra: tuple[str, ...] = ()) -> LaunchPlan:
    def argv(adaptive_on: bool) -> tuple[str, ...]:
        spec = dict(SPEC, enable_adaptive_verification=adaptive_on)
        return ("vllm", "serve", model, "--served-model-name", served, "--host", "127.0.0.1",
                "--port", str(port), *extra, "--speculative-config", json.dumps(spec, separators=(",", ":")))

    return LaunchPlan(
        model_id=model, model_key="DeepSeek-V4.1-Flash", served_name=served, gpu="mi355x", arch="gfx950",
        profile="DeepSeek-V4.1-Flash/mi355x", status="experimental", status_date="2026-09-15",
        evidence=("https://github.com/vllm-project/recipes/pull/962",), vllm_version="0.32.0",
        image="vllm/vllm-openai-rocm@sha256:" + "0" * 64, host="127.0.0.1", port=port,
        argv=argv(adaptive), env=dict(env if env is not None else {"VLLM_ROCM_USE_AITER": "1"}),
        speculative_config=dict(SPEC, enable_adaptive_verification=adaptive), adaptive_verification=adaptive,
        block_argv=argv(False) if adaptive else None,
    )


class Rig:
    """A temp dir with bin/ (stand-ins), rec/ (their records), state/ and out/ (the generated launcher)."""

    def __init__(self, root: Path):
        self.root = root
        for d in ("bin", "rec", "state", "out"):
            (root / d).mkdir(parents=True, exist_ok=True)
        src = root / "standin.py"
        src.write_text(STANDIN)
        for name in ("vllm", "docker"):
            # STANDIN_ME tells the one stand-in which program it plays.
            exe = root / "bin" / name
            exe.write_text(
                f"#!/bin/sh\nSTANDIN_ME={name} exec {shlex.quote(sys.executable)} {shlex.quote(str(src))} \"$@\"\n"
            )
            exe.chmod(0o755)

    def write(self, plan, fmt: str = "shell", **kw) -> Path:
        return write_launchers(plan, self.root / "out", fmt, **kw).launcher

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ROCM_DSPARK_", "STANDIN_"))}
        env.pop("NOTIFY_SOCKET", None)
        env.update(
            PATH=f"{self.root / 'bin'}:{env['PATH']}",
            STANDIN_RECORD_DIR=str(self.root / "rec"),
            STANDIN_REFUSAL=REFUSAL,
            ROCM_DSPARK_LAUNCH_STATE_DIR=str(self.root / "state"),
            ROCM_DSPARK_READY_TIMEOUT_S="20",
            ROCM_DSPARK_STOP_TIMEOUT_S="10",
        )
        env.update(extra)
        return env

    def run(self, script: Path, timeout: float = 60, **extra) -> subprocess.CompletedProcess:
        return subprocess.run([str(script)], env=self.env(**extra), capture_output=True, timeout=timeout)

    def start(self, script: Path, **extra) -> subprocess.Popen:
        return subprocess.Popen([str(script)], env=self.env(**extra), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)

    def records(self, who: str = "vllm") -> list[dict]:
        out = []
        for p in sorted((self.root / "rec").glob(f"*-{who}-*.argv")):
            stem = str(p)[: -len(".argv")]
            env_raw = Path(stem + ".env").read_bytes()
            env = dict(item.split(b"=", 1) for item in env_raw.split(b"\0") if item)
            pids_file = Path(stem + ".pids")
            pids = [int(x) for x in pids_file.read_text().split()] if pids_file.exists() else []
            out.append({"argv": p.read_bytes().split(b"\0"), "env": env, "pids": pids})
        return out

    def state(self) -> dict:
        """The launcher's state as `up`, `status` and validate read it (rocm_dspark.launch.launch_state)."""
        return launch_state.read(self.root / "state")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(cond, timeout: float = 30, step: float = 0.1) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


def http_status(port: int, path: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


@pytest.fixture
def rig(tmp_path):
    return Rig(tmp_path)


def stop_and_check(proc: subprocess.Popen, rig: Rig, sig=signal.SIGTERM, timeout: float = 30, who="vllm") -> int:
    """Signal the launcher, wait for it, and assert that no stand-in process is left."""
    proc.send_signal(sig)
    code = proc.wait(timeout=timeout)
    pids = [p for r in rig.records(who) for p in r["pids"]]
    assert pids, "the stand-in never recorded its pids"
    assert wait_until(lambda: not any(alive(p) for p in pids), 10), f"processes left: {[p for p in pids if alive(p)]}"
    return code


def start_ready(rig: Rig, script: Path, port: int, **extra) -> subprocess.Popen:
    proc = rig.start(script, **extra)
    ok = wait_until(lambda: rig.state().get("phase") == "serving" or proc.poll() is not None, 30)
    assert ok and proc.poll() is None, proc.communicate(timeout=5)
    assert http_status(port, "/v1/models") == 200
    return proc


# ---- hostile values reach the program byte for byte ----

def test_hostile_argv_and_env_reach_vllm_literally(rig):
    port = free_port()
    env = {f"HOSTILE_{i}": v for i, v in enumerate(HOSTILE)}
    env["VLLM_ROCM_USE_AITER"] = "1"
    plan = make_plan(port, adaptive=False, model=HOSTILE[2] + " " + HOSTILE[6],
                     served="served " + HOSTILE[4] + HOSTILE[5], env=env, extra=tuple(HOSTILE))
    proc = start_ready(rig, rig.write(plan), port)
    assert stop_and_check(proc, rig) == 128 + signal.SIGTERM
    (rec,) = rig.records()
    assert rec["argv"][1:] == [os.fsencode(a) for a in plan.argv[1:]]
    for k, v in plan.env.items():
        assert rec["env"][k.encode()] == v.encode(), k
    assert not Path("/tmp/pwned-by-launcher-test").exists()
    # The provenance file, sourced by bash, gives back the same argv and env (printf %q round trip).
    cmd_file = rig.root / "state" / "vllm_command.txt"
    dump = subprocess.run(
        ["bash", "-c", 'source "$1" >/dev/null 2>&1 || true; eval "a=($(tail -n 1 "$1"))"; printf "%s\\0" "${a[@]}"; '
                       'printf "%s\\0" "$HOSTILE_4" "$HOSTILE_7"', "_", str(cmd_file)],
        capture_output=True, check=True, env={"PATH": os.environ["PATH"]},
    ).stdout.split(b"\0")[:-1]
    n = len(plan.argv)
    assert dump[:n] == [os.fsencode(a) for a in plan.argv]
    assert dump[n:] == [HOSTILE[4].encode(), HOSTILE[7].encode()]


def test_container_mode_runs_docker_with_amd_flags_and_pinned_image(rig):
    port = free_port()
    plan = make_plan(port, adaptive=False, env={"VLLM_ROCM_USE_AITER": "1", "WEIRD": "a b $(x) %n\n"})
    script = rig.write(plan, container=True)
    proc = start_ready(rig, script, port, HF_TOKEN="hf_secret")
    assert stop_and_check(proc, rig, who="docker") == 143
    runs = [r for r in rig.records("docker") if r["argv"][1] == b"run"]
    assert len(runs) == 1
    argv = [a.decode() for a in runs[0]["argv"]]
    # The flags are rocm_dspark.launch.launch_facts' (tests/test_launch_facts.py: the same argv as `recipe --format docker`).
    assert argv[1:2 + len(DOCKER_RUN_FLAGS)] == ["run", *DOCKER_RUN_FLAGS]
    assert {"--device=/dev/kfd", "--device=/dev/dri", "--group-add=video", "--ipc=host"} <= set(DOCKER_RUN_FLAGS)
    # Each value is one argv word, byte for byte; the secret is passed by name only.
    for word in ("VLLM_ROCM_USE_AITER=1", "WEIRD=a b $(x) %n\n", "HF_TOKEN"):
        assert argv[argv.index(word) - 1] == "-e", word
    i = argv.index(plan.image)
    assert argv[i - 2:i] == ["--entrypoint", "vllm"] and argv[i + 1:] == list(plan.argv[1:])
    assert "@sha256:" in plan.image
    assert runs[0]["env"][b"HF_TOKEN"] == b"hf_secret"
    assert any(r["argv"][1] == b"stop" for r in rig.records("docker")), "docker stop was not called on SIGTERM"


def test_container_mode_pins_the_local_copy_at_first_start_never_pulls_and_records_it(rig):
    """A launcher written with a tag: its first start pins the digest this host holds (`image inspect`, no pull),
    records it in image-pinned and vllm_command.txt; a later start runs the recorded digest even when the local
    tag now points elsewhere (the stand-in docker answers `image inspect` as docker does)."""
    port = free_port()
    tag = "vllm/vllm-openai-rocm:v0.33.0"
    plan = make_plan(port, adaptive=False)._replace(image=tag)
    script = rig.write(plan, container=True)
    proc = start_ready(rig, script, port, STANDIN_DIGEST="c" * 64)
    assert stop_and_check(proc, rig, who="docker") == 143
    calls = [r["argv"][1:3] for r in rig.records("docker")]
    assert [b"image", b"inspect"] in calls and not any(c[0] == b"pull" for c in calls)
    runs = [[a.decode() for a in r["argv"]] for r in rig.records("docker") if r["argv"][1] == b"run"]
    pinned = "vllm/vllm-openai-rocm@sha256:" + "c" * 64
    assert len(runs) == 1 and pinned in runs[0] and tag not in runs[0]
    provenance = (rig.root / "state" / "vllm_command.txt").read_text()
    assert f"# image: {tag}, run as {pinned}" in provenance and pinned in provenance.splitlines()[-1]
    assert (rig.root / "state" / "image-pinned").read_text() == f"{tag}\n{pinned}\n"
    port2 = free_port()  # the same launcher again, the tag re-pulled to another digest meanwhile
    script = rig.write(make_plan(port2, adaptive=False)._replace(image=tag), container=True)
    proc = start_ready(rig, script, port2, STANDIN_DIGEST="d" * 64)
    assert stop_and_check(proc, rig, who="docker") == 143
    runs = [[a.decode() for a in r["argv"]] for r in rig.records("docker") if r["argv"][1] == b"run"]
    assert pinned in runs[-1] and not any(b"pull" == r["argv"][1] for r in rig.records("docker"))


# ---- start-up fallback ----

def test_refused_adaptive_start_falls_back_to_block_and_records_why(rig):
    port = free_port()
    plan = make_plan(port, adaptive=True)
    script = rig.write(plan)
    proc = start_ready(rig, script, port, STANDIN_REFUSE_ADAPTIVE="1")
    st = rig.state()
    assert st["phase"] == "serving" and st["mode"] == "block" and st["fell_back"] is True
    first, second = st["attempts"]
    assert first["mode"] == "adaptive" and first["outcome"] == "exited_before_ready" and first["exit_status"] == 1
    assert REFUSAL in first["refusal"] and "\x1b" not in first["refusal"]
    assert "EngineCore" in first["log_tail"] and REFUSAL in first["log_tail"]
    assert second == {**second, "mode": "block", "outcome": "ready"}
    argvs = [r["argv"] for r in rig.records()]
    assert [a[1:] for a in argvs] == [[os.fsencode(x) for x in plan.argv[1:]],
                                      [os.fsencode(x) for x in plan.block_argv[1:]]]
    provenance = (rig.root / "state" / "vllm_command.txt").read_text()
    assert "block verification" in provenance and "enable_adaptive_verification\\\":false" in provenance
    assert stop_and_check(proc, rig) == 143
    assert rig.state()["phase"] == "stopped"

    # A restart does not pay for the refused start again ...
    proc = start_ready(rig, script, port, STANDIN_REFUSE_ADAPTIVE="1")
    assert len(rig.records()) == 3 and b'"enable_adaptive_verification":false' in rig.records()[-1]["argv"][-1]
    skipped = rig.state()["attempts"][0]
    assert skipped["outcome"] == "skipped_refused_before" and REFUSAL in skipped["refusal"]
    stop_and_check(proc, rig)
    # ... unless asked to.
    proc = start_ready(rig, script, port, STANDIN_REFUSE_ADAPTIVE="1", ROCM_DSPARK_RETRY_ADAPTIVE="1")
    assert [r["argv"][-1].endswith(b"true}") for r in rig.records()][-2:] == [True, False]
    stop_and_check(proc, rig)


def test_adaptive_start_that_misses_the_deadline_falls_back(rig):
    port = free_port()
    script = rig.write(make_plan(port))
    proc = start_ready(rig, script, port, ROCM_DSPARK_READY_TIMEOUT_S="3", STANDIN_HEALTH_ADAPTIVE="never",
                       STANDIN_WORKER="1")
    first = rig.state()["attempts"][0]
    assert first["outcome"] == "not_ready_by_deadline" and first["exit_status"] is None
    adaptive_pids = rig.records()[0]["pids"]
    assert len(adaptive_pids) == 2 and not any(alive(p) for p in adaptive_pids), "the timed-out start was not stopped"
    assert not (rig.root / "state" / "adaptive-refused").exists(), "a timeout must not be remembered as a refusal"
    stop_and_check(proc, rig)


def test_both_starts_failing_exits_with_vllms_status(rig):
    port = free_port()
    script = rig.write(make_plan(port))
    res = rig.run(script, STANDIN_REFUSE_ADAPTIVE="1", STANDIN_DIE_AFTER_BLOCK="0.3", STANDIN_DIE_STATUS="7")
    assert res.returncode == 7, res.stderr.decode()
    st = rig.state()
    assert st["phase"] == "failed" and [a["outcome"] for a in st["attempts"]] == ["exited_before_ready"] * 2
    assert st["attempts"][1]["exit_status"] == 7 and "dying before ready" in st["attempts"][1]["log_tail"]


def test_plan_without_adaptive_has_one_argv_and_no_fallback(rig):
    port = free_port()
    plan = make_plan(port, adaptive=False)
    script = rig.write(plan)
    assert "FALLBACK_ARGV" not in script.read_text() and "adaptive-refused" not in script.read_text()
    res = rig.run(script, STANDIN_DIE_AFTER="0.2", STANDIN_DIE_STATUS="5")
    assert res.returncode == 5
    assert len(rig.records()) == 1
    st = rig.state()
    assert st["fell_back"] is False and [a["mode"] for a in st["attempts"]] == ["block"]


# ---- readiness against a real HTTP server: late, never, dies ----

def test_ready_late_is_waited_for(rig):
    port = free_port()
    script = rig.write(make_plan(port, adaptive=False))
    t0 = time.monotonic()
    proc = start_ready(rig, script, port, STANDIN_READY_AFTER="2")
    assert time.monotonic() - t0 >= 2
    assert rig.state()["attempts"][0]["outcome"] == "ready"
    assert stop_and_check(proc, rig) == 143


@pytest.mark.parametrize("knob", ["STANDIN_HEALTH", "STANDIN_MODELS"])
def test_never_ready_misses_the_deadline_and_is_stopped(rig, knob):
    port = free_port()
    script = rig.write(make_plan(port, adaptive=False))
    t0 = time.monotonic()
    res = rig.run(script, **{knob: "never", "ROCM_DSPARK_READY_TIMEOUT_S": "3", "STANDIN_WORKER": "1"})
    assert res.returncode == 124, res.stderr.decode()
    assert 3 <= time.monotonic() - t0 < 20
    assert b"not ready within 3s" in res.stderr
    pids = rig.records()[0]["pids"]
    assert len(pids) == 2 and not any(alive(p) for p in pids)
    assert rig.state()["attempts"][0]["outcome"] == "not_ready_by_deadline"


def test_server_dying_after_ready_propagates_its_status(rig):
    port = free_port()
    script = rig.write(make_plan(port, adaptive=False))
    res = rig.run(script, STANDIN_EXIT_AFTER_READY="1.5", STANDIN_EXIT_STATUS="9")
    assert res.returncode == 9
    st = rig.state()
    assert st["phase"] == "exited" and st["ready_at"] is not None


def test_port_already_served_is_refused(rig):
    port = free_port()
    other = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: http_status(port, "/") == 200, 10)
        res = rig.run(rig.write(make_plan(port, adaptive=False)))
        assert res.returncode == 1 and b"already answers" in res.stderr
        assert rig.records() == []
    finally:
        other.terminate()
        other.wait()


# ---- stopping: the whole process group, with the right status ----

def test_sigint_stops_the_group_and_exits_130(rig):
    port = free_port()
    proc = start_ready(rig, rig.write(make_plan(port, adaptive=False)), port, STANDIN_WORKER="1")
    assert len(rig.records()[0]["pids"]) == 2
    assert stop_and_check(proc, rig, signal.SIGINT) == 130


def test_term_ignoring_server_is_killed_after_the_stop_timeout(rig):
    port = free_port()
    proc = start_ready(rig, rig.write(make_plan(port, adaptive=False)), port, STANDIN_IGNORE_TERM="1",
                       STANDIN_WORKER="1", ROCM_DSPARK_STOP_TIMEOUT_S="2")
    t0 = time.monotonic()
    assert stop_and_check(proc, rig) == 143
    assert time.monotonic() - t0 >= 2
    assert b"killing its process group" in proc.stderr.read()


def notify_recorder(rig: Rig) -> Path:
    """A stand-in systemd-notify on the rig's PATH: it appends `$NOTIFY_SOCKET|args` to the returned file."""
    log = rig.root / "notify.log"
    notify = rig.root / "bin" / "systemd-notify"
    notify.write_text(f'#!/bin/sh\nprintf "%s|%s\\n" "$NOTIFY_SOCKET" "$*" >> {shlex.quote(str(log))}\n')
    notify.chmod(0o755)
    return log


def test_systemd_notify_is_called_when_ready(rig):
    port = free_port()
    log = notify_recorder(rig)
    proc = start_ready(rig, rig.write(make_plan(port, adaptive=False), "systemd"), port, NOTIFY_SOCKET="/run/test.sock")
    stop_and_check(proc, rig)
    lines = log.read_text().splitlines()
    assert lines[-1] == "/run/test.sock|--ready --status=serving (block verification)"
    # vLLM itself must not inherit the socket (only the launcher reports readiness).
    assert b"NOTIFY_SOCKET" not in rig.records()[0]["env"]


# ---- host checks warn (and never stop the launch) ----

def test_host_checks_warn_about_numa_balancing_and_missing_kfd(rig):
    # This host's real /proc and /dev (no test seam in the launcher): the warnings follow what is there.
    res = rig.run(rig.write(make_plan(free_port(), adaptive=False)), STANDIN_DIE_AFTER="0")
    err = res.stderr.decode()
    numa = Path("/proc/sys/kernel/numa_balancing")
    on = numa.exists() and numa.read_text().strip() != "0"
    assert ("NUMA balancing is on" in err) == on and ("sysctl -w kernel.numa_balancing=0" in err) == on
    assert ("/dev/kfd does not exist" in err) == (not os.path.exists("/dev/kfd"))
    assert len(rig.records()) == 1, "a host check stopped the launch"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the launcher as another user (setpriv)")
def test_host_checks_warn_when_user_lacks_video_and_render_groups():
    # Run as nobody, with no supplementary groups, from a world-readable directory.
    root = Path(tempfile.mkdtemp(prefix="launcher-groups-"))
    try:
        os.chmod(root, 0o755)
        (root / "bin").mkdir()
        vllm = root / "bin" / "vllm"
        vllm.write_text("#!/bin/sh\necho refusing to start >&2\nexit 3\n")
        vllm.chmod(0o755)
        (root / "state").mkdir(mode=0o777)
        os.chmod(root / "state", 0o777)
        (root / "out").mkdir()
        script = write_launchers(make_plan(free_port(), adaptive=False), root / "out", "shell").launcher
        res = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(script)],
            env={"PATH": f"{root / 'bin'}:/usr/bin:/bin", "ROCM_DSPARK_LAUNCH_STATE_DIR": str(root / "state"),
                 "HOME": str(root)},
            capture_output=True, timeout=60,
        )
        err = res.stderr.decode()
        assert res.returncode == 3, err
        assert "not in the video group" in err and "not in the render group" in err
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def test_state_dir_follows_systemd_state_directory(rig):
    port = free_port()
    sd = rig.root / "systemd-state"
    sd.mkdir()
    env_extra = {"STATE_DIRECTORY": str(sd), "STANDIN_DIE_AFTER": "0"}
    env = rig.env(**env_extra)
    env.pop("ROCM_DSPARK_LAUNCH_STATE_DIR")
    subprocess.run([str(rig.write(make_plan(port, adaptive=False)))], env=env, capture_output=True, timeout=60)
    assert launch_state.read(sd)["phase"] == "failed"
    assert (sd / "vllm_command.txt").exists() and stat.S_ISREG((sd / "block.log").stat().st_mode)


def test_state_dir_defaults_under_the_project_state_root(rig):
    root = rig.root / "state-root"
    env = rig.env(ROCM_DSPARK_STATE_DIR=str(root), STANDIN_DIE_AFTER="0")
    env.pop("ROCM_DSPARK_LAUNCH_STATE_DIR")
    script = rig.write(make_plan(free_port(), adaptive=False), name="svc")
    subprocess.run([str(script)], env=env, capture_output=True, timeout=60)
    # Beside the probe records (<root>/probe), never mixed with them.
    assert launch_state.read(root / "launch" / "svc")["phase"] == "failed"


def test_host_mode_without_vllm_on_path_says_so_in_one_line(rig):
    # Issue 22: it died with `setsid: failed to execute vllm`, exit 127.
    port = free_port()
    script = rig.write(make_plan(port, adaptive=False))
    r = rig.run(script, PATH="/usr/bin:/bin")
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert ("error: vllm is not on PATH (/usr/bin:/bin): install vLLM for this user, or write the launcher with "
            "'rocm-dspark launch --container' to run the image") in err
    assert "setsid" not in err and not rig.records()


def test_watchdog_is_fed_while_vllm_answers_health_and_starves_when_it_hangs(rig):
    # Issue 22: nothing noticed a hung vLLM after ready. WatchdogSec=3 -> WATCHDOG_USEC=3000000: a poll a second.
    port = free_port()
    log = notify_recorder(rig)
    proc = start_ready(rig, rig.write(make_plan(port, adaptive=False), "systemd"), port, NOTIFY_SOCKET="/run/test.sock",
                       WATCHDOG_USEC="3000000")
    fed = lambda: log.read_text().splitlines().count("/run/test.sock|WATCHDOG=1")  # noqa: E731
    assert wait_until(lambda: fed() >= 2, 20)
    lines = log.read_text().splitlines()
    assert lines.index("/run/test.sock|--ready --status=serving (block verification)") < \
        lines.index("/run/test.sock|WATCHDOG=1")
    (server,) = rig.records()[0]["pids"][:1]
    os.kill(server, signal.SIGSTOP)  # a hung vLLM: the socket accepts, nothing answers
    try:
        time.sleep(6)                # the poll in flight may still land; after it, none may
        before = fed()
        time.sleep(7)
        assert fed() == before, "the watchdog was fed while vLLM did not answer"
    finally:
        os.kill(server, signal.SIGCONT)
    assert wait_until(lambda: fed() > before, 20)  # answering again: fed again
    assert b"WATCHDOG_USEC" not in rig.records()[0]["env"]
    stop_and_check(proc, rig)
