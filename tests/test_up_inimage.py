"""The in-image probe of `up` (rocm_dspark/up/steps.py over rocm_dspark/probe/inimage.py) for the local-cpu target in container mode: the probe
argv it runs inside the image is one the real `rocm-dspark probe` accepts, and a probe that exits with a usage
error stops the step with one line instead of passing as "not proven". Found on the real daemon and image
(tests/slow/test_container_real.py): with the no-model levels only, `up` passed --server-json and the probe in the
image exited 2 ("--server-json only applies to the live level"), which `up` took for a probe that proved nothing.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.images import pull as image_mod
from rocm_dspark.images import wheel
from rocm_dspark.up import steps
from rocm_dspark.up.runner import UpOptions, UpRun
from rocm_dspark.service.state import UpState, up_dir
from rocm_dspark.up.steps_common import StepFailed


class Display:
    def __init__(self):
        self.lines = []

    def say(self, line):
        self.lines.append(line)


def _run(tmp_path, levels) -> UpRun:
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    opts = UpOptions(selection={"model": "V4.1-Flash", "gpu": "mi300x", "state_dir": str(tmp_path / "state"),
                                "model_path": str(tmp_path / "model"), "image": "127.0.0.1:5000/r/vllm-cpu:0.32.0"},
                     target="local-cpu", mode="container", probe_levels=levels, yes=True)
    return UpRun(opts, Display(), UpState.load(up_dir(opts.state_dir)))


def test_the_no_model_levels_get_no_server_json_and_the_real_probe_cli_accepts_the_argv(tmp_path, monkeypatch):
    run = _run(tmp_path, ("static",))
    argv = steps.in_image_argv(run, "127.0.0.1:5000/r/vllm-cpu:0.32.0", Path("w.whl"), check=False)
    probe = shlex.split(argv[-1].rsplit("; ", 1)[1])  # the script's last command: the probe
    assert probe[:4] == ["python3", "-m", "rocm_dspark", "probe"] and "--server-json" not in probe
    assert probe[-4:] == ["--state-dir", str(run.options.state_dir), "--levels", "static"]
    # The real probe CLI accepts it: it gets as far as running the levels (stopped there: the levels themselves
    # are tests/test_probe*.py's); a usage error would be exit 2 before that.
    import rocm_dspark.probe.run as probe_run

    class Ran(Exception):
        pass

    def ran(*a, **k):
        raise Ran(k.get("levels"))

    monkeypatch.setattr(probe_run, "run_probe", ran)
    got = CliRunner().invoke(cli, probe[3:])
    assert isinstance(got.exception, Ran) and got.exception.args == (("static",),), got.output


def test_a_probe_that_exits_2_in_the_image_fails_the_step_with_its_last_line(tmp_path, monkeypatch):
    # A stand-in for the container runtime that prints what the probe printed on the real image and exits 2.
    tool = tmp_path / "docker"
    tool.write_text("#!/bin/sh\necho 'rocm-dspark: error: --server-json only applies to the live level' >&2\nexit 2\n")
    tool.chmod(0o755)
    run = _run(tmp_path, ("static",))
    monkeypatch.setattr(image_mod, "runtime", lambda: str(tool))
    monkeypatch.setattr(wheel, "build_wheel", lambda out: out / "rocm_dspark-0.1.0-py3-none-any.whl")
    run.outputs["image"] = {"pinned": "127.0.0.1:5000/r/vllm-cpu@sha256:" + "a" * 64}
    with pytest.raises(StepFailed) as got:
        steps.probe_in_image(run)
    assert "\n" not in got.value.message and got.value.message.endswith(
        "exited 2: rocm-dspark: error: --server-json only applies to the live level"), got.value.message


def test_an_in_image_probe_that_keeps_printing_is_still_stopped_at_its_deadline(tmp_path):
    """The deadline counts while the probe prints too (it was applied only once its output ended): a probe that
    prints for longer is stopped (SIGTERM, then SIGKILL past the grace) and reported as -9 with its last lines."""
    import time

    from rocm_dspark.probe.inimage import run_in_image

    script = "trap '' TERM; for i in $(seq 1 200); do echo line $i; sleep 0.05; done"  # 10 s if never stopped
    t0 = time.monotonic()
    code, tail = run_in_image(["bash", "-c", script], timeout_s=0.5, grace_s=0.3)
    assert code == -9 and tail and tail[-1].startswith("line ")
    assert time.monotonic() - t0 < 5


def test_the_dry_run_installs_the_wheel_the_real_build_writes(tmp_path, monkeypatch):
    """The dry run's `docker run` names the wheel by the source tree's version, before any build; a real
    `pip wheel` (images/wheel.build_wheel, no registry) writes exactly that file."""
    run = _run(tmp_path, ("static",))
    actions = steps.probe_actions(run)
    predicted = wheel.wheel_path(run.dir / "wheel")
    assert predicted is not None and f"builds {predicted} with pip wheel" in actions[0].text
    assert f"/rocm-dspark-wheel/{predicted.name}" in actions[1].argv[-1]  # the install inside the image
    assert wheel.build_wheel(tmp_path / "built") == wheel.wheel_path(tmp_path / "built")

    # The step's real run starts the very argv the dry run printed (the image not yet pinned in both).
    class Started(Exception):
        pass

    def started(argv, say):
        raise Started(argv)

    from rocm_dspark.probe import inimage

    monkeypatch.setattr(wheel, "build_wheel", lambda out: wheel.wheel_path(out))
    monkeypatch.setattr(inimage, "run_in_image", started)
    with pytest.raises(Started) as got:
        steps.probe_in_image(run)
    assert tuple(got.value.args[0]) == actions[1].argv
