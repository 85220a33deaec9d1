"""Strict recipe data (issue #14, item 4): type, range, unknown keys, duplicate keys and encoding, each a one-line
error naming the file and the key, through the library and through the CLI (exit 2, no traceback)."""

import subprocess

import pytest

from rocm_dspark.recipe.catalog import CatalogError, load_catalog
from tests.conftest import CLI, cli_env
from tests.test_catalog import _break

V41 = "models/deepseek-v4.1-flash.yaml"


@pytest.mark.parametrize("rel,old,new,expect", [
    ("gpus.yaml", "    hbm_bandwidth_tbps: 5.3\n", "    hbm_bandwidth_tbps: 0\n",
     "gpus.mi300x.hbm_bandwidth_tbps: expected a number > 0, got 0"),         # was a ZeroDivisionError
    ("gpus.yaml", "    hbm_bandwidth_tbps: 5.3\n", "    hbm_bandwidth_tbps: .nan\n",
     "gpus.mi300x.hbm_bandwidth_tbps: expected a finite number"),
    ("gpus.yaml", "    hbm_gb: 192\n", "    hbm_gb: .inf\n", "gpus.mi300x.hbm_gb: expected a finite number"),
    ("gpus.yaml", "    hbm_gb: 192\n", "    hbm_gb: -192\n", "gpus.mi300x.hbm_gb: expected a number > 0"),
    ("gpus.yaml", "    tdp_w: 750\n", "    tdp_w: 750\n    tdp_watts: 750\n", "gpus.mi300x.tdp_watts: unknown key"),
    ("gpus.yaml", "    hbm_gb: 192\n", "    hbm_gb: 192\n    hbm_gb: 1\n", "malformed YAML: duplicate key 'hbm_gb'"),
    (V41, "  golden_acceptance_length: 3.51", "  golden_acceptance_length: high",
     "speculative.golden_acceptance_length: expected int/float, got 'high'"),  # was a traceback in the planner
    (V41, "  golden_acceptance_length: 3.51", "  golden_acceptance_length: 0.5",
     "speculative.golden_acceptance_length: expected a number >= 1"),
    (V41, "weights_gb: 511", "weights_gb: -1", "weights_gb: expected a number > 0"),
    (V41, "    max_num_seqs: 128               # not", "    max_num_seq: 64\n    max_num_seqs: 128   # not",
     "profiles.mi355x.max_num_seq: unknown key"),
    (V41, "    gpu_memory_utilization: 0.9\n", "    gpu_memory_utilization: 1.5\n",
     "profiles.mi355x.gpu_memory_utilization: expected a number > 0 and <= 1"),
    (V41, "  port: 8000\n", "  port: 80000\n", "serve.port: expected a TCP port"),
    (V41, "hf_id: deepseek-ai/DeepSeek-V4.1-Flash\n", "hf_id: ' '\n", "hf_id: must not be empty"),
    (V41, "  active_output_token_b: 16\n", "  active_output_token_b: .nan\n", "params.active_output_token_b: expected a finite"),
    (V41, "key: DeepSeek-V4.1-Flash\n", "key: DeepSeek-V4.1-Flash\nkey: other\n", "duplicate key 'key'"),
    ("vllm.yaml", "    commit: eed1f3d0c6043bd494424a22443ee198dd56f657\n",
     "    commit: eed1f3d0c6043bd494424a22443ee198dd56f657\n    comit: x\n", "builds.nightly-eed1f3d0.comit: unknown key"),
    ("workarounds.yaml", "  - id: amd-block-verification\n", "  - id: amd-block-verification\n    idd: x\n",
     "workarounds[0].idd: unknown key"),
])
def test_bad_recipe_values_name_file_and_key(recipes_copy, rel, old, new, expect):
    path = _break(recipes_copy, rel, old, new)
    with pytest.raises(CatalogError) as exc:
        load_catalog(recipes_copy)
    message = str(exc.value)
    assert message.startswith(str(path)) and expect in message and "\n" not in message, message


def test_non_utf8_recipe_file_is_one_line_exit_2(recipes_copy):
    path = recipes_copy / "gpus.yaml"
    path.write_bytes(path.read_bytes().replace(b"AMD Instinct MI300X\n", b"AMD Instinct MI300X \xe9\n", 1))
    proc = subprocess.run([*CLI, "recipe", "--model", "V4.1-Flash", "--gpu", "mi355x"], capture_output=True,
                          text=True, env=cli_env(ROCM_DSPARK_RECIPES=str(recipes_copy)))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and f"{path}: not UTF-8 text" in lines[0], proc.stderr


def test_the_shipped_recipes_load_strictly():
    cat = load_catalog()
    assert cat.models and cat.gpus
