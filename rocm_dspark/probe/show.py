"""`rocm-dspark probe --show` and the probe's own summary: records as text or JSON."""

from __future__ import annotations

from typing import NamedTuple

from rocm_dspark.errors import UsageError
from rocm_dspark.probe import fingerprint, store
from rocm_dspark.probe.gate import evidence_state, load_records
from rocm_dspark.probe.record import Record


class Entry(NamedTuple):
    path: str
    record: Record | None  # None: the file is not a valid record
    error: str | None
    gate_state: str | None  # a recipe.plan.State (fingerprint aside)
    gate_reason: str | None


def latest(state_dir=None, limit: int = 5) -> list[Entry]:
    """The newest records (by their signed content), each with what the gate makes of it."""
    loaded = load_records(state_dir, need_key=False)
    if loaded.untrusted:
        raise UsageError(f"probe records in {store.records_dir(state_dir)} are not trusted: {loaded.untrusted}")
    out = []
    for c in loaded.checked[:limit]:
        if c.record is None:
            out.append(Entry(str(c.path), None, c.problem, None, None))
        elif c.problem:
            out.append(Entry(str(c.path), c.record, None, "untrusted", f"the record {c.problem}"))
        else:
            out.append(Entry(str(c.path), c.record, None, *evidence_state(c.record)))
    return out


def record_json(record: Record) -> dict:
    data = record._asdict()
    data["levels"] = [lv._asdict() for lv in record.levels]
    data["levels_requested"] = list(record.levels_requested)
    return data


def entries_json(entries: list[Entry]) -> list[dict]:
    return [
        {
            "path": e.path,
            "valid": e.record is not None,
            "error": e.error,
            "gate": None if e.record is None else {"state": e.gate_state, "reason": e.gate_reason},
            "record": None if e.record is None else record_json(e.record),
        }
        for e in entries
    ]


def level_lines(record: Record) -> list[str]:
    lines = []
    for lv in record.levels:
        lines.append(f"  {lv.name:<7}{'PASS' if lv.passed else 'FAIL'}  {lv.reason}")
        lines.append(f"  {'':<7}      ({lv.gating_note}; {lv.seconds:.1f} s)")
        rs = lv.evidence.get("rescore") if lv.name == "live" and isinstance(lv.evidence, dict) else None
        if isinstance(rs, dict):
            lines.append(f"  {'':<7}      {reference_line(rs)}")
    return lines


def reference_line(rs: dict) -> str:
    """The re-scoring reference a live level used and its self-check (vllm#53488), in one line."""
    ref = rs.get("reference") if isinstance(rs.get("reference"), dict) else {}
    check = rs.get("self_check") if isinstance(rs.get("self_check"), dict) else None
    text = f"re-scoring reference: {ref.get('route') or 'not recorded (before vllm#53488 was known)'}"
    if ref.get("padded_to"):
        text += f", padded to {ref['padded_to']} tokens (capture size {ref.get('capture_size')})"
    if check:
        text += (
            f"; self-check: {check.get('positions')} positions of {check.get('prompts')} prompt(s) padded and "
            f"unpadded, {check.get('disagreements')} disagree"
        )
    return text


_GATE_LINES = {  # what the gate makes of a record, by its state; anything else cannot turn it on
    "proven": "gate: this record turns adaptive verification ON for this host and plan ({why})",
    "untrusted": "gate: ignores this record: {why}",
    "refuted": "gate: this record keeps adaptive verification OFF for this host and plan: {why}",
}


def record_lines(record: Record, path: str, state: str, why: str) -> list[str]:
    lines = [f"record {record.id}  {record.created_at}  {path}", f"  {fingerprint.summary(record.fingerprint)}"]
    if record.live_override:
        where = record.live_override.get("path") or record.live_override.get("base_url") or ""
        lines.append(f"  live override ({record.live_override.get('kind')}): {where}")
    lines.extend(level_lines(record))
    line = _GATE_LINES.get(state, "gate: this record cannot turn adaptive verification on: {why}")
    lines.append("  " + line.format(why=why))
    return lines


def show_lines(entries: list[Entry], directory) -> list[str]:
    if not entries:
        return [f"no probe record in {directory}"]
    lines: list[str] = []
    for e in entries:
        if lines:
            lines.append("")
        if e.record is None:
            lines.append(f"{e.path}: not a valid probe record ({e.error}): the gate ignores it")
        else:
            lines.extend(record_lines(e.record, e.path, e.gate_state, e.gate_reason))
    return lines
