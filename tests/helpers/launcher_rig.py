"""The launcher rig: a stand-in `vllm` (and `docker`) on PATH that records its exact argv and environment and
serves a real HTTP server, the plans it runs, and the shellcheck wrapper (tests/test_launchers.py runs them)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from rocm_dspark.launch import launch_state
from rocm_dspark.launch.launchers import write_launchers
from rocm_dspark.recipe.plan import LaunchPlan
from tests.helpers import free_port  # noqa: F401 (the rig's tests take their ports from here)

# vLLM 0.32.0's refusal (recipes PR #963), as the stand-in prints it before exiting 1.
REFUSAL = (
    "ValueError: Adaptive verification trims verification requests on device, which the "
    "DeepseekV41IndexerBackend attention backend does not support. Pass enable_adaptive_verification=false"
)

# vLLM 0.33.0's refusal of --monokernel as its model builder raises it: `raise ValueError(f"--monokernel {why}.")`
# (vllm/models/deepseek_v41/amd/mono_decode.py:384), `why` from :373, f"needs {BLOCKS} compute units, the GPU has
# {cus}" with BLOCKS = 256 (mono/common/plan.py:22) on a GPU in CPX mode (38 CUs per XCD of an MI300X, AMD's
# MI300X partitioning overview). The stand-in prints the traceback's last lines, source line included.
MONO_REFUSAL = "--monokernel needs 256 compute units, the GPU has 38."
MONO_TRACEBACK = (
    '(Worker_TP0 pid=7) ERROR [multiproc_executor.py:1] Traceback (most recent call last):\n'
    '(Worker_TP0 pid=7) ERROR [multiproc_executor.py:1]   File "/usr/local/lib/python3.12/dist-packages/vllm/'
    'models/deepseek_v41/amd/mono_decode.py", line 384, in _create\n'
    '(Worker_TP0 pid=7) ERROR [multiproc_executor.py:1]     raise ValueError(f"--monokernel {why}.")\n'
    f'(Worker_TP0 pid=7) ERROR [multiproc_executor.py:1] ValueError: {MONO_REFUSAL}'
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

# A container left by an earlier start: <rig>/container-state holds its .State.Status (none: no such container).
# `docker rm` (no -f) removes it only when it is not running, as docker does.
CONTAINER = os.path.join(os.path.dirname(REC), "container-state")
if ME == "docker" and sys.argv[1:3] == ["container", "inspect"]:
    if not os.path.exists(CONTAINER):
        print(f"Error: No such container: {sys.argv[3]}", file=sys.stderr)
        sys.exit(1)
    state = open(CONTAINER).read().strip()  # what `docker container inspect` prints, abridged
    print(json.dumps([{"Id": "c" * 64, "State": {"Status": state, "Running": state == "running"}}], indent=4))
    sys.exit(0)
if ME == "docker" and sys.argv[1] == "rm":
    if os.path.exists(CONTAINER) and open(CONTAINER).read().strip() in ("running", "paused", "restarting"):
        print("Error response from daemon: cannot remove container: container is running", file=sys.stderr)
        sys.exit(1)
    if os.path.exists(CONTAINER):
        os.unlink(CONTAINER)
    sys.exit(0)
if ME == "docker" and sys.argv[1] in ("stop", "pull"):
    sys.exit(0)
if ME == "docker" and sys.argv[1:3] == ["image", "inspect"]:  # what `docker image inspect` prints, abridged
    repo = os.environ.get("STANDIN_DIGEST_REPO") or sys.argv[3].rsplit(":", 1)[0]  # another name: a mirror's push
    digests = [] if os.environ.get("STANDIN_NO_DIGEST") else [repo + "@sha256:" + os.environ.get("STANDIN_DIGEST", "b" * 64)]
    print(json.dumps([{"Id": "sha256:" + "a" * 64, "RepoTags": [sys.argv[3]], "RepoDigests": digests}], indent=4))
    sys.exit(0)

def arg(name, default):
    a = sys.argv
    return a[a.index(name) + 1] if name in a else default

adaptive = any('"enable_adaptive_verification":true' in a for a in sys.argv)
mode = "adaptive" if adaptive else "block"
def knob(name, default=""):
    return os.environ.get(f"STANDIN_{name}_{mode.upper()}", os.environ.get(f"STANDIN_{name}", default))

pids, workers = [os.getpid()], []
if knob("WORKER") == "1":  # a child in the same process group, like vLLM's EngineCore
    workers.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
    pids.append(workers[-1].pid)
with open(stem + ".pids", "w") as f:
    f.write(" ".join(map(str, pids)))
INFLIGHT = []  # the warm-up POSTs being answered
def on_term(*_):
    print("stand-in: SIGTERM, shutting down", flush=True)
    while knob("DRAIN") == "1" and INFLIGHT:  # as uvicorn: "Waiting for connections to close"
        time.sleep(0.05)
    for w in workers:  # stopped and reaped, as vLLM's API server joins its EngineCore: an orphan stays a zombie in
        w.terminate()  # the group until init reaps it (seconds on some hosts), and the launcher waits for the group
        w.wait()
    os._exit(0)
if knob("IGNORE_TERM") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, on_term)

print(f"stand-in {ME} ({mode}) starting; INFO non-default args: {sys.argv[1:]!r}", flush=True)
def refuse_mono():  # STANDIN_REFUSE_MONO: vLLM 0.33.0 refusing --monokernel while it builds the model
    if "--monokernel" in sys.argv and os.environ.get("STANDIN_REFUSE_MONO") == "1":
        time.sleep(0.1)
        print(os.environ["STANDIN_MONO_TRACEBACK"], file=sys.stderr, flush=True)
        sys.exit(1)
if os.environ.get("STANDIN_REFUSE_ORDER") != "adaptive-first":
    refuse_mono()
if adaptive and os.environ.get("STANDIN_REFUSE_ADAPTIVE") == "1":
    time.sleep(float(os.environ.get("STANDIN_REFUSE_AFTER", "0.1")))
    print("(EngineCore pid=1) ERROR Traceback (most recent call last):", flush=True)
    print("\x1b[31m" + os.environ["STANDIN_REFUSAL"] + "\x1b[0m", file=sys.stderr, flush=True)
    sys.exit(1)
refuse_mono()
if knob("DIE_AFTER"):
    time.sleep(float(knob("DIE_AFTER")))
    print("stand-in: dying before ready", flush=True)
    sys.exit(int(knob("DIE_STATUS", "3")))
time.sleep(float(knob("READY_AFTER", "0")))  # nothing listens until then: connection refused, like vLLM

health_never = knob("HEALTH") == "never"
models_never = knob("MODELS") == "never"
served = arg("--served-model-name", "m")

import threading
exiting = threading.Lock()
def exit_later():
    """EXIT_AFTER_READY: exit that long after the first ready answer (a fixed time from listening raced the
    launcher's poll under load, seen as phase 'failed' by session 6)."""
    if knob("EXIT_AFTER_READY") and exiting.acquire(blocking=False):
        def later():
            time.sleep(float(knob("EXIT_AFTER_READY")))
            os._exit(int(knob("EXIT_STATUS", "0")))
        threading.Thread(target=later, daemon=True).start()

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            code, body = (503, b"") if health_never else (200, b"")
        elif self.path == "/v1/models":
            code = 503 if models_never else 200
            if code == 200:
                exit_later()  # the launcher's last readiness check passed: it has seen the server ready
            body = json.dumps({"object": "list", "data": [{"id": served, "object": "model"}]}).encode()
        else:
            code, body = 404, b""
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):  # the launcher's warm-up: /v1/completions, recorded; STANDIN_COMPLETE=<code> answers that
        n = int(self.headers.get("Content-Length") or 0)
        req = self.rfile.read(n)
        with open(f"{stem}.post-{time.time_ns()}", "wb") as f:
            f.write(self.path.encode() + b"\n" + req)
        code = int(knob("COMPLETE", "200")) if self.path == "/v1/completions" else 404
        if knob("COMPLETE_DELAY"):  # the answer comes that late, or never once the client has gone
            import select, socket
            INFLIGHT.append(self)
            end = time.monotonic() + float(knob("COMPLETE_DELAY"))
            try:
                while time.monotonic() < end:
                    if select.select([self.connection], [], [], 0.05)[0] and not self.connection.recv(1, socket.MSG_PEEK):
                        return
            finally:
                INFLIGHT.remove(self)
        body = (json.dumps({"object": "text_completion", "choices": [{"index": 0, "text": " one two"}]}) if code == 200
                else json.dumps({"error": {"message": "stand-in: warm-up refused\nsecond line", "code": code}})).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

host = arg("--host", "127.0.0.1")
srv = ThreadingHTTPServer(("127.0.0.1" if host == "0.0.0.0" else host, int(arg("--port", "8000"))), H)
print("stand-in: listening", flush=True)
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
            STANDIN_MONO_TRACEBACK=MONO_TRACEBACK,
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

    def posts(self, who: str = "vllm") -> list[tuple[str, dict]]:
        """The stand-in's POSTs (the launcher's warm-up requests), oldest first: (path, JSON body)."""
        out = []
        for p in sorted((self.root / "rec").glob(f"*-{who}-*.post-*"), key=lambda p: int(p.name.rpartition("-")[2])):
            path, _, body = p.read_bytes().partition(b"\n")
            out.append((path.decode(), json.loads(body)))
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


SHELLCHECK = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def shellcheck(*paths: Path) -> None:
    """shellcheck (style and up) and `bash -n` on each script. One shellcheck process per file, side by side: each
    takes about 0.4 CPU-s on one core, so a test's scripts also use the core the other xdist worker leaves idle
    while it waits on a deadline."""
    checks = [(p, subprocess.Popen([SHELLCHECK, "-S", "style", "-s", "bash", str(p)], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)) for p in paths]
    for path, proc in checks:
        out = proc.communicate()[0]
        assert proc.returncode == 0, f"{path}:\n{out}"
    for path in paths:
        res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
