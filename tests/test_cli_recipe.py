"""`rocm-dspark recipe` / `list` end to end in a subprocess: output, detection, bad input, imports."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, cli_env
from tests.helpers import run_cli


def run(*args, env=None):
    return run_cli(args, env=env or cli_env())


def test_recipe_default_prints_a_plan_and_says_which_gpu():
    proc = run("recipe", "--model", "V4.1-Flash")
    assert proc.returncode == 0, proc.stderr
    assert "# gpu: mi355x, the model's default (none given or detected); pass --gpu to change" in proc.stdout
    assert "vllm serve deepseek-ai/DeepSeek-V4.1-Flash" in proc.stdout
    assert '"enable_adaptive_verification":false' in proc.stdout


def test_json_format_is_machine_readable():
    proc = run("recipe", "--model", "deepseek-ai/DeepSeek-V4.1-Flash", "--gpu", "MI325X", "--format", "json")
    data = json.loads(proc.stdout)
    assert data["gpu"] == "mi325x" and data["argv"][:2] == ["vllm", "serve"]


def _stand_in_tool(tmp_path, name, fixture):
    """An instrument, not a fake GPU: prints a real recorded output of the AMD tool (see fixtures/host/SOURCES.md)."""
    tool = tmp_path / name
    tool.write_text(f"#!/bin/sh\ncat {FIXTURES / 'host' / fixture}\n")
    tool.chmod(0o755)
    return tmp_path


def test_gpu_is_detected_from_rocminfo(tmp_path):
    bindir = _stand_in_tool(tmp_path, "rocminfo", "rocminfo_text__mi300x_x8__rocm6.2.3__rocm-issue4021.txt")
    proc = run("recipe", "--model", "V4.1-Flash", "--format", "json",
               env=cli_env(PATH=f"{bindir}:{os.environ['PATH']}"))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["gpu"] == "mi300x"
    assert any(n["text"].startswith("detected AMD Instinct MI300X (gfx942)") for n in data["notes"])


def test_list_shows_profiles_with_status():
    proc = run("list")
    assert proc.returncode == 0
    assert "mi300x  experimental  2026-09-21  TP8" in proc.stdout and "gfx950" in proc.stdout
    assert json.loads(run("list", "--json").stdout)["models"]["DeepSeek-V4.1-Flash"]["profiles"]["mi350x"]["status"] == "verified"


@pytest.mark.parametrize("args,message", [
    (["--model", "Llama-3"], "unknown model 'Llama-3'; known models"),
    (["--model", "V4.1-Flash", "--gpu", "mi355x", "--tp", "3"], "does not divide the 64 query heads"),
    (["--model", "V4.1-Flash", "--gpu", "mi355x", "--tp", "16"], "exceeds the 8 GPUs of one node"),
    (["--model", "V4.1-Flash", "--gpu", "mi355x", "-k", "9"], "outside 1..5"),
    (["--model", "V4.1-Flash", "--gpu", "mi355x", "-k", "3,5"], "per-rank K is refused"),
    (["--model", "V4.1-Flash", "--gpu", "mi355x", "--max-num-seqs", "0"], "must be a positive integer"),
    (["--model", "V4.1-Flash", "--gpu", "mi355x", "--max-num-seqs", "1024"], "exceeds the cap 2048"),
    (["--model", "V4.1-Flash", "--gpu", "mi355x", "--vllm-arg", "--tensor-parallel-size=2"], "use --tp instead"),
    (["--model", "V4.1-Flash", "--gpu", "mi355x", "--env", "1BAD=x"], "must be KEY=VALUE"),
])
def test_bad_input_is_one_line_exit_2(args, message):
    proc = run("recipe", *args)
    assert proc.returncode == 2
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_unknown_gpu_lists_choices():
    proc = run("recipe", "--model", "V4.1-Flash", "--gpu", "h100")
    assert proc.returncode == 2 and "mi300x" in proc.stderr and "Traceback" not in proc.stderr


def test_recipe_path_imports_neither_torch_nor_vllm():
    code = ("import sys; from rocm_dspark.cli import main\n"
            "try:\n    main(['recipe', '--model', 'V4.1-Flash', '--format', 'json'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'vllm', 'numpy', 'httpx'))\n"
            "sys.stderr.write(repr(heavy))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env())
    assert proc.stderr.strip() == "[]"


# What the default `recipe` (shell output, no probe record) must not import: its start-up budget is 1.5x of
# `python -c "import yaml, click"` (benchmarks/recipe_latency.py; tests/slow/test_recipe_latency.py times it),
# and each of these is needed only by other commands, other formats or a record on disk.
NOT_ON_THE_RECIPE_PATH = ("json", "textwrap", "rocm_dspark.launch.launch_facts", "rocm_dspark.runtime",
                          "rocm_dspark.probe.store", "rocm_dspark.probe.evidence", "rocm_dspark.probe.payoff",
                          "rocm_dspark.probe.record")


def test_recipe_start_up_imports_only_what_the_plain_recipe_runs(tmp_path):
    code = ("import sys; from rocm_dspark.cli import main\n"
            "try:\n    main(['recipe', '--model', 'V4.1-Flash'])\nexcept SystemExit:\n    pass\n"
            f"sys.stderr.write(repr(sorted(m for m in sys.modules if m.startswith({NOT_ON_THE_RECIPE_PATH!r}))))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=cli_env(ROCM_DSPARK_STATE_DIR=str(tmp_path)))
    assert proc.stderr.strip() == "[]", proc.stderr
    assert proc.stdout.startswith("VLLM_") and "\n# rocm-dspark plan " in proc.stdout
