"""User --vllm-arg tokens are read as vLLM reads them, and none reaches a plan-owned setting (issue #14, item 2).

tests/slow/test_vllm_args_real.py proves the same against vLLM's real parser; these tests pin the spellings.
"""

import json

import pytest

from rocm_dspark.catalog import load_catalog
from rocm_dspark.errors import UsageError
from rocm_dspark.resolve import Selection, resolve
from rocm_dspark.vllm_args import GUARDED_FLAGS, PARTLY_OWNED, PLAN_OWNED, emit, normalise

CAT = load_catalog()

# The three bypasses of issue #14, then the other spellings vLLM's parser accepts for a plan-owned dest.
REFUSED = [
    "--speculative_config={\"enable_adaptive_verification\":true}",
    "--speculative-config.enable_adaptive_verification=true",
    "--speculative_config.enable_adaptive_verification=true",
    "--speculative-config",
    "-sc={}",
    "-sc.enable_adaptive_verification=true",
    "--speculative={}",            # argparse allow_abbrev: a unique prefix is the flag
    "--speculative.enable_adaptive_verification=true",
    "--spec-tokens=3", "--spec-method=ngram", "--spec_model=x",
    "--max-num-seq=4", "--max_num_seqs=4", "--max-num-batched=1",
    "--max-cudagraph-capture-size=8", "--max-cudagraph=8", "--cudagraph-capture-sizes=8",
    "--tensor-parallel=2", "--tensor_parallel_size=2", "-tp=2", "-t=2",
    "--data-parallel-size=2", "-dp=2",
    "--enable-expert-parallel", "--no-enable-expert-parallel", "--no-enable-expert", "-ep", "-e",
    "--served-model-name=x", "--served=x", "--host=0", "--hos=0", "--port=1", "--por=1",
    "--model=other", "--mode=other",
    "--config=x.yaml", "--config",
    "--compilation-config={\"max_cudagraph_capture_size\":8}",
    "--compilation-config={\"max-cudagraph-capture-size\":8}",
    "-cc={\"cudagraph_capture_sizes\":[8]}",
    "--compilation_config.max_cudagraph_capture_size=8",
    "-cc.cudagraph_capture_sizes+=8,16",
    "--compilation-config=not json",
]


@pytest.mark.parametrize("token", REFUSED)
def test_plan_owned_spellings_are_refused_in_one_line(token):
    with pytest.raises(UsageError) as exc:
        normalise(token)
    assert "\n" not in str(exc.value) and "--vllm-arg" in str(exc.value)


@pytest.mark.parametrize("token,flag,value", [
    ("--max_model_len=4096", "--max-model-len", "4096"),          # `_` -> `-` as vLLM does
    ("--enforce-eager", "--enforce-eager", None),
    ("--enforce-eager=--speculative-config={}", "--enforce-eager", "--speculative-config={}"),
    ("--x=-y", "--x", "-y"),
    ("--kv_transfer_config.kv_role=kv_both", "--kv-transfer-config.kv_role", "kv_both"),  # only before '.'
    ("-cc={\"mode\":3}", "--compilation-config", "{\"mode\":3}"),
    ("--compilation-config.mode=3", "--compilation-config.mode", "3"),
    ("-O3", "-O3", None),
    ("--max-model-len=", "--max-model-len", ""),
])
def test_other_flags_pass_normalised(token, flag, value):
    assert tuple(normalise(token)) == (flag, value)


@pytest.mark.parametrize("token", ["", "x", "-", "--", "--=x", "---x", "-1", "--a b", "--a\nb=1", "--é=1"])
def test_malformed_tokens_are_refused(token):
    with pytest.raises(UsageError):
        normalise(token)


def test_a_value_that_starts_with_a_dash_is_one_word():
    assert emit("--x", "-y") == ["--x=-y"]
    assert emit("--x", "y") == ["--x", "y"]
    assert emit("--x", None) == ["--x"]
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x",
                                  extra_args=("--enforce-eager=--speculative-config={}", "--x=-y")))
    assert plan.argv[-2:] == ("--enforce-eager=--speculative-config={}", "--x=-y")
    assert [a for a in plan.argv if a.startswith("--speculative-config")] == ["--speculative-config"]
    assert json.loads(plan.argv[plan.argv.index("--speculative-config") + 1])["enable_adaptive_verification"] is False


def test_guarded_table_names_every_alias_once():
    opts = [o for spellings, _ in PLAN_OWNED.values() for o in spellings]
    assert len(opts) == len(set(opts)) == len(GUARDED_FLAGS)
    partly = [o for spellings, _ in PARTLY_OWNED.values() for o in spellings]
    assert not set(partly) & set(opts)


@pytest.mark.parametrize("field", ["model_path", "served_name", "host"])
@pytest.mark.parametrize("value", ["", "  "])
def test_empty_names_and_paths_are_errors(field, value):
    with pytest.raises(UsageError, match="is empty"):
        resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x", **{field: value}))


def test_a_model_path_that_reads_as_a_flag_is_refused():
    with pytest.raises(UsageError, match="would read as a flag"):
        resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x",
                               model_path="--speculative-config.enable_adaptive_verification=true"))
