"""The local-cpu target's container pieces (rocm_dspark/up/target.py, rocm_dspark/images/wheel.py): the CPU image's docker flags reach the
generated launcher, the serving argv installs the mounted wheel then execs vLLM, and the docker-info prerequisite
is one line with a fix when no daemon answers (run against the real docker client where one is installed).
The real daemon, registry and image: tests/slow/test_container_real.py."""

import os
import shutil
import subprocess

import pytest

from rocm_dspark.images import wheel
from rocm_dspark.launch.launchers import write_launchers
from rocm_dspark.up import target
from rocm_dspark.usecase.launch_plan import plan_from_options
from rocm_dspark.validate import start_checks


def test_serving_argv_installs_the_wheel_then_execs_vllm(tmp_path):
    argv = target.serve_argv(["vllm", "serve", "/m", "--port", "1"])
    assert argv[:2] == ("bash", "-c") and argv[3:] == (target.SERVE_ARGV0, "vllm", "serve", "/m", "--port", "1")
    # The script, run by a real bash with stand-in paths: pip's line is what it would run, then exec "$@".
    script = argv[2].replace("python3 -m pip install", "echo pip install")
    out = subprocess.run(["bash", "-c", script, *argv[3:4], "echo", "served"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.splitlines() == [
        f"pip install -q --no-deps --no-index --target {wheel.INSTALL_DIR} {wheel.MOUNT}/*.whl", "served"]


def test_the_launcher_gets_the_cpu_flags_and_no_gpu_devices(tmp_path):
    plan = plan_from_options({"model": "V4.1-Flash", "gpu": "mi300x", "state_dir": str(tmp_path / "s"),
                              "image": "127.0.0.1:5000/rocm-dspark/vllm-cpu-test:0.32.0"})
    (tmp_path / "out").mkdir()
    (tmp_path / "gpu").mkdir()
    files = write_launchers(plan, tmp_path / "out", container=True, name="cpu-test",
                            docker_run_flags=target.cpu_run_flags(tmp_path / "wheel"))
    text = files.launcher.read_text()
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("CMD=(docker run "))
    assert "--device" not in line and "--ipc=host" in line and "--network=host" in line
    assert f"{tmp_path / 'wheel'}:{wheel.MOUNT}:ro" in line and f"PYTHONPATH={wheel.INSTALL_DIR}" in line
    gpu = write_launchers(plan, tmp_path / "gpu", container=True, name="gpu-test").launcher.read_text()
    assert "--device=/dev/kfd" in next(ln for ln in gpu.splitlines() if ln.strip().startswith("CMD=(docker run "))


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client installed")
def test_no_daemon_is_one_line(tmp_path):
    env_before = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = f"unix://{tmp_path}/no.sock"
    try:
        got = start_checks.daemon("docker", "container", timeout_s=30)
    finally:
        if env_before is None:
            del os.environ["DOCKER_HOST"]
        else:
            os.environ["DOCKER_HOST"] = env_before
    assert got.status == "fail" and "\n" not in got.message and str(tmp_path) in got.message, got
    assert got.fix.startswith("start it (sudo systemctl start docker)")
