"""`vllm bench serve`, vLLM's own load generator, run from the vLLM that serves: the field's tables are made with
it, so a row here sits beside theirs with the same TTFT/TPOT/ITL definitions. Host mode runs the server
Python's `vllm`; container modes run it inside the same image (`docker run --rm --network host`).

Flags and JSON keys are those of vllm/benchmarks/serve.py (0.32.0 line / 0.33.0 line): --base-url
1607/1655, --max-concurrency 1631/1679, --model 1645/1693, --tokenizer 1668/1716, --disable-tqdm 1728/1776,
--save-result 1744/1792, --result-dir 1768/1816, --result-filename 1775/1823, --ignore-eos 1784/1832,
--metric-percentiles 1811/1859, --temperature 1859/1907, --served-model-name 1888/1936; --dataset-name,
--num-prompts, --seed, --random-input-len, --random-output-len in vllm/benchmarks/datasets/datasets.py
(1593, 1587, 1585, 1888, 1894 in both).
The JSON: completed/failed/output_throughput (serve.py 1282-1288 / 1321-1327), mean_/median_/pNN_<metric>_ms
(1385-1391 / 1426-1432). Without --save-detailed the per-request errors are dropped from it (2389 / 2437),
so the first error is the "Error 0:" line bench prints (681-683 / 710-712).
"""

from __future__ import annotations

import itertools
import os
import shlex
import signal
import subprocess
from pathlib import Path

from rocm_dspark.errors import UsageError
from rocm_dspark.inputs import parse_json, read_text
from rocm_dspark.recipe.plan import Command

SEED = 0
PERCENTILES = (50, 90, 99)


def bench_argv(
    prefix,
    *,
    base_url: str,
    served_name: str,
    tokenizer: str,
    concurrency: int,
    num_prompts: int,
    input_len: int,
    output_len: int,
    result_dir: str,
    result_filename: str,
    seed: int = SEED,
    extra=(),
) -> list[str]:
    """prefix: how to reach `vllm` (["/venv/bin/vllm"] or the `docker run ... --entrypoint vllm IMAGE` argv);
    extra: more bench flags, after the workload's."""
    flags = {  # None: a flag without a value
        "--base-url": base_url,
        "--model": served_name,
        "--served-model-name": served_name,
        "--tokenizer": tokenizer,
        "--dataset-name": "random",
        "--random-input-len": input_len,
        "--random-output-len": output_len,
        "--seed": seed,
        "--ignore-eos": None,
        "--temperature": 0,
        "--num-prompts": num_prompts,
        "--max-concurrency": concurrency,
        "--metric-percentiles": ",".join(map(str, PERCENTILES)),
        "--disable-tqdm": None,
        "--save-result": None,
        "--result-dir": result_dir,
        "--result-filename": result_filename,
    }
    words = [w for flag, v in flags.items() for w in ((flag,) if v is None else (flag, str(v)))]
    return [*prefix, "bench", "serve", *words, *map(str, extra)]


def container_prefix(tool: str, image: str, mounts) -> list[str]:
    """The image's own `vllm` (its entrypoint may be `vllm serve`, so it is named); mounts: `-v` pairs."""
    run = [tool, "run", "--rm", "--network", "host", "-e", "PYTHONUNBUFFERED=1"]
    return [*run, *mounts, "--entrypoint", "vllm", image]


def served_model(argv) -> str | None:
    """The model (or its --tokenizer) a `vllm serve` argv loads: the tokenizer bench must use. Read by
    Command.from_words (vLLM's parser): the positional after `serve`, wherever it stands."""
    command = Command.from_words(argv)
    for dest in ("tokenizer", "model"):
        if command.value(dest):
            return command.value(dest)
    head = list(command.head)
    return head[head.index("serve") + 1] if "serve" in head[:-1] else None


def first_error(output: str) -> str | None:
    """The last line of bench's first reported failure (a traceback's `Type: message`), or None."""
    lines = output.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("Error 0: ")), None)
    if start is None:
        return None
    block = [
        lines[start][len("Error 0: ") :],
        *itertools.takewhile(lambda ln: not ln.startswith(("Error 1: ", "=====")), lines[start + 1 :]),
    ]
    text = [ln.strip() for ln in block if ln.strip()]
    return text[-1][:300] if text else "(empty error)"


def run(argv: list[str], result_path: Path, log_path: Path, timeout_s: float) -> dict:
    """Run bench; returns {"rc", "json" (the file, as written, or None), "error" (first failure or None)}."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # its log is read while it runs
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
            )
        except OSError as exc:  # no such vllm (or docker): a failed run, with the reason
            return {"rc": None, "json": None, "error": f"cannot run {argv[0]}: {exc.strerror or exc}"}
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: nothing of it is left behind
            proc.wait()
            rc = None
    output = log_path.read_text(errors="replace")
    data, unreadable = None, None
    if result_path.exists():
        try:  # evidence: bounded and strict (no NaN, no duplicate key)
            what = "vllm bench serve's result"
            data = parse_json(read_text(result_path, what), f"{what} {result_path}")
        except UsageError as exc:
            unreadable = str(exc)
    error: str | None
    if rc is None:
        error = f"vllm bench serve did not finish within {timeout_s:g} s"
    elif rc != 0 or data is None:
        last = next((ln.strip()[:300] for ln in reversed(output.splitlines()) if ln.strip()), "no output")
        error = first_error(output) or unreadable or f"vllm bench serve exited {rc} without a result: {last}"
    else:
        error = first_error(output)
    return {"rc": rc, "json": data, "error": error}


def row(data: dict | None, concurrency: int, num_prompts: int, command: list[str], error: str | None) -> dict:
    """The sweep's row (the keys the report, plots and cost table read) from bench's JSON, kept whole."""
    d = data or {}
    completed = int(d.get("completed") or 0)
    failed = num_prompts - completed  # a run that died mid-level counts every request it did not complete

    def pct(metric: str, ps=(99,)) -> dict:
        """bench's mean, median and percentiles of `metric`, in ms to 2 decimals."""
        keys = {"mean": f"mean_{metric}_ms", "p50": f"median_{metric}_ms", **{f"p{p}": f"p{p}_{metric}_ms" for p in ps}}
        return {name: None if d.get(key) is None else round(float(d[key]), 2) for name, key in keys.items()}

    return {
        "concurrency": concurrency,
        "requests": num_prompts,
        "succeeded": completed,
        "failed": failed,
        "bench_failed": d.get("failed"),
        "wall_s": d.get("duration"),
        "output_tokens": d.get("total_output_tokens"),
        "output_throughput_tok_s": None if d.get("output_throughput") is None else round(d["output_throughput"], 2),
        "request_throughput_req_s": d.get("request_throughput"),
        "ttft_ms": pct("ttft", ps=(90, 99)),
        "tpot_ms": pct("tpot"),
        "itl_ms": pct("itl"),
        "errors": [error] if error else [],
        "bench_command": shlex.join(command),
        "bench_result": data,
    }
