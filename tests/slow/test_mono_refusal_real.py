"""vLLM 0.33.0's own refusal of --monokernel, raised by its real code (mono_decode.py:384, through
tests/slow/mono_refusal_child.py: the wheel's Python over .venv-vllm, only the GPU's platform module stood in
for), is what the launcher and rocm_dspark.runtime.refusal match: the generated launcher, run through bash with
a stand-in vllm that prints that traceback, starts the same plan again without the flag. Not yet run on
MI300-class hardware, where vLLM raises it for real."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rocm_dspark.launch import launch_facts
from tests.helpers.launcher_rig import Rig, free_port, make_plan, start_ready, stop_and_check

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
OVERLAY_033 = Path(os.environ.get("ROCM_DSPARK_VLLM033_DIR") or REPO / ".cache" / "vllm-0.33.0")
CHILD = Path(__file__).with_name("mono_refusal_child.py")


def vllm_refusal(vllm_venv: Path, tp: int) -> str:
    if not (OVERLAY_033 / "vllm" / "_version.py").exists():
        pytest.skip(f"no vLLM 0.33.0 overlay at {OVERLAY_033}: run scripts/setup_vllm_033_overlay.sh")
    env = {**os.environ, "PYTHONPATH": str(OVERLAY_033), "VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run([str(vllm_venv / "bin" / "python"), str(CHILD), str(tp)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("tp, why", [(8, "needs tensor parallel size 2 or 4"),
                                     (4, "needs FlyDSL and AITER's FlyDSL helpers (No module named 'flydsl')")])
def test_vllms_real_refusal_restarts_the_plan_without_the_flag(vllm_venv, tmp_path, tp, why):
    traceback = vllm_refusal(vllm_venv, tp)
    assert 'mono_decode.py", line 384, in _create' in traceback
    assert launch_facts.find_mono_refusal(traceback) == f"--monokernel {why}."
    rig = Rig(tmp_path)
    port = free_port()
    plan = make_plan(port, adaptive=False, extra=("--monokernel",))
    proc = start_ready(rig, rig.write(plan), port, STANDIN_REFUSE_MONO="1", STANDIN_MONO_TRACEBACK=traceback)
    st = rig.state()
    assert [(a["outcome"], a["refusal"]) for a in st["attempts"]] == [("refused_monokernel", f"--monokernel {why}."),
                                                                      ("ready", None)]
    assert b"--monokernel" not in rig.records()[-1]["argv"]
    stop_and_check(proc, rig)
