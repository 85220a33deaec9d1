"""The acceptance run's pieces on CPU (rocm_dspark/validate/av_acceptance.py); the run itself needs an MI300-class host.

Real: the plan's commands (the resolver), the re-scoring judge (probe.rescore) on vLLM's prompt_logprobs format,
the verdict and the report. Not run here: the three servers and lm-eval (no GPU, no checkpoint).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rocm_dspark.probe import rescore
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.selection import build_selection
from rocm_dspark.validate import av_acceptance as acceptance

# lm-eval's results["gsm8k"] layout (metric,filter keys and their _stderr twins), values made up.
LM_EVAL_GSM8K = {"alias": "gsm8k", "exact_match,strict-match": 0.9462, "exact_match_stderr,strict-match": 0.0062,
                 "exact_match,flexible-extract": 0.9477, "exact_match_stderr,flexible-extract": 0.0061}


def _spec(argv):
    i = argv.index("--speculative-config")
    return json.loads(argv[i + 1])


def test_the_three_arms_are_the_plans_commands():
    catalog = load_catalog()
    arms = acceptance.arms(catalog, build_selection({"model": "V4.1-Flash", "concurrency": 16}, catalog))
    plan = arms.pop("_plan")
    assert plan["k"] == 5
    assert not any("speculative" in t or "dspark" in t for t in arms["nospec"]["argv"])
    assert _spec(arms["block"]["argv"])["enable_adaptive_verification"] is False
    assert _spec(arms["adaptive"]["argv"])["enable_adaptive_verification"] is True
    # Only the speculative config differs between the arms.
    assert acceptance.without_speculation(arms["adaptive"]["argv"]) == arms["nospec"]["argv"]


@pytest.mark.parametrize("argv", [["vllm", "serve", "m", "--speculative-config", "{}", "--port", "1"],
                                  ["vllm", "serve", "m", "-sc", "{}", "--port", "1"],
                                  ["vllm", "serve", "m", "--speculative-config={}", "--port", "1"],
                                  ["vllm", "serve", "m", "--speculative-config.method=ngram", "--port", "1"]])
def test_without_speculation_drops_every_spelling(argv):
    assert acceptance.without_speculation(argv) == ["vllm", "serve", "m", "--port", "1"]


def test_prompts_are_distinct_at_any_concurrency():
    for c in (4, 8, 16, 64):
        assert len(set(acceptance.prompts_for(c))) == c


def test_gsm8k_score_and_stderr_from_lm_eval_results(tmp_path):
    from rocm_dspark.validate.gsm8k import read_score

    with pytest.raises(ValueError, match="wrote no results"):
        read_score(str(tmp_path))
    (tmp_path / "org__m").mkdir()
    result = tmp_path / "org__m" / "results_2026-12-01T12-00-00.json"   # where lm-eval's --output_path puts it
    result.write_text(json.dumps({"results": {"gsm8k": LM_EVAL_GSM8K}}))
    assert read_score(str(tmp_path)) == {"score": 0.9462, "stderr": 0.0062, "metric": "exact_match,strict-match"}
    result.write_text(json.dumps({"results": {"gsm8k": {"alias": "gsm8k"}}}))
    with pytest.raises(ValueError, match="no exact_match metric"):
        read_score(str(tmp_path))


def _arm(violations=0, trimmed=True, score=0.95, stderr=0.006, k=5):
    per = [{"prompt": f"p{i}", "tokens": 64, "near_ties": 0, "violations": violations if i == 0 else 0,
            "first_violations": [{"index": 0, "emitted": 1, "rank": 3, "reference": 2, "gap_nats": 1.0}] if violations and i == 0 else [],
            "drafts": {"num_spec_steps": 10, "num_draft_tokens": 50 - (5 if trimmed else 0), "num_accepted_draft_tokens": 30}}
           for i in range(16)]
    return {"rescore": rescore.summarize(per, concurrency=16, k=k, reference=acceptance.REFERENCE),
            "gsm8k": {"score": score, "stderr": stderr}}


def test_verdict_accepts_only_lossless_trimmed_runs():
    good = {"nospec": _arm(k=None), "block": _arm(trimmed=False), "adaptive": _arm(score=0.9515)}
    assert acceptance.verdict(good)["accepted"] is True
    bad_tokens = {**good, "adaptive": _arm(violations=3)}
    v = acceptance.verdict(bad_tokens)
    assert not v["accepted"] and "adaptive: 3 of 1024 emitted tokens are not the reference argmax" in v["text"]
    never_trimmed = {**good, "adaptive": _arm(trimmed=False)}
    assert "AV never trimmed" in acceptance.verdict(never_trimmed)["text"]
    accuracy = {**good, "adaptive": _arm(score=0.90)}
    assert "adaptive: GSM8K 0.9000 differs from nospec 0.9500 by more than 0.0170" in acceptance.verdict(accuracy)["text"]
    missing = {**good, "block": {"error": "ready timeout"}}
    assert "block: not re-scored (ready timeout)" in acceptance.verdict(missing)["text"]
    # Only the nospec arm's server is the reference (vllm#53488), and the verdict says so.
    own = {**good, "adaptive": {**_arm(), "rescore": {**_arm()["rescore"], "reference": {"route": "eager-padded"}}}}
    assert "adaptive: re-scored against eager-padded, not the nospec arm" in acceptance.verdict(own)["text"]
    assert acceptance.verdict(good)["text"].endswith(f"({acceptance.REFERENCE_TEXT})")


def test_every_arm_is_judged_on_the_nospec_server_so_a_53488_reference_fails_none():
    """The spec arms' own prompt logprobs are corrupted (vllm#53488 stand-in); the nospec server's are right."""
    from tests.helpers.rescore_standin import StandIn

    seen = []

    def run(name, arm, *, generated, concurrency, k):
        seen.append(name)
        with StandIn(limit=None if name == "nospec" else 4096) as client:
            generated[name] = rescore.generate(client, "m", prompts=acceptance.prompts_for(concurrency))
            if name != "nospec":
                return {"argv": arm["argv"], "gsm8k": {"score": 0.95, "stderr": 0.006}}
            return {"argv": arm["argv"], "gsm8k": {"score": 0.95, "stderr": 0.006},
                    "rescored": acceptance.judge_all(generated, client, "m", concurrency=concurrency, k=k)}

    commands = {name: {"argv": [name]} for name in acceptance.ARMS}
    results = acceptance.run_arms(commands, run=run, concurrency=8, k=3)
    assert seen == ["block", "adaptive", "nospec"] and list(results) == list(acceptance.ARMS)
    for name in acceptance.ARMS:
        rs = results[name]["rescore"]
        assert rs["proven"] and rs["violations"] == 0 and rs["reference"]["route"] == "nospec-server", name
    # Without the nospec arm there is no reference, and no arm is called wrong for it.
    def broken(name, arm, *, generated, concurrency, k):
        return {"argv": arm["argv"], "error": "ready timeout"} if name == "nospec" else run(name, arm, generated=generated, concurrency=concurrency, k=k)

    results = acceptance.run_arms(commands, run=broken, concurrency=8, k=3)
    assert results["block"]["error"] == "no reference: the nospec arm did not re-score (ready timeout)"
    assert "block: not re-scored (no reference" in acceptance.verdict(results)["text"]


def test_report_and_recipe_evidence():
    results = {"nospec": _arm(k=None), "block": _arm(trimmed=False), "adaptive": _arm()}
    report = {"plan": {"profile": "p", "gpu": "mi300x", "vllm_version": "0.32.0", "image": "img", "k": 5},
              "concurrency": 16, "finished_at": "2026-12-01T12:00:00Z", "arms": results,
              "verdict": acceptance.verdict(results)}
    ev = acceptance.recipe_evidence(report)["evidence"]
    assert ev["accepted"] and ev["violations"] == {"nospec": 0, "block": 0, "adaptive": 0}
    assert ev["tokens_rescored"]["adaptive"] == 1024 and ev["date"] == "2026-12-01"
    md = acceptance.markdown(report)
    assert "| adaptive | 1024 | 0 | 0 | True | 0.9500 (0.006) |" in md


def test_the_command_dry_run_and_bad_usage(tmp_path):
    r = subprocess.run([sys.executable, "validation/run_av_acceptance.py", "--dry-run", "--report", str(tmp_path / "r")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [ln.split(":")[0] for ln in r.stdout.splitlines()] == [*acceptance.RUN_ORDER, "reference"]
    assert not (tmp_path / "r").exists()
    r = subprocess.run([sys.executable, "validation/run_av_acceptance.py", "--concurrency", "2", "--report", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "at least 4" in r.stderr


def test_an_unknown_model_or_gpu_is_one_line(tmp_path, capsys):
    for flag, name, words in (("--model", "V4.2-Flash", "unknown model 'V4.2-Flash'"), ("--gpu", "mi999", "unknown GPU")):
        assert acceptance.main([flag, name, "--dry-run", "--report", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"rocm-dspark acceptance: {words}") and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


# --- the re-scoring judge on vLLM's prompt_logprobs format ({token id: {logprob, rank, decoded_token}}) ----------

def _lp(*pairs):
    return {str(t): {"logprob": lp, "rank": r, "decoded_token": "x"} for t, lp, r in pairs}


def test_judge_counts_argmax_near_ties_and_violations():
    prompt_logprobs = [None, _lp((5, -0.1, 1)),                     # the prompt's second token (not judged)
                       _lp((7, -0.2, 1)),                           # emitted 7: the argmax
                       _lp((9, -0.70, 2), (8, -0.69, 1)),           # emitted 9: 0.01 nats below the top: near-tie
                       _lp((4, -3.0, 5), (2, -0.1, 1))]             # emitted 4: 2.9 nats below: a violation
    got = rescore.judge_tokens([7, 9, 4], 2, prompt_logprobs)
    assert (got["tokens"], got["near_ties"], got["violations"]) == (3, 1, 1)
    assert got["first_violations"] == [{"index": 2, "emitted": 4, "rank": 5, "reference": 2, "gap_nats": 2.9}]
    with pytest.raises(ValueError, match="no prompt logprobs at position 4"):
        rescore.judge_tokens([7, 9, 4], 2, prompt_logprobs[:4])


def test_too_little_is_not_proof():
    one = [{"prompt": "p", "tokens": rescore.MIN_TOKENS, "near_ties": 0, "violations": 0, "first_violations": [],
            "drafts": None}]
    got = rescore.summarize(one, concurrency=1, k=5, reference=acceptance.REFERENCE)
    assert got["proven"] is False and "too little re-scored" in got["why"]
