"""The hardware acceptance run for adaptive verification (AV): three arms on one MI300-class host, one command.

    python -m rocm_dspark.validate.av_acceptance --model V4.1-Flash --concurrency 16 --report DIR [--gsm8k-limit N]
    (validation/run_av_acceptance.py is the same command; --dry-run prints the three commands and runs nothing)

Arms, each the plan's own launch started and stopped in turn on the plan's port (rocm_dspark.runtime.process):
  nospec    the block command without --speculative-config (no speculation: the accuracy reference)
  block     the plan's block-verification command (all K drafts verified)
  adaptive  the plan's command with enable_adaptive_verification on (fingerprint.adaptive_plan)
On each arm: `concurrency` greedy prompts at once (rocm_dspark.probe.rescore.generate) and GSM8K 5-shot through
lm-eval (validate/gsm8k.py's command); every arm's tokens are re-scored on the nospec arm's server, which runs
last (vllm#53488). docs/adaptive-verification.md, "The hardware acceptance run", says what the report holds and
when the verdict accepts AV (upstream's check for #52362).

vLLM runs from the Python this runs in: inside the image, with this toolkit's wheel installed (`up` does this
for the probe, rocm_dspark/probe/inimage.py), so a release that needs the plugin has it. Not yet run on
MI300-class hardware; on CPU its pieces are tested (tests/test_av_acceptance.py).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

from rocm_dspark.errors import UsageError
from rocm_dspark.probe import rescore
from rocm_dspark.probe.fingerprint import adaptive_plan
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.plan import Command
from rocm_dspark.recipe.selection import build_selection
from rocm_dspark.runtime.process import VllmServer
from rocm_dspark.validate import gsm8k

ARMS = ("nospec", "block", "adaptive")
RUN_ORDER = ("block", "adaptive", "nospec")  # the nospec server re-scores every arm's tokens: it runs last
REFERENCE = {
    "route": "nospec-server",
    "independent": True,
    "why": "the nospec arm's server (no --speculative-config: no drafter can reach its prompt logprobs, vllm#53488)",
}
REFERENCE_TEXT = (
    "every arm's tokens are re-scored against the nospec arm's server (no --speculative-config, vllm#53488)"
)


def without_speculation(argv) -> list[str]:
    """argv with its --speculative-config (any spelling) removed: the no-speculation arm."""
    return list(Command.from_words(argv).without("speculative_config"))


def arms(catalog, selection) -> dict:
    """{arm: {argv, env, host, port, served_name}} from the plan (resolved once, AV forced on for its arm)."""
    plan = adaptive_plan(catalog, selection)
    if not plan.adaptive_argv:
        raise ValueError(f"the plan ({plan.profile}, {plan.vllm_version}) has no adaptive command to accept")
    base = {"env": dict(plan.env), "host": plan.host, "port": plan.port, "served_name": plan.served_name}
    return {
        "nospec": {**base, "argv": without_speculation(plan.block_argv)},
        "block": {**base, "argv": list(plan.block_argv)},
        "adaptive": {**base, "argv": list(plan.adaptive_argv)},
        "_plan": {
            "profile": plan.profile,
            "gpu": plan.gpu,
            "vllm_version": plan.vllm_version,
            "image": plan.image,
            "k": (plan.speculative_config or {}).get("num_speculative_tokens"),
        },
    }


def prompts_for(concurrency: int) -> tuple[str, ...]:
    prompts = rescore.RESCORE_PROMPTS
    return tuple(
        prompts[i % len(prompts)] + (f" ({i // len(prompts)})" if i >= len(prompts) else "") for i in range(concurrency)
    )


def verdict(report_arms: dict) -> dict:
    """Accept AV only with zero violations on every arm, a trimmed adaptive arm, and GSM8K agreement."""
    problems = []
    for name in ARMS:
        arm = report_arms.get(name) or {}
        rs = arm.get("rescore")
        if not rs:
            problems.append(f"{name}: not re-scored ({arm.get('error', 'no result')})")
        elif (rs.get("reference") or {}).get("route") != "nospec-server":
            problems.append(f"{name}: re-scored against {(rs.get('reference') or {}).get('route')}, not the nospec arm")
        elif rs["violations"] or not rs["proven"]:
            problems.append(f"{name}: {rs['why']}")
    rs = (report_arms.get("adaptive") or {}).get("rescore") or {}
    if rs and rs.get("trimmed") is not True:
        problems.append(
            "adaptive: no request had fewer than K drafts verified in a step, so AV never trimmed at "
            "this concurrency (raise --concurrency)"
        )
    ref = (report_arms.get("nospec") or {}).get("gsm8k")
    for name in ("block", "adaptive"):
        got = (report_arms.get(name) or {}).get("gsm8k")
        if not ref or not got:
            problems.append(f"{name}: no GSM8K score to compare with nospec")
            continue
        if ref["stderr"] is None or got["stderr"] is None:
            problems.append(f"{name}: lm-eval reported no stderr, so GSM8K agreement cannot be judged")
            continue
        bound = 2 * math.sqrt(ref["stderr"] ** 2 + got["stderr"] ** 2)
        if abs(got["score"] - ref["score"]) > bound:
            problems.append(
                f"{name}: GSM8K {got['score']:.4f} differs from nospec {ref['score']:.4f} by more than "
                f"{bound:.4f} (2 combined stderr)"
            )
    return {
        "accepted": not problems,
        "problems": problems,
        "reference": REFERENCE_TEXT,
        "text": ("adaptive verification accepted on this host" if not problems else "; ".join(problems))
        + f" ({REFERENCE_TEXT})",
    }


def recipe_evidence(report: dict) -> dict:
    """What goes into recipes/ as evidence for this build and GPU (status stays a human decision)."""
    arms_ = report["arms"]
    return {
        "evidence": {
            "kind": "acceptance",
            "date": report["finished_at"][:10],
            "gpu": report["plan"]["gpu"],
            "vllm_version": report["plan"]["vllm_version"],
            "image": report["plan"]["image"],
            "concurrency": report["concurrency"],
            "accepted": report["verdict"]["accepted"],
            "tokens_rescored": {a: (arms_[a].get("rescore") or {}).get("tokens_checked") for a in ARMS},
            "violations": {a: (arms_[a].get("rescore") or {}).get("violations") for a in ARMS},
            "gsm8k": {a: (arms_[a].get("gsm8k") or {}).get("score") for a in ARMS},
            "reference": "nospec-server",
            "report": "acceptance.json",
        }
    }


def markdown(report: dict) -> str:
    lines = [
        f"# Adaptive verification acceptance: {report['plan']['profile']} ({report['plan']['vllm_version']})",
        "",
        f"concurrency {report['concurrency']}, K={report['plan']['k']}, finished {report['finished_at']}",
        "",
        "| arm | tokens re-scored | violations | near-ties | trimmed | GSM8K (stderr) |",
        "|---|---|---|---|---|---|",
    ]
    for name in ARMS:
        arm = report["arms"].get(name) or {}
        rs, g = arm.get("rescore") or {}, arm.get("gsm8k") or {}
        gs = f"{g['score']:.4f} ({g['stderr']})" if g else arm.get("error", "-")
        lines.append(
            f"| {name} | {rs.get('tokens_checked', '-')} | {rs.get('violations', '-')} | "
            f"{rs.get('near_ties', '-')} | {rs.get('trimmed', '-')} | {gs} |"
        )
    lines += ["", f"reference: {REFERENCE_TEXT}.", "", f"**verdict**: {report['verdict']['text']}", ""]
    return "\n".join(lines)


def _run_gsm8k(served_name: str, base_url: str, limit: int | None, out_dir: Path) -> dict:
    base = gsm8k.lm_eval_command()
    if base is None:
        raise RuntimeError("lm-eval is not installed here (pip install 'lm-eval[api]')")
    out_dir.mkdir(parents=True, exist_ok=True)
    return gsm8k.run(base, served_name, base_url, limit, str(out_dir))[0]  # gsm8k.LmEvalFailed: a RuntimeError


def judge_all(generated: dict, client, model: str, *, concurrency: int, k) -> dict:
    """{arm: re-scoring summary}: each arm's generated tokens judged on the nospec server `client`."""
    return {
        name: rescore.judge(gen, client, model, REFERENCE, concurrency=concurrency, k=None if name == "nospec" else k)
        for name, gen in generated.items()
    }


def run_arm(
    name: str,
    arm: dict,
    *,
    concurrency: int,
    k,
    gsm8k_limit,
    report_dir: Path,
    ready_timeout_s: float,
    say,
    generated: dict,
) -> dict:
    """Start the arm, generate into `generated[name]`, and on nospec (last) re-score every arm's tokens there:
    its result then has `rescored`, {arm: summary}. GSM8K on every arm."""
    server = VllmServer(
        arm["argv"], arm["env"], host=arm["host"], port=arm["port"], log_path=report_dir / f"{name}.log"
    )
    say(f"{name}: starting (log {server.log_path})")
    server.start()
    out: dict = {"argv": arm["argv"]}
    try:
        ready = server.wait_ready(ready_timeout_s)
        if not ready.ready:
            return {**out, "error": ready.reason()}
        model = arm["served_name"] or server.client.models()[0]
        generated[name] = rescore.generate(server.client, model, prompts=prompts_for(concurrency))
        if name == "nospec":
            out["rescored"] = judge_all(generated, server.client, model, concurrency=concurrency, k=k)
            for arm_name, rs in out["rescored"].items():
                say(f"{arm_name}: re-scoring on the nospec server: {rs['why']}")
        try:
            out["gsm8k"] = _run_gsm8k(model, server.base_url, gsm8k_limit, report_dir / f"gsm8k-{name}")
            say(f"{name}: GSM8K {out['gsm8k']['score']:.4f} +- {out['gsm8k']['stderr']}")
        except (RuntimeError, OSError, ValueError, KeyError, TypeError, UsageError) as exc:
            out["error"] = f"GSM8K: {exc}"
    finally:
        server.stop()
    return out


def run_arms(commands: dict, *, run=run_arm, **kw) -> dict:
    """Every arm in RUN_ORDER; each arm's `rescore` from the nospec server, or why there is none."""
    generated: dict = {}
    results = {name: run(name, commands[name], generated=generated, **kw) for name in RUN_ORDER}
    rescored = results["nospec"].pop("rescored", None) or {}
    for name in ARMS:
        if name in rescored:
            results[name]["rescore"] = rescored[name]
        elif "error" not in results[name]:
            results[name]["error"] = f"no reference: the nospec arm did not re-score ({results['nospec'].get('error')})"
    return {name: results[name] for name in ARMS}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rocm_dspark.validate.av_acceptance", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="V4.1-Flash")
    p.add_argument("--gpu", default=None)
    p.add_argument("--concurrency", type=int, default=16, help="prompts in flight at once (AV trims above ~8)")
    p.add_argument("--gsm8k-limit", type=int, default=None, help="questions (default: all 1,319)")
    p.add_argument("--ready-timeout", type=float, default=3600.0)
    p.add_argument("--report", required=True, help="a new directory for acceptance.json/.md and the logs")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    if args.concurrency < 4:
        p.error("--concurrency must be at least 4 (the re-scoring minimum)")
    catalog = load_catalog()
    try:
        selection = build_selection({"model": args.model, "gpu": args.gpu, "concurrency": args.concurrency}, catalog)
        commands = arms(catalog, selection)
    except (UsageError, ValueError) as exc:  # an unknown --model or --gpu, or a plan without an adaptive command
        print(f"rocm-dspark acceptance: {exc}", file=sys.stderr)
        return 2
    plan = commands.pop("_plan")
    if args.dry_run:
        for name in RUN_ORDER:
            print(f"{name}: {shlex.join(commands[name]['argv'])}")
        print(f"reference: {REFERENCE_TEXT}")
        return 0
    report_dir = Path(args.report)
    if report_dir.exists() and any(report_dir.iterdir()):
        print(f"rocm-dspark acceptance: {report_dir} is not empty; name a new directory", file=sys.stderr)
        return 2
    report_dir.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = run_arms(
        commands,
        concurrency=args.concurrency,
        k=plan["k"],
        gsm8k_limit=args.gsm8k_limit,
        report_dir=report_dir,
        ready_timeout_s=args.ready_timeout,
        say=lambda m: print(m, file=sys.stderr),
    )
    report = {
        "plan": plan,
        "concurrency": args.concurrency,
        "started_at": started,
        "reference": REFERENCE,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "arms": results,
        "verdict": verdict(results),
    }
    report["recipe_evidence"] = recipe_evidence(report)
    (report_dir / "acceptance.json").write_text(json.dumps(report, indent=1))
    (report_dir / "acceptance.md").write_text(markdown(report))
    print(report["verdict"]["text"])
    return 0 if report["verdict"]["accepted"] else 1


if __name__ == "__main__":
    sys.exit(main())
