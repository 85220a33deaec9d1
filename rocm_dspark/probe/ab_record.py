"""An A/B evidence record: one workload at one concurrency against block verification, then adaptive.

Schema "rocm-dspark/ab-record/2", strict JSON like the probe's record (rocm_dspark.probe.record): its keys and
types are _TOP, _ARM and _WORKLOAD below. A record with an `override` (the arms ran other commands than the
plan's, e.g. --server-json) never counts for the gate; its `verdict` is recomputed and checked on read.

Each arm was measured by `vllm bench serve`: bench_command is its exact command, bench_result the JSON its
--save-result wrote (null when none). On read, each arm's command must carry the record's workload and
concurrency, and its tokens/s, requests and failures must be its bench_result's, or the record never counts;
schema 1 (measured by the toolkit's own client) is refused the same way. Files: `<state dir>/ab/<id>.json`,
signed and read by the probe records' trust model (rocm_dspark.probe.store, docs/trust.md). Imports stay
light: the gate reads these on the recipe path.
"""

from __future__ import annotations

import shlex
from typing import NamedTuple

from rocm_dspark.probe import store
from rocm_dspark.probe.record import HEAD, RecordError, check_keys, check_preamble, parse_text, seal

SCHEMA = "rocm-dspark/ab-record/2"
CLIENT = "vllm bench serve"
SUBDIR = "ab"
_TOP = {
    **HEAD,
    "concurrency": int,
    "workload": dict,
    "arms": dict,
    "override": (dict, type(None)),
    "verdict": dict,
    "sha256": str,
}
_ARM = {
    "argv": list,
    "description": str,
    "client": str,
    "bench_command": str,
    "bench_result": (dict, type(None)),
    "output_throughput_tok_s": (int, float),
    "acceptance_length": (int, float, type(None)),
    "ttft_ms": dict,
    "tpot_ms": dict,
    "itl_ms": dict,
    "requests": int,
    "failed": int,
    "errors": list,
}
_WORKLOAD = {
    "client": str,
    "dataset": str,
    "requests": int,
    "input_len": int,
    "max_tokens": int,
    "seed": int,
    "ignore_eos": bool,
}
# bench's flag for each workload field (vllm/benchmarks/datasets/datasets.py, rocm_dspark.validate.bench)
_FLAGS = {
    "--dataset-name": "dataset",
    "--num-prompts": "requests",
    "--random-input-len": "input_len",
    "--random-output-len": "max_tokens",
    "--seed": "seed",
}
ARMS = ("block", "adaptive")


class ABRecord(NamedTuple):
    id: str
    created_at: str
    finished_at: str
    toolkit_version: str
    host: dict
    selection: dict
    fingerprint: dict
    concurrency: int
    workload: dict
    arms: dict
    override: dict | None
    verdict: dict
    sha256: str


def directory(state_dir=None):
    return store.state_dir(state_dir) / SUBDIR


def verdict_of(arms: dict, concurrency: int) -> dict:
    """adaptive pays when its output tok/s beat block's with every request of both arms served."""
    block, adaptive = arms["block"], arms["adaptive"]
    if block["failed"] or adaptive["failed"] or not block["output_throughput_tok_s"]:
        return {
            "gain_pct": None,
            "pays": False,
            "text": f"no verdict at c={concurrency}: requests failed (block {block['failed']}, adaptive "
            f"{adaptive['failed']})",
        }
    gain = round(100.0 * (adaptive["output_throughput_tok_s"] / block["output_throughput_tok_s"] - 1.0), 2)
    pays = gain > 0
    return {
        "gain_pct": gain,
        "pays": pays,
        "text": f"adaptive {'pays' if pays else 'loses'} at c={concurrency}: {gain:+.1f}% output tok/s "
        f"({adaptive['output_throughput_tok_s']:g} vs {block['output_throughput_tok_s']:g})",
    }


def _flag(words: list[str], name: str) -> str | None:
    for i, w in enumerate(words):
        if w == name and i + 1 < len(words):
            return words[i + 1]
        if w.startswith(name + "="):
            return w.split("=", 1)[1]
    return None


def _check_arm(where: str, arm: dict, workload: dict, concurrency: int) -> None:
    """The arm ran the record's workload through bench, and its numbers are its bench result's."""
    if workload["client"] != CLIENT or arm["client"] != CLIENT:
        raise RecordError(f"{where} was measured by {arm['client']!r} (workload: {workload['client']!r}), not {CLIENT}")
    try:
        words = shlex.split(arm["bench_command"])
    except ValueError:
        raise RecordError(f"{where}.bench_command is not a shell command") from None
    if "bench" not in words or words[words.index("bench") + 1 : words.index("bench") + 2] != ["serve"]:
        raise RecordError(f"{where}.bench_command is not `vllm bench serve`")
    want = {flag: str(workload[key]) for flag, key in _FLAGS.items()} | {"--max-concurrency": str(concurrency)}
    for flag, value in want.items():
        if (got := _flag(words, flag)) != value:
            raise RecordError(f"{where}.bench_command has {flag} {got}, the record {value}")
    if ("--ignore-eos" in words) != workload["ignore_eos"] or arm["requests"] != workload["requests"]:
        raise RecordError(f"{where} did not run the record's workload (ignore_eos, requests)")
    res, completed, tok_s = arm["bench_result"], 0, 0.0
    if res is not None:
        try:
            completed = res["completed"]
            tok_s = 0.0 if res["output_throughput"] is None else round(float(res["output_throughput"]), 2)
            ran = (res["num_prompts"], res["max_concurrency"])
        except (KeyError, TypeError, ValueError):
            raise RecordError(
                f"{where}.bench_result lacks bench's completed, output_throughput, num_prompts or max_concurrency"
            ) from None
        if ran != (arm["requests"], concurrency) or not isinstance(completed, int) or not 0 <= completed <= ran[0]:
            raise RecordError(
                f"{where}.bench_result ran {ran[0]} prompts at concurrency {ran[1]} ({completed} "
                f"completed), the record {arm['requests']} at {concurrency}"
            )
    if arm["failed"] != arm["requests"] - completed or arm["output_throughput_tok_s"] != tok_s:
        raise RecordError(
            f"{where}: failed {arm['failed']} and {arm['output_throughput_tok_s']} tok/s are not its "
            f"bench result's ({arm['requests'] - completed}, {tok_s})"
        )


def parse_data(data) -> ABRecord:
    data = check_preamble(data, SCHEMA, _TOP)
    if set(data["arms"]) != set(ARMS):
        raise RecordError(f"arms must be exactly {ARMS}")
    check_keys(data["workload"], _WORKLOAD, "workload")
    if data["concurrency"] < 1:
        raise RecordError("concurrency must be positive")
    for name in ARMS:
        check_keys(data["arms"][name], _ARM, f"arms.{name}")
        _check_arm(f"arms.{name}", data["arms"][name], data["workload"], data["concurrency"])
    if data["verdict"] != verdict_of(data["arms"], data["concurrency"]):
        raise RecordError("verdict does not follow from the arms' numbers")
    return ABRecord(**{k: data[k] for k in ABRecord._fields})


def parse(text: str | bytes) -> ABRecord:
    return parse_data(parse_text(text))


def build(*, record_id: str, **fields) -> dict:
    """A JSON-ready record with its verdict and digest (record.seal): `fields` are the other keys of _TOP but
    schema, verdict and sha256; a key missing or unknown fails seal's parse-back."""
    data = {"schema": SCHEMA, "id": record_id, **fields}
    data["concurrency"] = int(data["concurrency"])
    data["verdict"] = verdict_of(data["arms"], data["concurrency"])
    return seal(data, "A/B", parse_data)


def write(state_dir, data: dict):
    """Sign with this host's key and write atomically, as probe records are (store.write_record)."""
    return store.write_record(directory(state_dir), data)


def load(state_dir=None, names: list[str] | None = None) -> store.Loaded:
    """The A/B records in `<state>/ab/`, checked by the probe records' trust model (store.load_signed)."""
    return store.load_signed(directory(state_dir), names, parse_data, kind="A/B record", label="A/B record")
