"""`rocm-dspark up` on a REAL vLLM refuted by a planted failing reference (issue 32: 3 loads, block served), and
`up`'s resume, status and down; see tests/slow/test_up_loads_real.py for the setting (its own file so that the
two real `up` runs go to different xdist workers)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time

import pytest

from rocm_dspark.runtime.process import descendants, group_members, is_alive
from tests.helpers import free_port
from tests.slow import up_rig as rig

pytestmark = pytest.mark.slow


SECRET = "hf_PLANTEDupRealRun0d9e"  # issue 22: must reach vLLM through the 0600 env file, and no other file


def _interrupt_while_starting(up, env, up_dir, port) -> str:
    """Step 1: SIGINT (what Ctrl-C sends) once `up` printed that the engine is starting; returns the output."""
    # SIGINT back to its default in `up`: a suite started in the background (`(cmd &)`) hands it on ignored
    proc = subprocess.Popen(up, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen, server_pid, tree = [], None, set()
    try:
        for line in proc.stdout:
            seen.append(line)
            if server_pid is None and "start (block): " in line and (
                    "initialising the engine" in line or "loading weights" in line or "sizing the KV cache" in line):
                server_pid = json.loads((up_dir / "up-state.json").read_text())["service"]["pid"]
                tree = set(descendants(server_pid)) | {server_pid}
                os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = "".join(seen)
    assert server_pid, "up never showed a start-up phase:\n" + out[-3000:]
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted in step start; stopped the server this run started" in rig.flat(out)
    assert not [p for p in tree | set(group_members(server_pid)) if is_alive(p)], "Ctrl-C left vLLM running"
    assert not rig.serving(port), "Ctrl-C left a process serving the port"
    state = json.loads((up_dir / "up-state.json").read_text())
    assert [state["steps"][s]["status"] for s in ("detect", "choose", "prereq", "image", "launchers", "probe",
                                                  "start")] == ["done", "done", "done", "skipped", "done", "done",
                                                                "interrupted"]
    return out


def test_up_refuted_by_a_planted_failing_reference_costs_three_loads_and_resumes_after_ctrl_c(tiny_model, vllm_venv,
                                                                                               tmp_path):
    state_dir, port = tmp_path / "state", free_port()
    up_dir = state_dir / "up"
    wrapper, log = rig.wrapper(tmp_path, vllm_venv)
    planted = {"prompt": "Say the word banana.", "expect": "PLANTED-NEVER-ANSWERED-7f3a", "max_tokens": 8}
    env = rig.env(tmp_path, ROCM_DSPARK_UP_LOCAL_CHECK=json.dumps(planted))
    up = rig.up_args(vllm_venv, tiny_model, wrapper, state_dir, port, "--env", f"HF_TOKEN={SECRET}",
                  "--env", f"ROCM_DSPARK_TEST_API_KEY={SECRET}-2")  # the default probe levels: static, kernel
    try:
        # 1. Interrupted while vLLM starts: one exec of the wrapper, stopped.
        out1 = _interrupt_while_starting(up, env, up_dir, port)
        assert len(rig.execs(log)) == 1

        # 2. Resume: steps 2-6 are not redone, the start is; everything after runs for real.
        t0 = time.monotonic()
        r = subprocess.run(up, capture_output=True, text=True, env=env, timeout=1800)
        out2 = r.stdout + r.stderr
        assert r.returncode == 0, out2[-6000:]
        for i, name in ((2, "choose the profile and build"), (3, "check prerequisites"),
                        (4, "pull the image and pin its digest"), (5, "write launchers"),
                        (6, "probe the levels that load no model (static, kernel)")):
            assert f"[ {i}/10] {name}: done " in rig.flat(out2) and "inputs unchanged" in out2
        assert "[ 7/10] start the service and wait until ready (always runs)" in rig.flat(out2)
        assert "start (block): server log " in rig.flat(out2) and ("weights loaded" in out2 or "engine ready" in out2)
        summary = rig.check_summary(up_dir, port, k=7)
        state = json.loads((up_dir / "up-state.json").read_text())
        execs = rig.execs(log)[1:]  # this run's
        print(f"\nup --concurrency 4, refuted, resumed: {len(execs)} vLLM starts in {time.monotonic() - t0:.0f} s; "
              f"loads: {[(ld['command'], ld['seconds']) for ld in summary['loads']]}")
        assert len(execs) == 3 == len(summary["loads"]), (execs, out2[-4000:])
        assert [ld["command"] for ld in summary["loads"]] == ["block", "adaptive", "block"]
        assert "model loads 3 this run" in rig.flat(out2)
        assert "rocm-dspark up: summary" in out2 and "mean acceptance length" in out2
        assert all(state["steps"][s]["status"] in ("done", "skipped") for s in state["steps"])
        prove = state["steps"]["prove"]["output"]
        assert prove["serving"] == "block" == state["service"]["command"]
        assert prove["decision"].startswith("refuted: the live level failed: deterministic check: asked "
                                            "'Say the word banana.', expected 'PLANTED-NEVER-ANSWERED-7f3a'")
        assert "ab" not in prove  # refuted before the adaptive arm: no A/B record
        assert '"num_speculative_tokens":7' in execs[2]
        # Probe: the levels that load no model (before any load) and the live level, in one record, none counting
        # for the gate on this CPU.
        record = json.loads(open(summary["probe"]["record"]).read())
        levels = {lv["name"]: lv for lv in record["levels"]}
        assert set(levels) == {"static", "kernel", "live"} and not levels["live"]["passed"]
        assert not any(lv["valid_for_gating"] for lv in levels.values())

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
        r3 = subprocess.run(up, capture_output=True, text=True, env=env, timeout=600)
        out3 = r3.stdout + r3.stderr
        assert r3.returncode == 0, out3[-3000:]
        # steps 2-6 and 8-9; 1, 7 (start: keeps the running service) and 10 always run
        assert out3.count("inputs unchanged") == 7 and "server log" not in out3
        assert "model loads 0 this run" in rig.flat(out3) and len(rig.execs(log)) == 4
        assert json.loads((up_dir / "up-state.json").read_text())["service"]["pid"] == pid

        # 4. status (then down, below).
        st = subprocess.run(rig.cli(vllm_venv, "status", "--state-dir", str(state_dir), "--json"), capture_output=True,
                            text=True, timeout=120)
        st = json.loads(st.stdout)
        assert st["service"]["running"] is True and st["service"]["health"] == 200
        assert [s["status"] for s in st["steps"]].count("done") == 9  # image: skipped (local-cpu pulls nothing)
        assert st["readiness"]["ready"] is True
    finally:
        rig.down(vllm_venv, state_dir, port)
