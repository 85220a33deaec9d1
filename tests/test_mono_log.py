"""The mono decode log reader (rocm_dspark.runtime.mono_log) on lines formatted from vLLM 0.33.0's own
`logger.info_once` format strings (vllm/models/deepseek_v41/amd/mono_decode.py, copied with their lines in tests/helpers/mono_lines.py),
in vLLM's log format (vllm/logger.py:28-32). No server runs: the lines are what `msg % args` gives, as logging
formats them; where the unpacked wheel is here, the copies are checked against it."""

from __future__ import annotations

import ast

import pytest

from rocm_dspark.runtime import mono_log
from tests.helpers.mono_lines import FORMATS, GFX950_WHOLE, START, WHEEL, line


@pytest.mark.skipif(not WHEEL.exists(), reason="the vllm 0.33.0 wheel is not unpacked (scripts/setup_vllm_033_overlay.sh)")
def test_the_format_strings_are_the_wheels():
    calls = {n.args[0].lineno: n.args[0].value for n in ast.walk(ast.parse(WHEEL.read_text()))
             if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "info_once"}
    assert {at: calls.get(at) for at in FORMATS} == FORMATS


@pytest.mark.parametrize("lines, path, active, rows, text", [
    # gfx950, fp8_ds_mla: the whole layer, before and after the first decode step that takes it
    (GFX950_WHOLE[:5], mono_log.WHOLE, False, None,
     "whole layer, not active yet (no decode step has taken it); draft layers: whole layer"),
    (GFX950_WHOLE, mono_log.WHOLE, True, 48,
     "whole layer, active (decode steps of <= 48 rows); draft layers: whole layer"),
    # an MXFP8 KV cache: the FFN launch only (mono_decode.py:457), gfx942's 42 rows
    ([line(468, "a fp8 KV cache"), line(439, 128, 3), line(763, 42)], mono_log.FFN, True, 42,
     "FFN launch, active (decode steps of <= 42 rows); not the whole layer: layers with a fp8 KV cache; "
     "draft layers: FFN launch"),
    # most layers whole, some with an indexer the kernels do not drive
    ([line(486), line(468, "a DeepseekV4Indexer"), line(694, "", 48)], mono_log.WHOLE, True, 48,
     "whole layer, active (decode steps of <= 48 rows); the FFN launch only for layers with a DeepseekV4Indexer"),
    # no layer takes it
    ([line(427, "sequence-parallel layer")], mono_log.OFF, False, None, "off: sequence-parallel layer"),
    ([line(486), line(464, "a draft layer with compressed keys")], mono_log.WHOLE, False, None,
     "whole layer, not active yet (no decode step has taken it); draft layers: off"),
])
def test_the_path_is_read_from_vllms_lines(lines, path, active, rows, text):
    got = mono_log.read("\n".join(lines) + "\n")
    assert (got.path, got.active, got.rows, got.text()) == (path, active, rows, text)


def test_vllms_refusal_and_the_launchers_restart_without_the_flag():
    refused = ('(Worker_TP0 pid=7) ERROR [multiproc_executor.py:1]     raise ValueError(f"--monokernel {why}.")\n'
               "(Worker_TP0 pid=7) ERROR [multiproc_executor.py:1] ValueError: --monokernel needs tensor parallel size 2 or 4.\n")
    assert mono_log.read(START + "\n" + refused).text() == "off: --monokernel needs tensor parallel size 2 or 4."
    restarted = (START + "\n" + refused + "rocm-dspark[svc]: starting the same plan without --monokernel: vLLM refused "
                 "it (--monokernel needs tensor parallel size 2 or 4.)\n" + START + "\nINFO ready\n")
    assert mono_log.read(restarted).text() == ("off: started without --monokernel: vLLM refused it (--monokernel needs "
                                               "tensor parallel size 2 or 4.)")
    # a later start that ran it again is read on its own
    assert mono_log.read(restarted + line(486) + "\n").path == mono_log.WHOLE


def test_a_log_without_mono_lines_says_nothing(tmp_path):
    assert mono_log.read("INFO non-default args: {'model': 'x'}\n" + START + "\n") is None
    assert mono_log.read_file(tmp_path / "absent.log") is None and mono_log.read_file(None) is None
    log = tmp_path / "server.log"
    log.write_text("\n".join(["INFO noise"] * 1000 + GFX950_WHOLE) + "\n")
    assert mono_log.read_file(log) == mono_log.read(log.read_text())
