"""`rocm-dspark up` on the node target in container mode, run for real as far as this CPU box allows (issue #16).

Real: the CLI in a child process, every step's code, the host checks on a host laid out in a directory
(ROCM_DSPARK_HOST_ROOT, read by the prerequisite checks only), the generated launcher, its process handling,
the state file, `status` and `down`. Stand-ins, because neither exists here: `rocminfo` printing a recorded
real MI300X x8 output (tests/fixtures/host), and `docker`, an instrument that answers `pull` and `image inspect`
as docker documents them (a registry digest), records the argv of `docker run` and then answers /health and
/v1/models on the plan's port. The stand-in is not vLLM, so validation fails at its first request: the run
must stop there with one line, the fix and exit 1, leaving the server up for a look, as the README says.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_dspark.runtime.process import is_alive
from tests.helpers import free_port
from tests.conftest import FIXTURES

ROCMINFO = FIXTURES / "host" / "rocminfo_text__mi300x_x8__rocm6.2.3__rocm-issue4021.txt"
# What the stand-in registry serves for every tag (`skopeo inspect --raw`): the digest is its SHA-256, as docker's.
MANIFEST = b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}'
DIGEST = hashlib.sha256(MANIFEST).hexdigest()
SKOPEO = f"""#!{sys.executable}
import sys
if "--raw" in sys.argv:
    sys.stdout.buffer.write({MANIFEST!r})
else:
    print('{{"Labels": null, "Env": ["PATH=/usr/bin"]}}')
"""

DOCKER = r'''#!{python}
import json, os, signal, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROVE = {prove!r}
a = sys.argv[1:]
rec = os.environ["STANDIN_RECORD_DIR"]
with open(os.path.join(rec, f"{{time.time_ns()}}-docker.argv"), "w") as f:
    json.dump(a, f)
pulled = os.path.join(rec, "pulled")
if a[0] == "pull":
    open(pulled, "w").close()
    sys.exit(0)
if a[0] in ("rm", "stop"):
    sys.exit(0)
if a[0] == "info":   # the prerequisite: the daemon answers (docker info --format '{{{{.ServerVersion}}}}')
    print("20.10.24+stand-in")
    sys.exit(0)
if a[:2] == ["image", "inspect"] and not os.path.exists(pulled):
    print(f"Error: No such image: {{a[-1]}}", file=sys.stderr)
    sys.exit(1)
if a[:5] == ["image", "inspect", "--format", "{{{{.Id}}}}", a[-1]]:
    print("sha256:" + "a" * 64)
    sys.exit(0)
if a[0] == "run" and a[a.index("--entrypoint") + 1] == "python3":  # a script on the image's files (this Python)
    import subprocess
    script = a[a.index("-c") + 1]
    root = os.environ["STANDIN_IMAGE_ROOT"]
    env = {{"PYTHONPATH": os.path.join(root, "site-packages"), "ROCM_PATH": os.path.join(root, "opt", "rocm")}}
    sys.exit(subprocess.run([sys.executable, "-S", "-c", script], env=env).returncode)
if a[:2] == ["image", "inspect"]:
    image = a[-1]
    repo = image.split("@", 1)[0].rsplit(":", 1)[0]
    digests = [repo + "@sha256:{digest}"]
    if "--format" in a:   # docker image inspect --format '{{{{json .RepoDigests}}}}' IMAGE
        print(json.dumps(digests))
    else:                 # the launcher's form: the whole object, abridged
        print(json.dumps([{{"Id": "sha256:" + "a" * 64, "RepoTags": [image], "RepoDigests": digests}}], indent=4))
    sys.exit(0)
if a[0] == "run" and a[a.index("--entrypoint") + 1] == "bash":
    # The probe inside the image. The stand-in honours the bind mounts, installs the mounted wheel for real
    # (pip --no-deps --no-index --target) and records the script; then, as the image's probe on an MI300X would,
    # it writes records for the image's software (STANDIN_INIMAGE=prove: tests/test_probe_gate.write and an A/B
    # record), or exits 1 having proven nothing (fail).
    import shlex, subprocess
    mounts = dict(a[i + 1].split(":")[1::-1] for i, x in enumerate(a) if x == "-v")
    script = a[a.index("-c") + 1]
    with open(os.path.join(rec, "inimage.script"), "w") as f:
        f.write(script)
    wheel = shlex.split(script.split("--target ", 1)[1].split(";", 1)[0])[1].replace(
        "/rocm-dspark-wheel", mounts["/rocm-dspark-wheel"])
    target = os.path.join(rec, "toolkit")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", target,
                        wheel])
    if r.returncode:
        sys.exit(r.returncode)
    probe = shlex.split(script.rsplit("; ", 1)[1])
    state = probe[probe.index("--state-dir") + 1]
    assert mounts[state] == state, (mounts, state)
    if os.environ.get("STANDIN_INIMAGE") != "prove":
        sys.exit(1)
    sys.exit(subprocess.run([sys.executable, "-c", PROVE, state], cwd=os.environ["STANDIN_REPO"]).returncode)
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
    def do_POST(self):  # the launcher's warm-up before ready: /v1/completions; anything else as http.server's own
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/completions":
            return self.send_error(501, "Unsupported method (%r)" % self.command)
        body = json.dumps({{"object": "text_completion", "choices": [{{"index": 0, "text": " a"}}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


# What the probe inside an MI300X image would write: a proving record for the image's software (the fingerprint the
# test computed, in STANDIN_PROVE_FP) and an A/B record where adaptive verification wins at c=64.
PROVE = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, os.getcwd())
from rocm_dspark.probe import ab_record, store
from tests.helpers.ab_records import arm, workload
from tests.helpers.probe_records import write
state, fp = Path(sys.argv[1]), json.loads(os.environ["STANDIN_PROVE_FP"])
write(state, fp)
now = store.iso(store.utc_now())
ab_record.write(state, ab_record.build(record_id=store.new_record_id(store.utc_now()), created_at=now, finished_at=now,
    toolkit_version=fp["toolkit_version"], host={}, selection={}, fingerprint=fp, concurrency=64, workload=workload(),
    arms={"block": arm(1000.0), "adaptive": arm(1200.0)}, override=None))
"""

# What a ROCm vLLM image holds, for the stand-in to run rocm_dspark/probe/software.py on: the version files vLLM's
# and torch's wheels generate (their format: vllm/_version.py by setuptools-scm, torch/version.py by torch's
# build) with the nightly-3df4ae15 build's version (recipes/vllm.yaml) and a ROCm torch. Data for an instrument.
IMAGE_FILES = {
    "site-packages/vllm/__init__.py": "",
    "site-packages/vllm/_version.py": "__version__ = version = '0.29.1rc1.dev452+g3df4ae153.rocm700'\n"
                                      "__commit_id__ = commit_id = 'g3df4ae153'\n",
    "site-packages/torch/__init__.py": "",
    "site-packages/torch/version.py": "__version__ = '2.9.0a0+git1c57644'\nhip: Optional[str] = '7.0.51831-a3e329ad8'\n",
    "opt/rocm/.info/version": "7.0.0-38\n",
}
IMAGE_FACTS = {"vllm_version": "0.29.1rc1.dev452+g3df4ae153.rocm700", "vllm_commit": "3df4ae153",
               "torch_version": "2.9.0a0+git1c57644", "hip_version": "7.0.51831-a3e329ad8", "rocm_version": "7.0.0-38"}

# A warm-up of 3 requests before ready, not the profile's 255 (one curl each; tests/test_launchers.py checks it).
SMALL_WARM_UP = ("--max-num-seqs", "2")


@pytest.fixture
def node(tmp_path):
    bindir, rec, host, model = (tmp_path / d for d in ("bin", "rec", "host", "model"))
    for d in (bindir, rec, model, host / "dev" / "dri", host / "proc" / "sys" / "kernel"):
        d.mkdir(parents=True)
    (model / "config.json").write_text("{}")  # up's prerequisite wants a Hugging Face checkpoint there
    (bindir / "rocminfo").write_text(f"#!/bin/sh\ncat {ROCMINFO}\n")
    (bindir / "docker").write_text(DOCKER.format(python=sys.executable, digest=DIGEST, prove=PROVE))
    (bindir / "skopeo").write_text(SKOPEO)  # the registry up asks before pulling (rocm_dspark.images.registry)
    for tool in ("rocminfo", "docker", "skopeo"):
        (bindir / tool).chmod(0o755)
    # The host: the KFD and one render node open to us, NUMA balancing off.
    for dev in ("dev/kfd", "dev/dri/renderD128"):
        (host / dev).write_text("")
        (host / dev).chmod(0o666)
    (host / "proc/sys/kernel/numa_balancing").write_text("0\n")
    # A checkpoint that is "present": one sparse file of the recipe's size (the disk check sums st_size).
    with open(model / "model.safetensors", "wb") as f:
        f.truncate(511 * 10**9)
    (model / "config.json").write_text("{}\n")  # the model-path prerequisite reads a checkpoint's config.json first
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROCM_DSPARK_", "HF_"))}
    for name, text in IMAGE_FILES.items():
        (tmp_path / "image" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "image" / name).write_text(text)
    env.update(PATH=f"{bindir}{os.pathsep}{env['PATH']}", STANDIN_RECORD_DIR=str(rec), ROCM_DSPARK_HOST_ROOT=str(host),
               HF_HOME=str(tmp_path / "hf"), STANDIN_IMAGE_ROOT=str(tmp_path / "image"),
               STANDIN_REPO=str(Path(__file__).resolve().parents[1]))
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
            "--probe-levels", "static", "--request-timeout", "5", "--quick", *SMALL_WARM_UP]
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
        calls = [c for c in _docker_calls(tmp_path / "rec") if c[:4] != ["image", "inspect", "--format", "{{.Id}}"]
                 and c[0] != "info"]
        assert "docker         pass    `docker info` answers" in out
        assert calls[0][0] == "pull" and calls[1][:4] == ["image", "inspect", "--format", "{{json .RepoDigests}}"]
        # Not pulled when the plan was chosen: the gate read this Python, and said so.
        assert "is not pulled yet (docker: Error: No such image: " in out
        assert "so the gate reads this Python's software" in out
        # 3. The launcher ran the pinned image with the plan's own argv (block: nothing proves adaptive here).
        run = next(c for c in calls if c[0] == "run" and "python3" not in c and "bash" not in c)
        plan = json.loads((state / "up" / "plan.json").read_text())
        at = run.index("--entrypoint")
        assert run[at + 2] == image["pinned"] and [run[at + 1], *run[at + 3:]] == list(plan["argv"])
        assert f"--port={port}" in " ".join(run).replace(f"--port {port}", f"--port={port}")
        assert st["steps"]["start"]["output"]["launch_state"]["mode"] == "block"
        # 4. Probe: vLLM is only in the image, so the probe ran there: a wheel of this toolkit built here with no
        #    registry, mounted read-only and installed with --no-deps, then `probe` with the same selection flags
        #    and state dir. The stand-in image proves nothing (exit 1): block verification is started again.
        probe = st["steps"]["probe"]["output"]
        assert probe["in_image"]["exit_code"] == 1 and probe["gate"] == "not proven", probe
        assert probe["in_image"]["new_records"] == []
        script = (tmp_path / "rec" / "inimage.script").read_text()
        assert "pip install -q --no-deps --no-index --target /tmp/rocm-dspark-toolkit /rocm-dspark-wheel/rocm_dspark-" in script
        assert "-m rocm_dspark probe --model V4.1-Flash --gpu mi300x" in script
        assert f"--state-dir {state} --levels static" in script and f"--port {port}" in script
        assert "live" not in script.rsplit("--levels", 1)[1]  # no model load in the image: live runs on up's own start
        assert (tmp_path / "rec" / "toolkit" / "rocm_dspark" / "vllm_plugin" / "patch.py").exists()
        assert (tmp_path / "rec" / "toolkit" / "rocm_dspark" / "recipes" / "vllm.yaml").exists()  # the plugin's table
        assert list((tmp_path / "rec" / "toolkit").glob("rocm_dspark-*.dist-info/entry_points.txt"))
        inimage = next(c for c in calls if c[0] == "run" and "bash" in c)
        assert f"{state}:{state}" in inimage and "--device=/dev/kfd" in inimage
        # The record must name this host (the fingerprint's host_id reads machine-id), and the checkpoint is there.
        assert ("/etc/machine-id:/etc/machine-id:ro" in inimage) == Path("/etc/machine-id").is_file()
        assert f"{tmp_path / 'model'}:{tmp_path / 'model'}:ro" in inimage
        # The probe ran before the first start, and no adaptive start is made without --concurrency: one load.
        assert [c[0] for c in calls if c[0] == "run"][:1] == ["run"] and calls.index(inimage) < calls.index(run)
        assert st["steps"]["prove"]["status"] == "skipped" and "no workload declared" in out
        assert len(st["loads"]) == 1 and st["loads"][0]["command"] == "block"
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


def test_the_image_software_script_reads_what_the_image_holds(node):
    """rocm_dspark/probe/software.py run by the stand-in's `docker run --rm ... python3 -c` on the image's files."""
    from rocm_dspark.images import pull
    from rocm_dspark.probe import software

    tmp_path, env = node
    (tmp_path / "rec" / "pulled").touch()
    old = dict(os.environ)
    os.environ.update(env)
    try:
        assert pull.image_id("docker", "vllm/x:1") == ("sha256:" + "a" * 64, "")
        assert software.in_image("docker", "vllm/x:1") == IMAGE_FACTS
    finally:
        os.environ.clear()
        os.environ.update(old)
    run = next(c for c in _docker_calls(tmp_path / "rec") if c[0] == "run")
    assert run[:7] == ["run", "--rm", "--network", "none", "--entrypoint", "python3", "vllm/x:1"]


def _image_proof_setup(tmp_path, port):
    """The fingerprint a probe in the stand-in image writes for this selection, and `up`'s arguments."""
    from rocm_dspark.images import cache
    from rocm_dspark.probe import fingerprint
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.recipe.plan import Selection

    catalog = load_catalog()
    # The registry's answer is on this host already (as `rocm-dspark images` leaves it): every step plans the digest.
    state = tmp_path / "state"
    tag = catalog.default_build(catalog.gpus["mi300x"])[0].image_tag
    cache.record(state, {tag: {"exists": True, "digest": "sha256:" + DIGEST, "stack": None, "answer": "skopeo",
                               "registry": "registry-1.docker.io", "via": "skopeo", "checked_at": "2026-12-01T00:00:00Z"}})
    sel = Selection(model="V4.1-Flash", gpu="mi300x", model_path=str(tmp_path / "model"), port=port, concurrency=64,
                    images=cache.for_selection(state), max_num_seqs=int(SMALL_WARM_UP[1]))
    gpus = {"gpu_arch": "gfx942", "gpu_name": "AMD Instinct MI300X", "gpu_count": 8}  # what the stand-in rocminfo shows
    fp = fingerprint.current_fingerprint(catalog, fingerprint.adaptive_plan(catalog, sel), gpus, IMAGE_FACTS)
    args = ["--model", "V4.1-Flash", "--gpu", "mi300x", "--mode", "container", "--model-path", str(tmp_path / "model"),
            "--port", str(port), "--state-dir", str(tmp_path / "state"), "--yes", "--ready-timeout", "60",
            "--concurrency", "64", "--probe-levels", "static", "--request-timeout", "5", "--quick", *SMALL_WARM_UP]
    return fp, args


def test_up_gates_a_container_plan_on_the_image_software(node):
    """A proof written inside the image (its software in the fingerprint) turns adaptive verification on for
    `up --mode container`, although this host's Python has no vLLM; the A/B record there decides the payoff."""
    from rocm_dspark.probe import ab_record, store
    from tests.helpers.ab_records import arm, workload
    from tests.helpers.probe_records import write

    tmp_path, env = node
    state, port = tmp_path / "state", free_port()
    (tmp_path / "rec" / "pulled").touch()  # pulled before: its software can be read when the plan is chosen
    fp, args = _image_proof_setup(tmp_path, port)
    rid, _ = write(state, fp)
    now = store.iso(store.utc_now())
    ab = ab_record.build(record_id=store.new_record_id(store.utc_now()), created_at=now, finished_at=now,
                         toolkit_version=fp["toolkit_version"], host={}, selection={}, fingerprint=fp, concurrency=64,
                         workload=workload(), arms={"block": arm(1000.0), "adaptive": arm(1200.0)}, override=None)
    ab_record.write(state, ab)
    r = _cli(env, "up", *args)
    out = r.stdout + r.stderr
    st = json.loads((state / "up" / "up-state.json").read_text())
    try:
        assert "the gate read the image's software: vLLM 0.29.1rc1.dev452+g3df4ae153.rocm700, torch 2.9.0a0+git1c57644" \
            in out, out[-3000:]
        choose = st["steps"]["choose"]["output"]
        assert choose["adaptive"] is True and f"record {rid}" in choose["verdict"], choose["verdict"]
        assert f"payoff decided by A/B record {ab['id']}" in choose["verdict"]
        run = next(c for c in _docker_calls(tmp_path / "rec") if c[0] == "run" and "python3" not in c and "bash" not in c)
        assert any('"enable_adaptive_verification":true' in w for w in run)
        assert st["steps"]["start"]["output"]["launch_state"]["mode"] == "adaptive"
        # The records already prove it and the A/B record says it pays: one load, adaptive, nothing to prove.
        assert "skipped: the gate already chose adaptive verification" in out
        assert [ld["command"] for ld in st["loads"]] == ["adaptive"]
        # validate gates on the image's software too: it sees the proof and the adaptive plan.
        assert "probe verdict: proven (" in out
        assert r.returncode == 1 and "validate: FAIL at server." in out
    finally:
        _cli(env, "down", "--state-dir", str(state))


def test_one_up_on_a_fresh_container_host_reaches_adaptive_verification(node):
    """No record, image not pulled: `up` runs the probe inside the image it pulled before any start (the stand-in
    writes records that prove it and an A/B record that pays, as a finished proof on an MI300X would), reads them
    back, and its first and only start serves adaptive."""
    tmp_path, env = node
    state, port = tmp_path / "state", free_port()
    fp, args = _image_proof_setup(tmp_path, port)
    env = {**env, "STANDIN_INIMAGE": "prove", "STANDIN_PROVE_FP": json.dumps(fp)}
    r = _cli(env, "up", *args)
    out = r.stdout + r.stderr
    st = json.loads((state / "up" / "up-state.json").read_text())
    try:
        runs = [c for c in _docker_calls(tmp_path / "rec") if c[0] == "run" and "python3" not in c]
        serves = [c for c in runs if "bash" not in c]
        assert [("bash" in c) for c in runs] == [True, False], out[-4000:]
        assert any('"enable_adaptive_verification":true' in w for w in serves[0]), out[-6000:]  # adaptive at once
        assert [ld["command"] for ld in st["loads"]] == ["adaptive"]
        assert st["steps"]["start"]["output"]["launch_state"]["mode"] == "adaptive"
        assert r.returncode == 1 and "validate: FAIL at server." in out  # the stand-in is not vLLM
    finally:
        _cli(env, "down", "--state-dir", str(state))
