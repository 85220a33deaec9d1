"""The kernel compiles for gfx942, gfx950 and sm_90 on this CPU host (Triton lowers without a GPU).

The interpreter accepts code that the compiler rejects, so this is the check that the GPU
build exists at all. It also pins what the default tile compiles to: bf16 MFMA/MMA dot
instructions (never fp32 dots on a GPU) and no VGPR spills on AMD. These are compiler
statistics, not timings: the kernel is not yet run on MI300-class hardware.
Runs in a subprocess with TRITON_INTERPRET=0 (this test process uses the interpreter).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

VARIANTS = [
    ("gfx942", dict(kv_format="fp8_ds_mla", fnuz=True, topk=True)),  # MI300X/MI325X production variant
    ("gfx950", dict(kv_format="fp8_ds_mla", fnuz=False, topk=True)),  # MI350X/MI355X
    ("sm_90", dict(kv_format="fp8_ds_mla", fnuz=False, topk=True)),  # H200 cross-check
    ("gfx942", dict(kv_format="bf16", fnuz=False, topk=False)),
]


@pytest.fixture(scope="module")
def reports():
    code = (
        "import json, sys\n"
        "from rocm_dspark.attention.aot import compile_report\n"
        "variants = json.loads(sys.argv[1])\n"
        "print(json.dumps([compile_report(arch, **kw) for arch, kw in variants]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(VARIANTS)], capture_output=True, text=True,
                          timeout=1200, env={**os.environ, "TRITON_INTERPRET": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("index", range(len(VARIANTS)), ids=[f"{a}-{kw['kv_format']}" for a, kw in VARIANTS])
def test_compiles_with_bf16_dots_and_no_vgpr_spills(reports, index):
    report = reports[index]
    assert report["dot_instructions"], "no matrix instructions: the dots were not lowered to MFMA/MMA"
    assert all("bf16" in op for op in report["dot_instructions"]), report["dot_instructions"]
    if report["arch"].startswith("gfx"):
        assert report["vgpr_spills"] == 0, report
        assert report["lds_bytes"] <= 64 * 1024, report  # fits gfx942's 64 KiB LDS


def test_compile_report_refuses_the_interpreter():
    code = (
        "from rocm_dspark.attention.aot import compile_report\n"
        "from rocm_dspark.errors import UsageError\n"
        "try:\n"
        "    compile_report('gfx942')\n"
        "except UsageError as e:\n"
        "    print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TRITON_INTERPRET=0" in proc.stdout
