"""Facts the Python side and the generated bash launcher both use, each defined once, here.

rocm_dspark.launch.launchers writes them into rocm_dspark/launch/templates/launcher.sh.tmpl as bash (the launcher runs without this
package installed); the renderers, the process manager, the probe's store and validation read them here.
tests/test_launch_facts.py checks that both sides agree, by running both.
"""

# No `from __future__ import annotations` here: typing.NamedTuple would then compile every field's string
# annotation at import, on the `recipe` start-up path (benchmarks/recipe_latency.py).

import re
from typing import Mapping

# Facts that live below launch/ and reach the launcher as bash from here: the state directory's rule (a
# foundation) and vLLM's refusal line (what the runtime's process manager reads too).
from rocm_dspark.runtime.refusal import REFUSAL_PATTERNS, find_refusal  # noqa: F401
from rocm_dspark.statedir import STATE_ROOTS, StateRoot, state_root  # noqa: F401

# ---- docker ----------------------------------------------------------------------------------------
# `docker run` flags for an AMD GPU container: the flags of ROCm's own vLLM container command
# (https://rocm.docs.amd.com/en/7.12.0-preview/rocm-for-ai/vllm.html: --network=host --group-add=video
# --ipc=host --cap-add=SYS_PTRACE --security-opt seccomp=unconfined --device /dev/kfd --device /dev/dri),
# plus --init so that a PID 1 reaps vLLM's worker processes and forwards SIGTERM
# (https://docs.docker.com/reference/cli/docker/container/run/#init) and an unlimited memlock for pinned host
# memory. Left out on purpose: --shm-size, which vLLM's Docker guide gives as the alternative to --ipc=host
# (https://docs.vllm.ai/en/stable/deployment/docker/): with the host's IPC namespace the container uses the
# host's /dev/shm; and --group-add=render, since a group is added by name from the image's /etc/group, which
# need not have `render` (https://github.com/ROCm/ROCm-docker/issues/90), and vLLM runs as the container's
# root, which opens /dev/kfd whatever its groups.
DOCKER_RUN_FLAGS = (
    "--rm", "--init", "--network=host", "--ipc=host", "--device=/dev/kfd", "--device=/dev/dri",
    "--group-add=video", "--cap-add=SYS_PTRACE", "--security-opt=seccomp=unconfined", "--ulimit=memlock=-1",
)
# The host's Hugging Face cache (bash expands it at run time) and where the image's root user looks for it.
HF_CACHE_HOST = "${HF_HOME:-${HOME:-/root}/.cache/huggingface}"
HF_CACHE_CONTAINER = "/root/.cache/huggingface"
# Secrets passed by name only (`-e NAME` copies the value from the caller's environment, when it is set).
PASSED_ENV = ("HF_TOKEN",)


def default_name(profile: str) -> str:
    """The launcher, unit and container name for a profile: lower case, [a-z0-9-] only."""
    slug = re.sub(r"[^a-z0-9]+", "-", profile.lower()).strip("-")
    return f"rocm-dspark-{slug}" if slug else "rocm-dspark"


def docker_run_argv(name: str, image: str, argv, env: Mapping[str, str], *, hf_cache: str = HF_CACHE_HOST,
                    passed_env=PASSED_ENV, model_path: str | None = None,
                    env_file: str | None = None) -> list[str]:
    """`docker run ... --entrypoint argv[0] image argv[1:]`: vLLM's command run in the pinned image; a local
    --model-path is mounted read-only at the same path, so vLLM's argv names it unchanged; secrets and --env
    values only through `env_file` (docker --env-file), never as -e NAME=VALUE."""
    out = ["docker", "run", *DOCKER_RUN_FLAGS, "--name", name, "-v", f"{hf_cache}:{HF_CACHE_CONTAINER}"]
    if model_path:
        out += ["-v", f"{model_path}:{model_path}:ro"]
    for key, value in env.items():
        out += ["-e", f"{key}={value}"]
    if env_file:
        out += ["--env-file", env_file]
    for key in passed_env:
        out += ["-e", key]
    return out + ["--entrypoint", argv[0], image, *argv[1:]]


# ---- host checks -------------------------------------------------------------------------------------
# What hurts vLLM on an AMD host; the launcher warns, `rocm-dspark validate` reports. AMD's MI300X system
# optimization guide turns automatic NUMA balancing off
# (https://rocm.docs.amd.com/en/latest/how-to/system-optimization/mi300x.html). A user opens /dev/kfd and
# the /dev/dri render nodes through the video and render groups (ROCm's group-permission setup, quoted in
# https://github.com/ROCm/ROCm-docker/issues/90; the devices: https://rocm.docs.amd.com/projects/install-on-linux/en/latest/how-to/docker.html).
NUMA_BALANCING = "/proc/sys/kernel/numa_balancing"
NUMA_BALANCING_OFF = "0"
NUMA_BALANCING_FIX = "sudo sysctl -w kernel.numa_balancing=0"
KFD = "/dev/kfd"
DRI = "/dev/dri"
GPU_GROUPS = ("video", "render")
