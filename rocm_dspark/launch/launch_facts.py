"""Facts the Python side and the generated bash launcher both use, each defined once, here.

rocm_dspark.launch.launchers writes them into rocm_dspark/launch/templates/launcher.sh.tmpl as bash (the launcher runs without this
package installed); the renderers, the process manager, the probe's store and validation read them here.
tests/test_launch_facts.py checks that both sides agree, by running both.
"""

import os
import re
from collections.abc import Mapping

# Facts that live below launch/ and reach the launcher as bash from here: the state directory's rule (a
# foundation), vLLM's refusal lines (what the runtime's process manager reads too) and the compute-partition rule
# (what the host checks read).
from rocm_dspark.runtime.partition import PARTITION_ARGV, SPLIT_PARTITION_RE, SPLIT_PARTITIONS  # noqa: F401
from rocm_dspark.runtime.refusal import (  # noqa: F401
    ADAPTIVE_REFUSALS,
    MONO_REFUSAL,
    find_mono_refusal,
    find_refusal,
)
from rocm_dspark.statedir import STATE_ROOTS, state_root  # noqa: F401

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
    "--rm",
    "--init",
    "--network=host",
    "--ipc=host",
    "--device=/dev/kfd",
    "--device=/dev/dri",
    "--group-add=video",
    "--cap-add=SYS_PTRACE",
    "--security-opt=seccomp=unconfined",
    "--ulimit=memlock=-1",
)
# The Hugging Face cache, one rule for the disk check, the download and every container mount: huggingface_hub
# reads HF_HOME (default ~/.cache/huggingface) and puts checkpoints in HF_HUB_CACHE (default $HF_HOME/hub)
# (https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables). A container gets both:
# HF_HOME (token, xet cache) at the image root user's default, and the hub on top of it, so the checkpoint lands
# where the host's HF_HUB_CACHE says, the directory prereq and validate measure.
HF_CACHE_CONTAINER = "/root/.cache/huggingface"
HF_HUB_CONTAINER = HF_CACHE_CONTAINER + "/hub"
# The same rule as bash, for the launcher and the printed docker command (expanded where they run).
HF_HOME_SH = "${HF_HOME:-${HOME:-/root}/.cache/huggingface}"
HF_HUB_CACHE_SH = "${HF_HUB_CACHE:-" + HF_HOME_SH + "/hub}"


def hf_home(environ: Mapping[str, str] = os.environ) -> str:
    """The host's HF_HOME (HF_HOME_SH's rule)."""
    return environ.get("HF_HOME") or os.path.join(
        environ.get("HOME") or os.path.expanduser("~"), ".cache", "huggingface"
    )


def hf_hub_cache(environ: Mapping[str, str] = os.environ) -> str:
    """Where huggingface_hub puts a downloaded checkpoint on this host (HF_HUB_CACHE_SH's rule)."""
    return environ.get("HF_HUB_CACHE") or os.path.join(hf_home(environ), "hub")


def hf_cache_mounts(home: str, hub: str) -> list[str]:
    """`docker run` volume flags for the cache: the host's HF_HOME and hub at the container's."""
    return ["-v", f"{home}:{HF_CACHE_CONTAINER}", "-v", f"{hub}:{HF_HUB_CONTAINER}"]


# Secrets passed by name only (`-e NAME` copies the value from the caller's environment, when it is set).
PASSED_ENV = ("HF_TOKEN",)


def default_name(profile: str) -> str:
    """The launcher, unit and container name for a profile: lower case, [a-z0-9-] only."""
    slug = re.sub(r"[^a-z0-9]+", "-", profile.lower()).strip("-")
    return f"rocm-dspark-{slug}" if slug else "rocm-dspark"


def docker_run_argv(plan, hf_home: str, hf_hub: str) -> list[str]:
    """`docker run ... --entrypoint argv[0] image argv[1:]`: the plan's vLLM command run in its pinned image, the
    Hugging Face cache at `hf_home` and `hf_hub`; a local --model-path is mounted read-only at the same path, so
    vLLM's argv names it unchanged; secrets and --env values only through ./<name>.env (docker --env-file), never
    as -e NAME=VALUE."""
    name, argv = default_name(plan.profile), plan.argv
    out = ["docker", "run", *DOCKER_RUN_FLAGS, "--name", name, *hf_cache_mounts(hf_home, hf_hub)]
    if plan.model_path:
        out += ["-v", f"{plan.model_path}:{plan.model_path}:ro"]
    for key, value in plan.env.items():
        out += ["-e", f"{key}={value}"]
    if plan.secret_env:
        out += ["--env-file", f"./{name}.env"]
    for key in PASSED_ENV:
        out += ["-e", key]
    return out + ["--entrypoint", argv[0], plan.image, *argv[1:]]


# ---- how long a start and a stop may take -------------------------------------------------------------
# One home for every deadline: the launcher's per-start wait and drain, the unit's TimeoutStartSec/TimeoutStopSec,
# `up`'s and `validate --launch`'s waits for readiness, and `down`'s wait before SIGKILL.
READY_TIMEOUT_S = 3600  # a 511 GB checkpoint can take most of an hour to load
STOP_TIMEOUT_S = 300  # the launcher's drain after SIGTERM; systemd's default 90 s would cut requests off
MARGIN_S = 120  # room for the launcher's own work around vLLM's starts (docker rm, state, polls)
STOP_MARGIN_S = 30  # and after its drain: its SIGKILL of vLLM's group and its last state write
# The canary (rocm_dspark.service.canary): every few minutes, one bounded check; the systemd timer's and the CronJob's.
CANARY_EVERY_MIN = 5
CANARY_TIMEOUT_S = 300  # 4 greedy prompts x 64 tokens and 8 re-scoring prefills: seconds on a GPU, a wide margin
JOIN_TIMEOUT_S = 600  # multi-node: a worker's wait to reach its head, the head's for its workers (loads come after)


MONOKERNEL = "--monokernel"  # the flag the launcher drops when vLLM refuses it or the GPU is partitioned


def runs_mono(argv) -> bool:
    """Whether a command asks for the mono decode layer: --monokernel as vLLM's parser reads it (the last of
    --monokernel / --no-monokernel wins; Command.from_words)."""
    from rocm_dspark.recipe.plan import Command

    return Command.from_words(argv).bool_flag("monokernel") is True


def starts(plan) -> int:
    """How many vLLM starts the launcher may make for `plan`: 2 with an adaptive->block fallback, else 1, and
    one more with --monokernel (a start vLLM refuses for it runs again without it)."""
    return (2 if plan.adaptive_verification and plan.block_argv else 1) + runs_mono(plan.argv)


def start_window_s(plan, ready_timeout_s: float = READY_TIMEOUT_S) -> int:
    """How long the launcher may take to report ready: every start's ready timeout, plus a margin."""
    return int(starts(plan) * ready_timeout_s + MARGIN_S)


def stop_window_s(stop_timeout_s: float = STOP_TIMEOUT_S) -> int:
    """How long the launcher may take to stop after SIGTERM (its drain, then SIGKILL, then its last state)."""
    return int(stop_timeout_s + STOP_MARGIN_S)


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

# A group keeps --monokernel (launch_group and k8s say so in one note).
GROUP_MONO = (
    "--monokernel in a group: its launchers do not drop it when vLLM refuses it, since every node must run "
    "one argv and the kernels take one node's tensor parallelism only (no DP, EP or nodes: "
    "rocm_dspark/recipe/mono.py, so `recipe` never adds it here); a refused start stops the group: remove "
    "the flag"
)
