"""`rocm-dspark up` on the node target in container mode, run for real as far as this CPU box allows (issue #16).

Real: the CLI in a child process, every step's code, the host checks on a host laid out in a directory
(ROCM_DSPARK_HOST_ROOT, the variable the launcher reads too), the generated launcher, its process handling,
the state file, `status` and `down`. Stand-ins, because neither exists here: `rocminfo` printing a recorded
real MI300X x8 output (tests/fixtures/host), and `docker`, an instrument that answers `pull` and `image inspect`
as docker documents them (a registry digest), records the argv of `docker run` and then answers /health and
/v1/models on the plan's port. The stand-in is not vLLM, so validation fails at its first request: the run
must stop there with one line, the fix and exit 1, leaving the server up for a look, as the README says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_dspark.runtime.process import free_port, is_alive
from tests.conftest import FIXTURES

ROCMINFO = FIXTURES / "host" / "rocminfo_text__mi300x_x8__rocm6.2.3__rocm-issue4021.txt"
DIGEST = "c" * 64

DOCKER = r'''#!{python}
import json, os, signal, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

a = sys.argv[1:]
rec = os.environ["STANDIN_RECORD_DIR"]
with open(os.path.join(rec, f"{{time.time_ns()}}-docker.argv"), "w") as f:
    json.dump(a, f)
if a[0] in ("pull", "rm", "stop"):
    sys.exit(0)
if a[:2] == ["image", "inspect"]:
    image = a[-1]
    repo = image.split("@", 1)[0].rsplit(":", 1)[0]
    digests = [repo + "@sha256:{digest}"]
    if "--format" in a:   # docker image inspect --format '{{{{json .RepoDigests}}}}' IMAGE
        print(json.dumps(digests))
    else:                 # the launcher's form: the whole object, abridged
        print(json.dumps([{{"Id": "sha256:" + "a" * 64, "RepoTags": [image], "RepoDigests": digests}}], indent=4))
    sys.exit(0)
assert a[0] == "run", a
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
port = int(a[a.index("--port") + 1])
served = a[a.index("--served-model-name") + 1] if "--served-model-name" in a else "m"
print("stand-in docker run: serving", flush=True)

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{"object": "list", "data": [{{"id": served}}]}}).encode() if self.path == "/v1/models" else b""
        self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture
def node(tmp_path):
    bindir, rec, host, model = (tmp_path / d for d in ("bin", "rec", "host", "model"))
    for d in (bindir, rec, model, host / "dev" / "dri", host / "proc" / "sys" / "kernel"):
        d.mkdir(parents=True)
    (bindir / "rocminfo").write_text(f"#!/bin/sh\ncat {ROCMINFO}\n")
    (bindir / "docker").write_text(DOCKER.format(python=sys.executable, digest=DIGEST))
    for tool in ("rocminfo", "docker"):
        (bindir / tool).chmod(0o755)
    # The host: the KFD and one render node open to us, NUMA balancing off.
    for dev in ("dev/kfd", "dev/dri/renderD128"):
        (host / dev).write_text("")
        (host / dev).chmod(0o666)
    (host / "proc/sys/kernel/numa_balancing").write_text("0\n")
    # A checkpoint that is "present": one sparse file of the recipe's size (the disk check sums st_size).
    with open(model / "model.safetensors", "wb") as f:
        f.truncate(511 * 10**9)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROCM_DSPARK_", "HF_"))}
    env.update(PATH=f"{bindir}{os.pathsep}{env['PATH']}", STANDIN_RECORD_DIR=str(rec), ROCM_DSPARK_HOST_ROOT=str(host),
               HF_HOME=str(tmp_path / "hf"))
    return tmp_path, env


def _cli(env, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "rocm_dspark", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _docker_calls(rec: Path) -> list[list[str]]:
    return [json.loads(p.read_text()) for p in sorted(rec.glob("*-docker.argv"))]


def test_up_container_mode_from_detection_to_a_failed_validation_then_down(node):
    tmp_path, env = node
    state, port = tmp_path / "state", free_port()
    args = ["--model", "V4.1-Flash", "--gpu", "mi300x", "--mode", "container", "--model-path", str(tmp_path / "model"),
            "--port", str(port), "--state-dir", str(state), "--yes", "--ready-timeout", "60",
            "--probe-levels", "static", "--request-timeout", "5", "--quick"]
    r = _cli(env, "up", *args)
    out = r.stdout + r.stderr
    st = json.loads((state / "up" / "up-state.json").read_text())
    try:
        assert r.returncode == 1, out[-4000:]
        steps = {name: s["status"] for name, s in st["steps"].items()}
        assert steps["detect"] == steps["choose"] == steps["prereq"] == "done", (steps, out[-3000:])
        assert steps["image"] == steps["launchers"] == steps["start"] == steps["probe"] == "done", (steps, out[-3000:])
        assert steps["validate"] == "failed", steps
        # 1. Detection and prerequisites read the laid-out host.
        assert "AMD Instinct MI300X" in out and "numa" in out and "devices" in out
        # 2. Image: pulled, and the digest the registry gave pinned and recorded.
        image = st["steps"]["image"]["output"]
        assert image["digest"] == f"sha256:{DIGEST}" and image["pinned"].endswith(f"@sha256:{DIGEST}")
        calls = _docker_calls(tmp_path / "rec")
        assert calls[0][0] == "pull" and calls[1][:4] == ["image", "inspect", "--format", "{{json .RepoDigests}}"]
        # 3. The launcher ran the pinned image with the plan's own argv (block: nothing proves adaptive here).
        run = next(c for c in calls if c[0] == "run")
        plan = json.loads((state / "up" / "plan.json").read_text())
        at = run.index("--entrypoint")
        assert run[at + 2] == image["pinned"] and [run[at + 1], *run[at + 3:]] == list(plan["argv"])
        assert f"--port={port}" in " ".join(run).replace(f"--port {port}", f"--port={port}")
        assert st["steps"]["start"]["output"]["launch_state"]["mode"] == "block"
        # 4. Probe: the static level ran in this Python, which has no vLLM: it must not count either way (it once
        #    claimed "valid for gating" and so would have refuted adaptive verification); live is not run on a
        #    block server, with why.
        assert "static: FAIL; not valid for gating: vLLM is not installed in " in out
        assert st["steps"]["probe"]["output"]["gate"] == "incomplete"
        assert "live: not run: the started server uses block verification" in out
        assert "note: with --mode container vLLM runs inside the image, and this host's Python has none" in out
        # 5. Validation ran its host checks on the laid-out host, then failed at the stand-in's first request:
        #    one line with the fix, the server left up.
        assert "host.devices               PASS" in out and "host.numa_balancing        PASS" in out
        assert "validate: FAIL at server." in out and "the server keeps running for a look" in out
        # The stand-in's HTML error page (http.server's 501) reaches the report as one line.
        failed = next(line for line in out.splitlines() if "server.deterministic       FAIL" in line)
        assert "HTTP 501: <!DOCTYPE HTML> <html" in failed and "</html>" in failed
        pid = st["service"]["pid"]
        assert is_alive(pid)
        s = _cli(env, "status", "--state-dir", str(state))
        assert s.returncode == 0 and "validate" in s.stdout and "failed" in s.stdout, s.stdout + s.stderr
    finally:
        d = _cli(env, "down", "--state-dir", str(state))
    assert d.returncode == 0, d.stdout + d.stderr
    assert not is_alive(st["service"]["pid"])
    assert (state / "up" / "up-state.json").exists()  # down leaves the records
