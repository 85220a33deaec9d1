"""Optional accuracy gate: GSM8K through lm-eval against the running server, with the recipe's floor.

Runs only with --gsm8k and only where lm-eval is installed. It must measure real block rejection: a
server in synthetic-acceptance benchmark mode is refused (its answers say nothing about accuracy).
Command as used by ATOM's V4.1 recipe (docs/deployment.md#gsm8k): 5-shot, local-completions.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from functools import partial

from rocm_dspark.errors import UsageError
from rocm_dspark.inputs import parse_json, read_text
from rocm_dspark.validate.result import FAIL, NOT_APPLICABLE, PASS, Outcome

GSM8K_TIMEOUT_S = 4 * 3600  # 1,319 questions x 5-shot at 64 concurrent requests stays well inside this
METRIC_KEYS = ("exact_match,strict-match", "exact_match,flexible-extract")


def lm_eval_command() -> list[str] | None:
    exe = shutil.which("lm_eval") or shutil.which("lm-eval")
    if exe:
        return [exe]
    if importlib.util.find_spec("lm_eval") is not None:
        return [sys.executable, "-m", "lm_eval"]
    return None


def build_argv(base: list[str], served_name: str, base_url: str, out_dir: str, limit: int | None) -> list[str]:
    model_args = (
        f"model={served_name},base_url={base_url}/v1/completions,num_concurrent=64,max_retries=3,"
        "tokenized_requests=False"
    )
    argv = [*base, "--model", "local-completions", "--model_args", model_args, "--tasks", "gsm8k", "--num_fewshot", "5"]
    return argv + ["--output_path", out_dir] + (["--limit", str(limit)] if limit else [])


def read_score(out_dir: str) -> dict:
    """{score, stderr, metric}: GSM8K exact match from the results*.json lm-eval wrote (strict match preferred)."""
    files = sorted(glob.glob(os.path.join(out_dir, "**", "results*.json"), recursive=True))
    if not files:
        raise ValueError(f"lm-eval wrote no results*.json under {out_dir}")
    results = parse_json(read_text(files[-1], "lm-eval's result"), f"lm-eval's result {files[-1]}")["results"]["gsm8k"]
    for key in METRIC_KEYS:
        if key in results:
            name, _, flt = key.partition(",")
            se = results.get(f"{name}_stderr,{flt}")
            return {"score": float(results[key]), "stderr": None if se in (None, "N/A") else float(se), "metric": key}
    raise ValueError(f"no exact_match metric in lm-eval's gsm8k results: {sorted(results)}")


class LmEvalFailed(RuntimeError):
    """lm-eval gave no score: the reason, and the run's evidence."""

    def __init__(self, reason: str, evidence: dict):
        super().__init__(reason)
        self.evidence = evidence


def run(base: list[str], served_name: str, base_url: str, limit: int | None, out_dir: str) -> tuple[dict, dict]:
    """GSM8K through lm-eval (`base`: lm_eval_command()) against the server: (read_score's result, evidence)."""
    argv = build_argv(base, served_name, base_url, out_dir, limit)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=GSM8K_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise LmEvalFailed(f"lm-eval did not finish within {GSM8K_TIMEOUT_S} s", {"argv": argv}) from None
    evidence = {"argv": argv, "exit": proc.returncode, "stderr_tail": proc.stderr[-2000:]}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise LmEvalFailed(f"lm-eval exited {proc.returncode}: {last}", evidence)
    try:
        return read_score(out_dir), evidence
    except (ValueError, KeyError, TypeError, OSError, UsageError) as exc:
        raise LmEvalFailed(f"cannot read lm-eval's result: {exc}", evidence) from None


def gsm8k(ctx) -> Outcome:
    """optional (--gsm8k): GSM8K 5-shot through lm-eval with block rejection, against validation.gsm8k_min."""
    if not ctx.options.gsm8k:
        return Outcome(NOT_APPLICABLE, "not requested (pass --gsm8k; needs lm-eval and the GSM8K data set)")
    spec = ctx.plan.speculative_config or {}
    if ctx.target.recipe_model and spec.get("rejection_sample_method") == "synthetic":
        return Outcome(
            FAIL,
            "the plan uses synthetic acceptance (a benchmark knob): GSM8K must run with block "
            "rejection; relaunch without --benchmark-synthetic",
        )
    base = lm_eval_command()
    if base is None:
        return Outcome(NOT_APPLICABLE, "lm-eval is not installed here (pip install 'lm-eval[api]')")
    floor = (ctx.model.validation or {}).get("gsm8k_min") if ctx.target.recipe_model else None
    with tempfile.TemporaryDirectory(prefix="rocm-dspark-gsm8k-") as out_dir:
        try:
            result, evidence = run(base, ctx.target.served_name, ctx.target.base_url, ctx.options.gsm8k_limit, out_dir)
        except LmEvalFailed as exc:
            return Outcome(FAIL, str(exc), threshold=floor, evidence=exc.evidence)
    score, metric = result["score"], result["metric"]
    out = partial(Outcome, value=score, threshold=floor, evidence={**evidence, "metric": metric})
    if floor is not None and score < floor:
        return out(FAIL, f"GSM8K {score:.4f} ({metric}) is below the floor {floor}")
    return out(PASS, f"GSM8K {score:.4f} ({metric})" + ("" if floor is not None else " (no floor for this model)"))
