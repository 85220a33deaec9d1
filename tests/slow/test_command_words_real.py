"""Command.from_words, and every argv reader built on it (tests/test_argv_readers.py), against vLLM's REAL
`vllm serve` parser (tests/slow/vllm_parse_child.py: FlexibleArgumentParser + make_arg_parser) of 0.32.0
(.venv-vllm) and 0.33.0 (the wheel's Python files over it). Each setting is spelled every way vLLM accepts
(`--f v`, `--f=v`, `--f_v v`, `--f_v=v`, the short alias, `-alias=v`), alone, all together, repeated (the last
wins), with the model after the flags, and the booleans with their `--no-` forms. For every argv, what our
readers answer must be what vLLM's namespace holds. A deliberately wrong reading is refused (the check can fail)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rocm_dspark.launch import k8s, launch_facts
from rocm_dspark.probe import ab_band, live
from rocm_dspark.recipe.plan import Command
from rocm_dspark.validate import bench, tool_calls

pytestmark = pytest.mark.slow

CHILD = Path(__file__).with_name("vllm_parse_child.py")
REPO = Path(__file__).resolve().parents[2]
OVERLAY_033 = Path(os.environ.get("ROCM_DSPARK_VLLM033_DIR") or REPO / ".cache" / "vllm-0.33.0")
HEAD = ["vllm", "serve", "org/m"]
SPEC = '{"num_speculative_tokens":3,"enable_adaptive_verification":true}'
# dest -> (long flag, short alias or None, a value): the settings our readers read.
SETTINGS = {
    "max_num_seqs": ("--max-num-seqs", None, "8"),
    "tensor_parallel_size": ("--tensor-parallel-size", "-tp", "2"),
    "data_parallel_size": ("--data-parallel-size", "-dp", "2"),
    "pipeline_parallel_size": ("--pipeline-parallel-size", "-pp", "2"),
    "speculative_config": ("--speculative-config", "-sc", SPEC),
    "port": ("--port", None, "-1"),
    "tokenizer": ("--tokenizer", None, "org/tok"),
    "tool_call_parser": ("--tool-call-parser", None, "deepseek_v41"),
    "max_cudagraph_capture_size": ("--max-cudagraph-capture-size", None, "64"),
    "max_num_batched_tokens": ("--max-num-batched-tokens", None, "4096"),
}
BOOLS = ("enforce_eager", "enable_auto_tool_choice")
DESTS = [*SETTINGS, *BOOLS, "model_tag", "data_parallel_size_local", "monokernel"]


def spellings(dest: str, value: str | None = None) -> list[list[str]]:
    flag, alias, default = SETTINGS[dest]
    v = default if value is None else value
    under = "--" + flag[2:].replace("-", "_")
    out = [[flag, v], [f"{flag}={v}"], [under, v], [f"{under}={v}"]]
    return out + ([[alias, v], [f"{alias}={v}"]] if alias else [])


def corpus(mono: bool) -> list[list[str]]:
    argvs = [HEAD]
    for dest in SETTINGS:
        argvs += [HEAD + s for s in spellings(dest)]
    for i in range(6):  # every setting at once, each in its i-th spelling; then the model after the flags
        words = [w for dest in SETTINGS for w in spellings(dest)[i % len(spellings(dest))]]
        argvs += [HEAD + words, HEAD[:2] + words + HEAD[2:]]
    for dest in ("max_num_seqs", "tensor_parallel_size", "speculative_config"):  # repeated: the last one wins
        first, last = spellings(dest, "4" if dest != "speculative_config" else '{"num_speculative_tokens":1}'), spellings(dest)
        argvs += [HEAD + first[i % len(first)] + last[-1 - i % len(last)] for i in range(len(last))]
    argvs += [HEAD + ["--data-parallel-size-local", "2", "-dp", "4", "-tp", "2"]]
    for dest in BOOLS:
        flag = "--" + dest.replace("_", "-")
        argvs += [HEAD + [flag], HEAD + [flag, "--max-num-seqs", "8"]]
    argvs += [HEAD + ["--enforce-eager", "--no-enforce-eager"], HEAD + ["--no-enforce-eager", "--enforce-eager"]]
    if mono:  # --monokernel exists from 0.33.0 (vllm/engine/arg_utils.py:1842 in its wheel)
        argvs += [HEAD + ["--monokernel"], HEAD + ["--monokernel", "--no-monokernel"], HEAD + ["--no-monokernel"]]
    return argvs


def parse(vllm_venv, argvs, overlay):
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", PYTHONPATH=str(overlay) if overlay else "")
    r = subprocess.run([str(vllm_venv / "bin" / "python"), str(CHILD), json.dumps(DESTS)], input=json.dumps(argvs),
                       capture_output=True, text=True, timeout=600, env=env, cwd=str(REPO / "tests"))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def ours(argv: list[str], mono: bool) -> dict:
    """What Command.from_words and the readers built on it answer, in the child's terms (vLLM's types)."""
    c = Command.from_words(argv)
    out: dict = {}
    for dest in SETTINGS:
        v = c.value(dest)
        out[dest] = None if v is None else c.spec_config() if dest == "speculative_config" else \
            int(v) if v.lstrip("-").isdigit() else v
    out.update({dest: bool(c.bool_flag(dest)) for dest in BOOLS})
    out["model_tag"] = c.head[2] if len(c.head) > 2 else None
    out["data_parallel_size_local"] = c.int_value("data_parallel_size_local", None)  # type: ignore[arg-type]
    if mono:
        out["monokernel"] = launch_facts.runs_mono(argv)
    # The readers, each against the namespace value it stands for.
    out["readers"] = {
        "gpus": (k8s._gpus_used(argv), c.gpus_per_node_used),
        "k": ab_band._num_speculative_tokens(argv),
        "mnbt": live.int_flag(argv, "max_num_batched_tokens"),
        "capture": (live.capture_of(argv), live.int_flag(argv, "max_cudagraph_capture_size")),
        "tool_parser": tool_calls.flag(argv, "tool_call_parser"),
        "bench_model": bench.served_model(argv),
        "spec": Command.from_words(argv).spec_config(),
    }
    return out


def theirs(ns: dict, default: dict, mono: bool) -> dict:
    """The same facts from vLLM's namespace: a setting it holds at its default counts as not given."""
    out = {d: ns[d] if ns[d] != default[d] else None for d in SETTINGS}  # the corpus never spells a default
    out.update({d: bool(ns[d]) for d in BOOLS})
    out["model_tag"] = ns["model_tag"]
    out["data_parallel_size_local"] = ns["data_parallel_size_local"]
    if mono:
        out["monokernel"] = bool(ns["monokernel"])
    dp = ns["data_parallel_size_local"] or ns["data_parallel_size"]
    gpus = ns["tensor_parallel_size"] * dp * ns["pipeline_parallel_size"]
    spec = ns["speculative_config"] if isinstance(ns["speculative_config"], dict) else None
    cap = ns["max_cudagraph_capture_size"]
    out["readers"] = {
        "gpus": (gpus, gpus),
        "k": (spec or {}).get("num_speculative_tokens"),
        "mnbt": ns["max_num_batched_tokens"],
        "capture": (0 if ns["enforce_eager"] else cap, cap),
        "tool_parser": ns["tool_call_parser"],
        "bench_model": ns["tokenizer"] or ns["model_tag"],
        "spec": spec,
    }
    return out


def _compare(vllm_venv, overlay, mono: bool):
    argvs = corpus(mono)
    results = parse(vllm_venv, argvs, overlay)
    errors = [(a, r) for a, r in zip(argvs, results) if "error" in r]
    assert not errors, errors[:3]
    default = results[0]
    diffs = [(a, ours(a, mono), theirs(r, default, mono)) for a, r in zip(argvs, results)]
    bad = [d for d in diffs if d[1] != d[2]]
    assert not bad, bad[:3]
    # The check can fail: the old word reader (`argv[argv.index("--max-num-seqs") + 1]`, the first exact spelling)
    # disagrees with vLLM on some of these argvs.
    old = [int(a[a.index("--max-num-seqs") + 1]) if "--max-num-seqs" in a[:-1] else None for a in argvs]
    assert any(o != (r["max_num_seqs"] if r["max_num_seqs"] != default["max_num_seqs"] else None)
               for o, r in zip(old, results))
    return len(argvs)


def test_readers_agree_with_vllm_0_32(vllm_venv):
    assert _compare(vllm_venv, None, mono=False) > 80


def test_readers_agree_with_vllm_0_33(vllm_venv):
    if not (OVERLAY_033 / "vllm").is_dir():
        pytest.skip(f"no vLLM 0.33.0 overlay at {OVERLAY_033}: run scripts/setup_vllm_033_overlay.sh")
    assert _compare(vllm_venv, OVERLAY_033, mono=True) > 80
