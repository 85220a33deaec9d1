"""An A/B evidence record: one workload at one concurrency against block verification, then adaptive.

Shape (schema "rocm-dspark/ab-record/1"), strict JSON like the probe's record (rocm_dspark.probe.record):
    id, created_at, finished_at, toolkit_version     strings (id = UTC time + random suffix)
    host                                             {hostname, platform}
    selection                                        the flags the plan was resolved from
    fingerprint                                      fingerprint.FIELDS of this host and the adaptive plan
    concurrency                                      the workload's concurrency (what the gate matches)
    workload                                         {requests, max_tokens, prompts}
    arms                                             {"block": ARM, "adaptive": ARM}; ARM = {argv, description,
                                                     output_throughput_tok_s, acceptance_length, ttft_ms,
                                                     tpot_ms, itl_ms, requests, failed}
    override                                         null, or {kind, block, adaptive}: the arms ran other
                                                     commands than the plan's (e.g. --server-json); such a
                                                     record never counts for the gate
    verdict                                          {gain_pct, pays, text}, recomputed and checked on read
    sha256                                           digest of every other key, canonical JSON
    hmac                                             HMAC-SHA256 under this host's key (store.write_record)

Files live in `<state dir>/ab/<id>.json`, signed and written atomically, and are read by the probe
records' trust model (rocm_dspark.probe.store, README). Imports stay light: the gate reads these
on the recipe path.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from rocm_dspark.errors import UsageError
from rocm_dspark.probe import store
from rocm_dspark.probe.record import RecordError, check_keys, check_preamble, content_hash, parse_text

SCHEMA = "rocm-dspark/ab-record/1"
SUBDIR = "ab"
ID_PATTERN = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{8}$")
_TOP = {"schema": str, "id": str, "created_at": str, "finished_at": str, "toolkit_version": str, "host": dict,
        "selection": dict, "fingerprint": dict, "concurrency": int, "workload": dict, "arms": dict,
        "override": (dict, type(None)), "verdict": dict, "sha256": str}
_ARM = {"argv": list, "description": str, "output_throughput_tok_s": (int, float),
        "acceptance_length": (int, float, type(None)), "ttft_ms": dict, "tpot_ms": dict, "itl_ms": dict,
        "requests": int, "failed": int}
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
        return {"gain_pct": None, "pays": False,
                "text": f"no verdict at c={concurrency}: requests failed (block {block['failed']}, adaptive "
                        f"{adaptive['failed']})"}
    gain = round(100.0 * (adaptive["output_throughput_tok_s"] / block["output_throughput_tok_s"] - 1.0), 2)
    pays = gain > 0
    return {"gain_pct": gain, "pays": pays,
            "text": f"adaptive {'pays' if pays else 'loses'} at c={concurrency}: {gain:+.1f}% output tok/s "
                    f"({adaptive['output_throughput_tok_s']:g} vs {block['output_throughput_tok_s']:g})"}


def parse_data(data) -> ABRecord:
    data = check_preamble(data, SCHEMA, _TOP)
    if set(data["arms"]) != set(ARMS):
        raise RecordError(f"arms must be exactly {ARMS}")
    for name in ARMS:
        check_keys(data["arms"][name], _ARM, f"arms.{name}")
    if data["concurrency"] < 1:
        raise RecordError("concurrency must be positive")
    if data["verdict"] != verdict_of(data["arms"], data["concurrency"]):
        raise RecordError("verdict does not follow from the arms' numbers")
    return ABRecord(**{k: data[k] for k in ABRecord._fields})


def parse(text: str | bytes) -> ABRecord:
    return parse_data(parse_text(text))


def build(*, record_id: str, created_at: str, finished_at: str, toolkit_version: str, host: dict, selection: dict,
          fingerprint: dict, concurrency: int, workload: dict, arms: dict, override: dict | None) -> dict:
    data = {"schema": SCHEMA, "id": record_id, "created_at": created_at, "finished_at": finished_at,
            "toolkit_version": toolkit_version, "host": host, "selection": selection, "fingerprint": fingerprint,
            "concurrency": int(concurrency), "workload": workload, "arms": arms, "override": override}
    try:
        data = json.loads(json.dumps(data, allow_nan=False, default=str))
    except ValueError as exc:
        raise UsageError(f"A/B record is not JSON-serialisable: {exc}") from None
    data["verdict"] = verdict_of(data["arms"], data["concurrency"])
    data["sha256"] = content_hash(data)
    try:
        parse_data(data)
    except RecordError as exc:
        raise UsageError(f"internal error: the A/B built a record that fails its schema: {exc}") from None
    return data


def write(state_dir, data: dict):
    """Sign with this host's key and write atomically, as probe records are (store.write_record)."""
    return store.write_record(directory(state_dir), data)


def load(state_dir=None, names: list[str] | None = None) -> store.Loaded:
    """The A/B records in `<state>/ab/`, checked by the probe records' trust model (store.load_signed)."""
    target = directory(state_dir)
    names = store.record_names(target) if names is None else names
    return store.load_signed(target, names, parse_data, kind="A/B record", label="A/B record")
