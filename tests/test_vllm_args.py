"""User --vllm-arg tokens are read as vLLM reads them, and none reaches a plan-owned setting (issue #14, item 2).

tests/slow/test_vllm_args_real.py proves the same against vLLM's real parser; these tests pin the spellings.
"""

import json

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.resolve import Selection, resolve
from rocm_dspark.recipe.vllm_args import GUARDED_FLAGS, PARTLY_OWNED, PLAN_OWNED, emit, normalise

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
    # The multi-node layout (rocm_dspark/recipe/strategies.py decides it for the whole group), by every alias.
    "-dpl=2", "--data_parallel_size_local=2", "--data-parallel-size-l=2", "-dpa=10.0.0.9", "--data-parallel-address=x",
    "-dpp=1", "-dpr=4", "-dpn=1", "-dpb=ray", "-dph", "--no-data-parallel-hybrid-lb", "-dpe",
    "--data-parallel-external-lb", "--headless", "--nnodes=2", "-n=2", "--node-rank=1", "-r=1",
    "--master-addr=x", "--master-port=1", "--distributed-executor-backend=ray", "-pp=2", "--pipeline_parallel_size=2",
    # vLLM 0.33's spelling of --no-enable-expert-parallel; the per-GPU MoE backend and Engram offload rule.
    "--disable-expert-parallel", "--disable-expert", "--moe-backend=triton", "--moe_backend=x",
    "--engram-config={\"cpu_offload\":false}", "--engram_config.cpu_offload=false",
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
                                  extra_args=("--tokenizer=--speculative-config={}", "--chat-template=-y")))
    assert plan.argv[-2:] == ("--tokenizer=--speculative-config={}", "--chat-template=-y")
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


# --- --env (rocm_dspark/recipe/vllm_env.py) ---------------------------------------------------------------


def _env_plan(*pairs, gpu="mi300x"):
    return resolve(CAT, Selection(model="V4.1-Flash", gpu=gpu, extra_env=tuple(pairs)))


@pytest.mark.parametrize("key,value", [("VLLM_USE_BREAKABLE_CUDAGRAPH", "1"), ("VLLM_ROCM_USE_AITER", "0"),
                                       ("VLLM_ROCM_USE_AITER_MOE", ""), ("OMP_NUM_THREADS", "8")])
def test_env_the_plan_sets_cannot_be_changed(key, value):
    planned = _env_plan().env[key]
    with pytest.raises(UsageError) as exc:
        _env_plan((key, value))
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"--env {key}={value}: the plan sets {key}={planned}")


def test_env_the_plan_sets_may_be_repeated_or_be_startup_only():
    plan = _env_plan(("VLLM_ROCM_USE_AITER", "1"), ("VLLM_ENGINE_READY_TIMEOUT_S", "7200"),
                     ("AITER_TRITON_LOG_LEVEL", "INFO"))
    # Every --env value goes to the env file (plan.secret_env), never into the plan's own env.
    assert plan.secret_env["VLLM_ROCM_USE_AITER"] == "1" and plan.secret_env["VLLM_ENGINE_READY_TIMEOUT_S"] == "7200"
    assert "VLLM_ENGINE_READY_TIMEOUT_S" not in plan.env and "VLLM_ROCM_USE_AITER" not in plan.env


@pytest.mark.parametrize("value,ok", [("", False), ("other", False), ("other,rocm_dspark", True), ("rocm_dspark", True),
                                      ("rocm-dspark", False)])
def test_vllm_plugins_must_keep_ours(value, ok):
    if ok:
        assert _env_plan(("VLLM_PLUGINS", value)).secret_env["VLLM_PLUGINS"] == value
        return
    with pytest.raises(UsageError, match="rocm-dspark's attention plugin would not load; add rocm_dspark"):
        _env_plan(("VLLM_PLUGINS", value))


def test_other_env_passes_and_is_part_of_what_the_probe_fingerprints():
    from rocm_dspark.probe.fingerprint import launch_identity

    plan = _env_plan(("VLLM_ROCM_USE_AITER_MHA", "0"))
    assert plan.secret_env["VLLM_ROCM_USE_AITER_MHA"] == "0"
    # By digest: another value is another launch, and the record never holds the value itself.
    assert launch_identity(plan)["env"]["VLLM_ROCM_USE_AITER_MHA"].startswith("sha256:")
    assert launch_identity(plan) != launch_identity(_env_plan())  # another env: no record for it counts
    assert launch_identity(plan) != launch_identity(_env_plan(("VLLM_ROCM_USE_AITER_MHA", "1")))


def test_the_plugin_name_is_the_entry_point_vllm_loads():
    import tomllib
    from pathlib import Path

    from rocm_dspark.recipe.vllm_env import PLUGIN_NAME

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert PLUGIN_NAME in project["project"]["entry-points"]["vllm.general_plugins"]
