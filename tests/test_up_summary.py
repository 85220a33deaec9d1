"""`up`'s summary (rocm_dspark.up.summary) says which mono decode path the server runs, read from the server log
when the summary is made; the log lines are formatted from vLLM 0.33.0's format strings (tests/helpers/mono_lines.py)."""

from __future__ import annotations

from types import SimpleNamespace

from rocm_dspark.up.summary import build_summary, summary_lines
from tests.helpers.mono_lines import GFX950_WHOLE


def _run(start: dict) -> SimpleNamespace:
    outputs = {"choose": {"profile": "DeepSeek-V4.1-Flash/mi355x", "vllm_version": "0.33.0", "mode": "foreground"},
               "start": {"base_url": "http://127.0.0.1:8000", **start}}
    return SimpleNamespace(outputs=outputs, plan=SimpleNamespace(served_name="m"), loads=[],
                           state=SimpleNamespace(data={}))


def test_the_summary_names_the_mono_decode_path_from_the_server_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("\n".join(GFX950_WHOLE[:5]) + "\n")
    run = _run({"log": str(log)})
    assert "  mono decode   whole layer, not active yet (no decode step has taken it); draft layers: whole layer" \
        in summary_lines(build_summary(run))
    log.write_text("\n".join(GFX950_WHOLE) + "\n")  # validation's decode steps took the kernels meanwhile
    assert build_summary(run)["mono_decode"].startswith("whole layer, active (decode steps of <= 48 rows)")


def test_no_mono_line_no_summary_line(tmp_path):
    (tmp_path / "server.log").write_text("INFO ready\n")
    for start in ({"log": str(tmp_path / "server.log")}, {}):
        s = build_summary(_run(start))
        assert s["mono_decode"] is None and not any("mono decode" in ln for ln in summary_lines(s))


def test_a_flag_the_launcher_dropped_is_said_from_its_launch_state(tmp_path):
    (tmp_path / "block.log").write_text("INFO ready\n")  # a unit's per-start log: the restart's, without the flag
    why = "off: vLLM refused it (--monokernel needs tensor parallel size 2 or 4.)"  # what the launcher writes
    s = build_summary(_run({"log": str(tmp_path / "block.log"), "launch_state": {"mode": "block", "monokernel": why}}))
    assert s["mono_decode"] == why and f"  mono decode   {why}" in summary_lines(s)
