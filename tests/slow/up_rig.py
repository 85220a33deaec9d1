"""Shared by the real `up` runs (tests/slow/test_up_loads_real.py, tests/slow/test_up_refuted_real.py): two files,
so that the two runs, each several minutes, go to different xdist workers (`--dist loadfile`)."""

from __future__ import annotations

import json
import os
import subprocess

from rocm_dspark.runtime.process import group_members, is_alive


def flat(text: str) -> str:
    """Wrapped output (rocm_dspark/textwidth.py) folded back, blanks collapsed; a wrapped comment's `#` marks
    (the dry run's prose, rocm_dspark/runtime/actions.py) dropped with the line break."""
    return " ".join(w for w in text.split() if w != "#")


def cli(vllm_venv, *args):
    return [str(vllm_venv / "bin" / "python"), "-m", "rocm_dspark", *args]


def wrapper(tmp_path, vllm_venv):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "vllm-execs.log"
    w = bindir / "vllm"
    w.write_text(f"#!/bin/sh\necho \"$(date +%s.%N) $*\" >> {log}\nexec {vllm_venv / 'bin' / 'vllm'} \"$@\"\n")
    w.chmod(0o755)
    return w, log


def execs(log) -> list[str]:
    try:
        # "<time> serve ...": a vLLM start; validate's sweep also execs `vllm bench serve`, which loads no model
        return [ln for ln in log.read_text().splitlines() if ln.split()[1:2] == ["serve"]]
    except FileNotFoundError:
        return []


def env(tmp_path, **extra):
    return {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "TRANSFORMERS_OFFLINE": "1", **extra}


def up_args(vllm_venv, tiny_model, wrapper, state_dir, port, *extra):
    return cli(vllm_venv, "up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--target", "local-cpu",
                "--model-path", str(tiny_model), "--port", str(port), "--state-dir", str(state_dir),
                "--vllm-bin", str(wrapper), "--concurrency", "4", "--request-timeout", "120",
                "--ready-timeout", "300", *extra)


def serving(port: int) -> list[int]:
    """Processes whose command line serves on `port` (vLLM's API server and engine, the launcher)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if str(port).encode() in cmd and is_alive(int(pid)):
            found.append(int(pid))
    return found


def down(vllm_venv, state_dir, port, ready_port: int | None = None):
    """`down` stops the service (nothing left serving the port) and keeps every record; `status` says stopped.
    With `ready_port` (up --ready-port), it first says it stopped the readiness server there."""
    up_dir = state_dir / "up"
    d = subprocess.run(cli(vllm_venv, "down", "--state-dir", str(state_dir)), capture_output=True, text=True,
                       timeout=180)
    state = json.loads((up_dir / "up-state.json").read_text())
    pid = (state.get("service") or {}).get("pid")
    assert d.returncode == 0, d.stdout + d.stderr
    assert pid is None or (not is_alive(pid) and not group_members(pid))
    assert not serving(port), "down left a process serving the port"
    if state["steps"].get("validate", {}).get("status") != "done":
        return  # the test failed before validate: nothing more to check
    lines = d.stdout.splitlines()
    if ready_port is not None:
        first = lines.pop(0) if lines else ""
        assert first.startswith("stopped the readiness server (pid ") and \
            first.endswith(f"http://127.0.0.1:{ready_port}/ready)"), d.stdout + d.stderr
    assert lines and lines[0].startswith("stopped pid "), d.stdout + d.stderr
    assert (up_dir / "summary.json").exists() and list((up_dir / "reports").iterdir())  # records kept
    st = subprocess.run(cli(vllm_venv, "status", "--state-dir", str(state_dir)), capture_output=True, text=True,
                        timeout=120)
    assert "service: stopped" in st.stdout, st.stdout + st.stderr


def check_summary(up_dir, port: int, k: int) -> dict:
    """The summary `up` wrote, against the validate report it read (an independent file)."""
    summary = json.loads((up_dir / "summary.json").read_text())
    assert summary["validation"] == "pass" and summary["endpoint"] == f"http://127.0.0.1:{port}"
    assert summary["counts_for_gate"] is False and "not valid for gating" in summary["note"]
    assert summary["build"]["digest"] is None and "local-cpu" in summary["build"]["digest_note"]
    assert 1.0 <= summary["acceptance_length"] <= k + 1  # ngram K=k accepts at most k drafts and the bonus token
    assert [lv["concurrency"] for lv in summary["throughput_tok_s"]] == [4]  # validate --quick at --concurrency
    assert all(lv["output_tok_s"] > 0 for lv in summary["throughput_tok_s"])
    reports = os.listdir(up_dir / "reports")
    assert len(reports) == 1
    report = json.loads((up_dir / "reports" / reports[0] / "report.json").read_text())
    acc = next(c for c in report["checks"] if c["name"] == "spec_decode.acceptance")
    assert acc["value"] == summary["acceptance_length"]
    assert [lv["output_throughput_tok_s"] for lv in report["measurements"]["sweep"]] == \
        [lv["output_tok_s"] for lv in summary["throughput_tok_s"]]
    return summary
