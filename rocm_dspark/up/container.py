"""The local-cpu target in container mode: a CPU vLLM image (scripts/build_cpu_test_image.sh builds one) run the way
the GPU path runs its image, less the GPU flags, with the toolkit's wheel mounted read-only and installed at start
so that vLLM loads the plugin through its entry point (0.30-0.32 images get the backport; on CPU the plugin says it
is not ROCm and patches nothing).

The `docker run` argv is built here, in Python; the generated launcher only receives the flags
(rocm_dspark.launch.launchers, `docker_run_flags`) and the serving argv.
"""

from __future__ import annotations

import subprocess

# Where the toolkit's wheel is mounted (read-only) and installed inside an image: the in-image probe
# (rocm_dspark.up.inimage) and the served CPU container both use them.
WHEEL_MOUNT = "/rocm-dspark-wheel"
TARGET = "/tmp/rocm-dspark-toolkit"

# launch_facts.DOCKER_RUN_FLAGS without the GPU devices, groups, ptrace and seccomp: a CPU container needs none.
# --ipc=host: with Docker's default 64 MiB /dev/shm the CPU engine dies ("Insufficient space in /dev/shm ... 160 MiB
# required", as a CPU vLLM container reports it). No --ulimit=memlock=-1: pinned host memory is a GPU need,
# and where raising the limit is not permitted runc refuses to start ("error setting rlimit type 8").
CPU_RUN_FLAGS = ("--rm", "--init", "--network=host", "--ipc=host")

# pip installs the mounted wheel into the container's own /tmp (the mount stays read-only), then vLLM replaces bash.
SERVE_SCRIPT = (
    f'set -e; python3 -m pip install -q --no-deps --no-index --target {TARGET} {WHEEL_MOUNT}/*.whl; exec "$@"'
)
SERVE_ARGV0 = "rocm-dspark-serve"  # $0 of the bash -c script


def run_flags(wheel_dir) -> tuple[str, ...]:
    """The flags before --name: CPU_RUN_FLAGS, the wheel directory read-only, and the toolkit on the path."""
    return (*CPU_RUN_FLAGS, "-v", f"{wheel_dir}:{WHEEL_MOUNT}:ro", "-e", f"PYTHONPATH={TARGET}")


def serve_argv(vllm_argv) -> tuple[str, ...]:
    """The argv the launcher runs as `--entrypoint argv[0] IMAGE argv[1:]`: the install, then vLLM's argv."""
    return ("bash", "-c", SERVE_SCRIPT, SERVE_ARGV0, *vllm_argv)


def daemon_answers(tool: str, timeout_s: float = 20.0) -> tuple[bool, str]:
    """(does `docker info` answer, the server version or the last line it printed). DOCKER_HOST is left as set."""
    try:
        proc = subprocess.run(
            [tool, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return False, f"`{tool} info` did not answer in {timeout_s:.0f} s"
    except OSError as exc:
        return False, f"`{tool} info`: {exc}"
    out = proc.stdout.strip()
    if proc.returncode == 0 and out and "error" not in out.lower():
        return True, out
    said = (proc.stderr.strip() or out).splitlines()
    return False, " ".join((said[-1] if said else f"exit {proc.returncode}").split())[:240]
