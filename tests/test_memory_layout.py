"""Memory per rank for every strategy (issue 22, item 5) and one answer from `plan` and `recipe` (item 6)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.recipe.catalog import recipes_dir
from rocm_dspark.recipe.memory import RankLayout, engram_dp_group

MODEL = yaml.safe_load((recipes_dir() / "models" / "deepseek-v4.1-flash.yaml").read_text())
M, P, A = MODEL["memory"], MODEL["params"], MODEL["architecture"]
DEP = ["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--strategy", "multi_node_dep", "--nodes", "2",
       "--head-address", "10.0.0.1"]


def _reference_rank(tp, dp, pp, *, engram_group, resident=True, usable=192 * 0.9, mnbt=8192):
    """The budget written out from the model file's numbers and vLLM's layout rules (recipes comment)."""
    experts_b = (P["backbone_b"] - P["active_output_token_b"]) / (1 - A["experts_per_token"] / A["routed_experts"])
    rest_b = P["backbone_b"] - experts_b
    eb, db = M["layout"]["expert_bytes_per_param"], M["layout"]["dense_bytes_per_param"]
    share = experts_b * eb / (experts_b * eb + rest_b * db)
    weights = M["sharded_weights_gib"] * (share / (tp * dp * pp) + (1 - share) / (tp * pp))
    engram = M["engram_tables_gib"] / (tp * engram_group) if resident else 0.0
    return usable - M["fixed_gib"] - weights - engram - mnbt * M["indexer_mib_per_batched_token"] / 1024


def unfolded(text: str) -> str:
    """The output with each wrapped comment (`#   ` continuation lines, rocm_dspark/textwidth.py) on one line."""
    return re.sub(r"\n#   ", " ", text)


def _kv(note: str) -> float:
    return float(note.split("= KV ")[1].split(" GiB")[0])


def test_dep_on_a_build_not_shown_to_shard_engram_over_dp_is_refused_with_its_numbers():
    r = CliRunner().invoke(cli, [*DEP, "--build", "nightly-3df4ae15"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    line = r.output
    assert "no room for KV cache: per rank on mi300x TP1 x DP16 with EP (2 nodes)" in line
    assert "Engram tables 188.8 (over TP1, whole on every DP rank" in line
    assert abs(_kv(line) - _reference_rank(1, 16, 1, engram_group=1)) < 0.06
    assert "a build that shards Engram tables over DP (--build v0.32.0 or v0.33.0" in line


def test_dep_memory_line_is_per_rank_of_the_real_layout():
    r = CliRunner().invoke(cli, [*DEP, "--vllm-version", "0.33.0", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    note = next(n["text"] for n in d["plan"]["notes"] if n["topic"] == "memory")
    assert note.startswith("per rank on mi300x TP1 x DP16 with EP (2 nodes)")
    assert "over TP1 x node-local DP groups of 8" in note and "resolved for one node" not in note
    assert abs(_kv(note) - _reference_rank(1, 16, 1, engram_group=8)) < 0.06
    assert d["plan"]["memory"]["engram_gib"] == round(M["engram_tables_gib"] / 8, 2)
    node_plan = next(n["text"] for n in d["notes"] if n["topic"] == "node plan")
    assert "memory note is per rank of the group's layout" in node_plan


@pytest.mark.parametrize("strategy,tp,dp,pp,group", [
    ("multi_node_tp", 16, 1, 1, 1), ("multi_node_tp_dp", 8, 2, 1, 1), ("multi_node_tp_pp", 8, 1, 2, 1),
])
def test_every_strategy_gets_its_own_layout(strategy, tp, dp, pp, group):
    r = CliRunner().invoke(cli, ["recipe", "--explain", "--model", "V4.1-Flash", "--gpu", "mi300x", "--strategy", strategy,
                                 "--nodes", "2", "--head-address", "10.0.0.1", "--vllm-version", "0.33.0"])
    assert r.exit_code == 0, r.output
    note = next(ln for ln in unfolded(r.output).splitlines() if ln.startswith("# memory:"))
    if dp == pp == 1:
        assert note.startswith(f"# memory: per rank on mi300x TP{tp}:")
    else:
        assert f"TP{tp} x {'DP' + str(dp) if dp > 1 else 'PP' + str(pp)} (2 nodes)" in note
    assert abs(_kv(note) - _reference_rank(tp, dp, pp, engram_group=group)) < 0.06


def test_a_strategy_override_emits_a_refused_layout_and_says_so():
    r = CliRunner().invoke(cli, [*DEP, "--build", "nightly-3df4ae15", "--memory-override", "--explain"])
    assert r.exit_code == 0 and "# memory: OVERRIDDEN (--memory-override): per rank on mi300x TP1 x DP16" in unfolded(r.output)


def test_single_node_budget_is_unchanged():
    r = CliRunner().invoke(cli, ["recipe", "--explain", "--model", "V4.1-Flash", "--gpu", "mi355x"])
    assert ("# memory: per rank on mi355x TP4: 259.2 GiB usable (288 x 0.9) - fixed 39.5 - sharded weights 62.2 - "
            "Engram tables 47.2 - indexer buffers 73.0 (max_num_batched_tokens 16384) = KV 37.3 GiB") in unfolded(r.output)


@pytest.mark.parametrize("tp,dp,pp,nodes,g,want", [
    (1, 16, 1, 2, 8, 8), (2, 8, 1, 2, 8, 4), (8, 2, 1, 2, 8, 1), (4, 2, 1, 1, 8, 2), (8, 1, 2, 2, 8, 1),
    (1, 12, 1, 2, 8, 6), (16, 1, 1, 2, 8, 1),
])
def test_engram_dp_group_follows_vllms_rule(tp, dp, pp, nodes, g, want):
    # vllm/distributed/parallel_state.py _engram_dp_shard_size: gcd(DP, whole replicas per node), 1 when
    # replicas do not fit a node (ranks laid out node by node, as the strategies place them).
    assert engram_dp_group(RankLayout(tp=tp, dp=dp, pp=pp, nodes=nodes, gpus_per_node=g)) == want


# --- plan and recipe agree ----------------------------------------------------------------------------------


def _recipe(argv):
    assert argv[:2] == ["rocm-dspark", "recipe"]
    return CliRunner().invoke(cli, argv[1:])


@pytest.mark.parametrize("gpu", ["mi300x", "mi325x", "mi350x", "mi355x"])
def test_every_plan_recommendation_is_applied_by_the_recipe_command_it_prints(gpu, monkeypatch):
    """`--adaptive on` needs this host's proof: stubbed as held (a real one needs an MI300-class host)."""
    from rocm_dspark.probe import gate
    from tests.helpers.ab_records import PROVEN

    monkeypatch.setattr(gate, "gate_verdict", lambda *a, **k: PROVEN)
    r = CliRunner().invoke(cli, ["plan", "--model", "V4.1-Flash", "--gpu", gpu, "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)["plans"][0]
    spec, apply = p["speculative_config"], p["apply"]
    argv = apply["recipe"] if apply["refused"] is None else apply["instead"]
    if apply["refused"] is not None:  # then the best fixed K, which recipe must run
        spec = {"num_speculative_tokens": p["best_fixed_k"]}
        assert "use one K" in apply["refused"]
    out = _recipe([*argv, "--format", "json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)["speculative_config"]
    for key, value in spec.items():
        if key != "enable_adaptive_verification":
            assert got[key] == value, (key, got, spec)
    text = CliRunner().invoke(cli, ["plan", "--model", "V4.1-Flash", "--gpu", gpu]).output
    line = next(ln for ln in text.splitlines() if ln.startswith("  apply: "))
    assert shlex.join(argv) in line


def test_a_per_batch_size_k_is_a_recipe_option_now():
    r = CliRunner().invoke(cli, ["recipe", "--model", "V4.1-Flash", "--gpu", "mi355x", "--vllm-version", "0.33.0",
                                 "--k-per-batch-size", "1-16:5,17-64:4,65-128:2", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 16, 5], [17, 64, 4], [65, 128, 2]]
    assert not d["adaptive_verification"] and d["adaptive_argv"] is None


@pytest.mark.parametrize("args,words", [
    (["--k-per-batch-size", "2-16:5"], "first range must start at 1"),
    (["--k-per-batch-size", "1-16:5,10-64:4"], "overlap"),
    (["--k-per-batch-size", "1-16:6"], "more than --num-speculative-tokens 5"),
    (["--k-per-batch-size", "1-x:5"], "is not LO-HI:K"),
    (["--k-per-batch-size", "1-" + "9" * 400 + ":5"], "is not LO-HI:K"),
    (["--k-per-batch-size", "1-16²:5"], "is not LO-HI:K"),  # a digit int() refuses: was a ValueError traceback
    (["--k-per-batch-size", "1-16:5", "--dp", "2", "--tp", "4"], "data parallel"),
    (["--gpu", "mi300x", "--k-per-batch-size", "1-16:5"], "PIECEWISE"),
    (["--vllm-version", "0.30.0", "--k-per-batch-size", "1-16:5"], ""),
    (["--no-speculation", "-k", "3"], "--no-speculation serves without a draft"),
])
def test_bad_schedules_are_one_line(args, words):
    base = ["recipe", "--model", "V4.1-Flash"] + ([] if "--gpu" in args else ["--gpu", "mi355x"])
    if "--vllm-version" not in args and "--no-speculation" not in args:
        base += ["--vllm-version", "0.33.0"]
    r = CliRunner().invoke(cli, base + args)
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and words in r.output, r.output


def test_no_speculation_drops_the_speculative_config():
    r = CliRunner().invoke(cli, ["recipe", "--model", "V4.1-Flash", "--gpu", "mi355x", "--no-speculation",
                                 "--format", "json"])
    d = json.loads(r.output)
    assert "--speculative-config" not in d["argv"] and d["k"] == 0 and d["speculative_config"] == {}


def test_plan_nodes_says_which_flag_makes_recipe_emit_the_priced_layout():
    r = CliRunner().invoke(cli, ["plan", "--model", "V4.1-Flash", "--gpu", "mi355x", "--nodes", "2", "--json"])
    row = next(x for x in json.loads(r.output)["strategies"]["mi355x"] if x.get("strategy") == "multi_node_tp_dp")
    assert (row["tp"], row["dp"]) == (4, 4) and row["recipe"][-2:] == ["--tp", "4"]
    out = CliRunner().invoke(cli, [*row["recipe"][1:], "--model", "V4.1-Flash", "--gpu", "mi355x", "--head-address",
                                   "10.0.0.1", "--format", "json"])
    layout = json.loads(out.output)["layout"]
    assert (layout["tp"], layout["dp"]) == (row["tp"], row["dp"])
    text = CliRunner().invoke(cli, ["plan", "--model", "V4.1-Flash", "--gpu", "mi355x", "--nodes", "2"]).output
    assert "recipe --strategy multi_node_tp_dp --nodes 2 --tp 4; recipe emits TP8 x DP2 unless given --tp 4" in " ".join(text.split())


def test_the_recipe_path_stays_light():
    # --k-per-batch-size is parsed without importing the planner, torch or vllm.
    code = ("import sys; from rocm_dspark.cli import main\n"
            "try: main(['recipe','--model','V4.1-Flash','--gpu','mi355x','--vllm-version','0.33.0',"
            "'--k-per-batch-size','1-16:5'])\nexcept SystemExit: pass\n"
            "print([m for m in ('torch','vllm','numpy','rocm_dspark.planner') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
