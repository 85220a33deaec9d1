"""Packaging promises of rocm_dspark.attention: cheap import, CPU behaviour, benchmark skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env}, cwd=ROOT)


def test_import_does_not_load_torch_or_triton():
    proc = run_python("import sys, rocm_dspark.attention as a; a.__doc__; "
                      "print(sorted(m for m in ('torch', 'triton', 'numpy') if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_cpu_launch_works_after_triton_was_imported_in_compile_mode():
    """vLLM imports triton in compile mode first; CPU tensors must still run (interpreted) and be right."""
    code = (
        "import triton, triton.language\n"  # compile mode: TRITON_INTERPRET=0 below
        "from rocm_dspark.attention.kernel import sparse_swa_attention\n"
        "from rocm_dspark.attention.metadata import SwaMetadataBuffers, compute_swa_metadata\n"
        "from rocm_dspark.attention.reference import reference_sparse_swa\n"
        "from rocm_dspark.attention.cases import make_case\n"
        "c = make_case([2, 3], [20, 5], heads=8, window=16, block_size=16, kv_format='fp8_ds_mla', topk=8, sink=True)\n"
        "md = compute_swa_metadata(c.query_start_loc, c.seq_lens, c.block_table, c.slot_mapping,"
        " SwaMetadataBuffers.allocate(5, 'cpu'), **c.metadata_args())\n"
        "out = sparse_swa_attention(c.q, c.kv_cache, md, **c.attention_args())\n"
        "ref = reference_sparse_swa(c.q, c.kv_cache, c.query_start_loc, c.seq_lens, c.block_table, c.slot_mapping, **c.reference_args())\n"
        "print(float(((out.float() - ref).abs() - 1e-5 - 2**-7 * ref.abs()).max()) <= 0, triton.knobs.runtime.interpret)\n"
    )
    proc = run_python(code, TRITON_INTERPRET="0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "False"]  # right answer; the process stayed in compile mode


def test_benchmark_skips_cleanly_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the benchmark would run for real")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sparse_swa.py")], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "skipped: no GPU" in proc.stdout


def test_benchmark_smoke_run_exercises_the_script(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sparse_swa.py"), "--smoke", "--block-k", "16",
                           "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verify 2x3" in proc.stdout and "top-16 2x4" in proc.stdout
    import json

    rows = json.loads(out.read_text())
    assert all(r["correct"] for r in rows) and len(rows) == 2
