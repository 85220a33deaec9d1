"""`rocm-dspark plan` end to end in a subprocess: every GPU profile, JSON, PNG, seed example, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import cli_env
from tests.helpers import run_cli

GPUS = ("mi300x", "mi325x", "mi350x", "mi355x")


def run(*args):
    return run_cli(["plan", *args], env=cli_env())


def test_plan_prints_a_recommendation_for_every_gpu_profile():
    proc = run("--model", "V4.1-Flash", "--concurrency", "1,16,128")
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.split("\n\n")
    assert len(blocks) == len(GPUS)
    for gpu, block in zip(GPUS, blocks):
        assert f"DeepSeek-V4.1-Flash on {gpu}" in block
        assert "recommendation: " in block
        assert "not yet run on MI300-class hardware" in block
        rows = [line for line in block.splitlines() if line.strip()[:1].isdigit() and " | " in line]
        assert [int(line.split()[0]) for line in rows] == [1, 16, 128]


def test_json_output_and_vllm_schedule_format():
    proc = run("--gpu", "mi355x", "--json", "--acceptance-rates", "0.9,0.8,0.7,0.6,0.5")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    plan = data["plans"][0]
    assert data["model"] == "DeepSeek-V4.1-Flash" and plan["conditional_rates"] == [0.9, 0.8, 0.7, 0.6, 0.5]
    assert [r["concurrency"] for r in plan["rows"]] == [1, 16, 64, 128, 512]
    assert plan["recommended"] in ("none", "fixed", "per_batch_size", "adaptive", "block")
    schedule = plan["num_speculative_tokens_per_batch_size"]
    assert schedule[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in zip(schedule, schedule[1:]))
    assert schedule[-1][1] >= 128
    # Adaptive is recommended only if the profile's pinned vLLM build accepts it (recipes/vllm.yaml).
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.planner.profile import adaptive_status

    cat = load_catalog()
    allowed, _ = adaptive_status(cat, cat.find_model("V4.1-Flash").profiles["mi355x"])
    if not allowed:
        assert plan["recommended"] != "adaptive"
    row = plan["rows"][0]
    assert row["adaptive"]["verified_drafts_per_request"] <= 5 and row["no_spec"]["mean_acceptance_length"] == 1.0


def test_plot_writes_a_png(tmp_path):
    out = tmp_path / "plan.png"
    proc = run("--gpu", "mi300x,mi355x", "--concurrency", "1,64", "--plot", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]  # no temp file left behind
    assert out.stat().st_mode & 0o777 == 0o644                    # readable like any other output, not 0600


def test_a_usage_error_leaves_no_plot_behind(tmp_path):
    """Found by benchmarks/cli_fuzz.py: `plan --nodes 0 --plot P` wrote P, then refused --nodes."""
    out = tmp_path / "plan.png"
    proc = run("--gpu", "mi300x", "--nodes", "0", "--plot", str(out))
    assert proc.returncode == 2 and proc.stderr.strip() == "rocm-dspark: error: --nodes must be at least 1, got 0"
    assert list(tmp_path.iterdir()) == []


def test_cost_table_replaces_the_roofline(tmp_path):
    table = tmp_path / "costs.json"
    table.write_text(json.dumps({"verify": [[1, 20], [8, 20.5], [64, 22], [256, 30], [768, 60], [1024, 80]],
                                 "draft": [[1, 2], [128, 4]]}))
    proc = run("--gpu", "mi355x", "--cost-table", str(table), "--concurrency", "1,128")
    assert proc.returncode == 0, proc.stderr
    assert "cost: measured (costs.json)" in proc.stdout and "roofline" not in proc.stdout


def test_seed_example_reproduces_the_seed():
    proc = run("--seed-example")
    assert proc.returncode == 0, proc.stderr
    for fragment in ("168 tok/s", "(3.24x)", "(4.15x)", "admitted   57", "adaptive  29053",
                     "independent positions 0.62, with the transition 0.81", "2.64"):
        assert fragment in proc.stdout
    data = json.loads(run("--seed-example", "--json").stdout)
    assert [r["admitted"] for r in data["adaptive"]] == [112, 57, 7]


@pytest.mark.parametrize("args, fragment", [
    (("--gpu", "mi250x"), "unknown GPU 'mi250x'"),
    (("--concurrency", "0,16"), "positive integer"),
    (("--concurrency", "a,b"), "comma-separated list of integers"),
    (("--acceptance-rates", "0.9,1.5"), "[0, 1]"),
    (("--acceptance-rates", "0.9;0.8"), "not a comma-separated list"),
    (("--acceptance-length", "9"), "outside [1, 6]"),
    (("--acceptance-length", "3", "--acceptance-rates", "0.9"), "not both"),
    (("--cost-table", "/nonexistent/costs.json"), "does not exist"),
    (("--model", "V9-Huge"), "unknown model"),
])
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    proc = run("--gpu", "mi355x", *args) if "--gpu" not in args else run(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in proc.stderr


def test_malformed_cost_table_is_one_line(tmp_path):
    bad = tmp_path / "costs.csv"
    bad.write_text("tokens,ms\n8,oops\n")
    proc = run("--gpu", "mi355x", "--cost-table", str(bad))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "costs.csv" in proc.stderr


def test_plan_command_module_imports_no_numpy():
    code = ("import sys, rocm_dspark.cli, rocm_dspark.cli.plan; "
            "assert 'numpy' not in sys.modules and 'matplotlib' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_allowed_draft_lengths_from_recipes_limit_the_plan(recipes_copy):
    """If recipes/ lists the draft lengths a build accepts, only those K are planned and scheduled."""
    import yaml

    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.planner.profile import plan_profile

    path = recipes_copy / "models" / "deepseek-v4.1-flash.yaml"
    data = yaml.safe_load(path.read_text())
    data["speculative"]["allowed_num_speculative_tokens"] = [5]
    path.write_text(yaml.safe_dump(data))
    cat = load_catalog(recipes_copy)
    plan = plan_profile(cat, cat.find_model("V4.1-Flash"), "mi355x", concurrencies=[1, 64, 128])
    assert all(list(r.fixed) == [5] for r in plan.rows) and plan.fixed_k == 5
    assert {k for _, _, k in plan.schedule} <= {0, 5}
