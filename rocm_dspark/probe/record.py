"""A probe record: one run's fingerprint, level results and evidence, as strict JSON.

Schema "rocm-dspark/probe-record/1"; its keys and their types are _TOP, _LEVEL and fingerprint.FIELDS. A record
with a `live_override` (how the live level deviated from the plan: {"kind": "command-file", ...}) never counts
its live level for the gate. `sha256`, over every other key in canonical JSON, catches edits and corruption (a
hand-edited "passed": true), but anyone who can write the state directory can recompute it: the store's `hmac`
is the signature (docs/trust.md). The parse is strict (inputs.parse_json, then check_preamble, which every
record kind shares): NaN, duplicate keys, unknown or missing keys, wrong types or a wrong digest raise
RecordError, and the gate ignores such a file.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from rocm_dspark.errors import UsageError
from rocm_dspark.probe.fingerprint import FIELDS

SCHEMA = "rocm-dspark/probe-record/1"
LEVELS = ("static", "kernel", "live")
ID_PATTERN = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{8}$")


class RecordError(Exception):
    """A record that does not parse or does not match the schema: never trusted."""


class LevelResult(NamedTuple):
    """One level's outcome. `valid_for_gating` says whether this evidence may count at all (e.g. False
    for a kernel run in the Triton interpreter, or a live run of another command than the plan's)."""

    name: str
    passed: bool
    valid_for_gating: bool
    reason: str  # one line: why it passed or failed
    gating_note: str  # one line: why it does or does not count for the gate
    started_at: str
    seconds: float
    evidence: dict


class Record(NamedTuple):
    id: str
    created_at: str
    finished_at: str
    toolkit_version: str
    host: dict
    selection: dict
    fingerprint: dict
    levels_requested: tuple[str, ...]
    levels: tuple[LevelResult, ...]
    live_override: dict | None
    sha256: str

    def level(self, name: str) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.name == name), None)


# --- writing ---------------------------------------------------------------------------------------


def canonical(body: dict) -> bytes:
    """The bytes a digest or signature covers (the content hash here, the hmac in store.signature)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def content_hash(data: dict) -> str:
    """sha256 over every key but `sha256`, in canonical JSON."""
    import hashlib  # only when a record is read or written, not on every recipe run

    return hashlib.sha256(canonical({k: v for k, v in data.items() if k not in ("sha256", "hmac")})).hexdigest()


def seal(data: dict, what: str, parse) -> dict:
    """`data` as it is stored, with its digest: round-tripped through JSON so what is hashed is exactly what is
    stored (tuples -> lists, etc.). UsageError if it would not parse back (a bug): `what` names the writer."""
    try:
        data = json.loads(json.dumps(data, allow_nan=False, default=str))
    except ValueError as exc:
        raise UsageError(f"{what} record is not JSON-serialisable: {exc}") from None
    data["sha256"] = content_hash(data)
    try:
        parse(data)
    except RecordError as exc:  # our own output must satisfy our own schema
        raise UsageError(f"internal error: the {what} built a record that fails its schema: {exc}") from None
    return data


def build_record(*, record_id: str, **fields) -> dict:
    """A JSON-ready record with its digest (seal): `fields` are the other keys of _TOP but schema and sha256
    (levels as LevelResults or their dicts); a key missing or unknown fails seal's parse-back."""
    data = {"schema": SCHEMA, "id": record_id, **fields}
    data["levels"] = [lv._asdict() if isinstance(lv, LevelResult) else lv for lv in data["levels"]]
    return seal(data, "probe", parse_record_data)


# --- reading ---------------------------------------------------------------------------------------

# The keys a probe record and an A/B record (rocm_dspark.probe.ab_record) both open with.
HEAD = {
    "schema": str,
    "id": str,
    "created_at": str,
    "finished_at": str,
    "toolkit_version": str,
    "host": dict,
    "selection": dict,
    "fingerprint": dict,
}
_TOP = {
    **HEAD,
    "levels_requested": list,
    "levels": list,
    "live_override": (dict, type(None)),
    "sha256": str,
}
_LEVEL = {
    "name": str,
    "passed": bool,
    "valid_for_gating": bool,
    "reason": str,
    "gating_note": str,
    "started_at": str,
    "seconds": (int, float),
    "evidence": dict,
}
_FINGERPRINT = {key: kind for key, _, kind in FIELDS}


def _type_ok(value, kind) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        return False  # True is an int in Python; not in this schema
    return isinstance(value, kinds)


def check_keys(obj: dict, spec: dict, where: str) -> None:
    missing = sorted(spec.keys() - obj.keys())
    extra = sorted(obj.keys() - spec.keys())
    if missing:
        raise RecordError(f"{where} lacks {', '.join(missing)}")
    if extra:
        raise RecordError(f"{where} has unexpected {', '.join(extra)}")
    for key, kind in spec.items():
        if not _type_ok(obj[key], kind):
            raise RecordError(f"{where}.{key} has the wrong type ({type(obj[key]).__name__})")


def parse_text(text: str | bytes) -> object:
    """A record file's text as JSON (inputs.parse_json: no NaN, no duplicate key); RecordError otherwise."""
    from rocm_dspark.inputs import JSONInputError, parse_json

    try:
        return parse_json(text, "record")
    except JSONInputError as exc:
        raise RecordError(f"not valid JSON ({exc.detail})") from None


def check_preamble(data, schema: str, top: dict) -> dict:
    """The checks every record kind shares (probe, A/B, host calibration): a JSON object of `schema` with
    exactly the keys and types of `top`, an id made by store.new_record_id, and a sha256 that matches.
    Returns the record without its hmac (the store's signature, checked there); RecordError otherwise."""
    if not isinstance(data, dict):
        raise RecordError("not a JSON object")
    data = {k: v for k, v in data.items() if k != "hmac"}
    if data.get("schema") != schema:
        raise RecordError(f"schema is {data.get('schema')!r}, expected {schema!r}")
    check_keys(data, top, "record")
    if not ID_PATTERN.match(data["id"]):
        raise RecordError(f"id {data['id']!r} is not <UTC time>-<8 hex>")
    if data["sha256"] != content_hash(data):
        raise RecordError("content hash does not match (edited or corrupted)")
    return data


def parse_record_data(data) -> Record:
    data = check_preamble(data, SCHEMA, _TOP)
    check_keys(data["fingerprint"], _FINGERPRINT, "fingerprint")
    launch = data["fingerprint"]["launch"]
    if (
        set(launch) != {"argv", "env"}
        or not isinstance(launch["argv"], list)
        or not isinstance(launch["env"], dict)
        or not all(isinstance(t, str) for t in launch["argv"])
        or not all(isinstance(v, str) for v in launch["env"].values())
    ):
        raise RecordError("fingerprint.launch must be {argv: [str], env: {str: str}}")
    requested = data["levels_requested"]
    if not requested or any(r not in LEVELS for r in requested) or len(set(requested)) != len(requested):
        raise RecordError(f"levels_requested {requested!r} must be distinct names from {LEVELS}")
    levels = []
    for i, raw in enumerate(data["levels"]):
        if not isinstance(raw, dict):
            raise RecordError(f"levels[{i}] is not an object")
        check_keys(raw, _LEVEL, f"levels[{i}]")
        if raw["name"] not in requested:
            raise RecordError(f"levels[{i}] is {raw['name']!r}, which was not requested")
        levels.append(LevelResult(**raw))
    names = [lv.name for lv in levels]
    if len(set(names)) != len(names):
        raise RecordError(f"a level appears twice: {names}")
    fields = {k: data[k] for k in Record._fields if k not in ("levels", "levels_requested")}
    return Record(levels=tuple(levels), levels_requested=tuple(requested), **fields)


def parse_record(text: str | bytes) -> Record:
    """Strict parse of a record file's text; RecordError says what is wrong."""
    return parse_record_data(parse_text(text))
