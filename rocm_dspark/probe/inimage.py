"""`rocm-dspark probe` run inside an image, so that its records are written on the software that will serve
(the trust model: only records written there count), where vLLM only exists in the image.

The image runs with the launcher's GPU flags (launch_facts.DOCKER_RUN_FLAGS, or the caller's, e.g. a CPU
image's), the state directory bind-mounted at the same path and this toolkit's wheel read-only
(rocm_dspark.images.wheel): `pip install --no-deps --no-index` into the container's /tmp, then
`python3 -m rocm_dspark probe <the selection flags> --state-dir <same> --levels <levels>`. With the wheel on
PYTHONPATH, a vLLM that the live level starts there loads the plugin through its entry point.
"""

from __future__ import annotations

import collections
import os
import shlex
import subprocess
import threading
from pathlib import Path

from rocm_dspark.images import wheel as toolkit


def probe_command(
    tool: str,
    image: str,
    wheel: Path,
    state_dir: Path,
    flags: list[str],
    levels: tuple[str, ...],
    *,
    run_flags: tuple[str, ...] | None = None,
    compile_cache_dir: str | None = None,
    model_path: str | None = None,
) -> list[str]:
    """The `docker run` argv of the in-image probe; run_flags: instead of the GPU flags; model_path: the
    selection's --model-path (typed, never read back out of `flags`)."""
    from rocm_dspark.launch.launch_facts import DOCKER_RUN_FLAGS, PASSED_ENV, hf_cache_mounts, hf_home, hf_hub_cache

    state = str(Path(state_dir).absolute())
    probe = ["python3", "-m", "rocm_dspark", "probe", *flags, "--state-dir", state, "--levels", ",".join(levels)]
    script = "; ".join(
        [
            "set -e",
            f"{toolkit.pip_install(shlex.quote(wheel.name))} || {{ echo 'pip in the image could not install the "
            "rocm-dspark wheel (the line above says why)' >&2; exit 4; }",
            f"export PYTHONPATH={toolkit.INSTALL_DIR}${{PYTHONPATH:+:$PYTHONPATH}}",
            "python3 -c 'import click, yaml' || { echo 'the image lacks click or pyyaml, which rocm-dspark needs' >&2; "
            "exit 3; }",
            shlex.join(probe),
        ]
    )
    argv = [
        tool,
        "run",
        *(DOCKER_RUN_FLAGS if run_flags is None else run_flags),
        "-v",
        f"{state}:{state}",
        *toolkit.mount(wheel.parent),
        *hf_cache_mounts(hf_home(), hf_hub_cache()),
    ]
    # The fingerprint names the host by machine-id (probe/fingerprint.host_id): the record written in the
    # container must name this host, or it never counts here.
    if os.path.isfile("/etc/machine-id"):
        argv += ["-v", "/etc/machine-id:/etc/machine-id:ro"]
    if model_path:  # a local checkpoint: mounted read-only at the same path, as the launcher does
        argv += ["-v", f"{model_path}:{model_path}:ro"]
    if compile_cache_dir:  # the served container's key directory: the probe's kernels are kept for the start
        from rocm_dspark.launch.compile_cache import docker_args

        argv += docker_args(compile_cache_dir)
    for name in PASSED_ENV:
        argv += ["-e", name]
    return argv + ["--entrypoint", "bash", image, "-c", script]


def run_in_image(
    argv: list[str], *, say=lambda line: None, timeout_s: float = 7200.0, grace_s: float = 30.0
) -> tuple[int, list[str]]:
    """Run probe_command's argv, each output line to `say`; (exit status, its last non-empty lines). Past
    `timeout_s` (counted while it still prints, too) it gets SIGTERM, which an attached `docker run` passes on to
    the container (--sig-proxy, docker's default), then SIGKILL after `grace_s`; the status is then -9."""
    tail: collections.deque = collections.deque(maxlen=20)
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        expired = threading.Event()

        def stop() -> None:
            expired.set()
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()

        timer = threading.Timer(timeout_s, stop)
        timer.daemon = True
        timer.start()
        try:
            for line in proc.stdout or ():
                say(line.rstrip())
                if line.strip():
                    tail.append(line.rstrip())
            code = proc.wait()
        finally:
            timer.cancel()
    return (-9 if expired.is_set() else code), list(tail)
