"""The gate: probe records -> Verdict (is adaptive verification proven on this host, for this plan?).

The rules are docs/probe.md's "Gate rules": among the records that match this host and plan, newest first, a
counting level that failed decides OFF, all three counting and passed decide ON, anything less sends the gate to
the next older record. What makes a level count, and what makes it prove, is level_counts and level_proves below
(a live level proves only with its tokens re-scored against a reference the drafter cannot reach: probe.rescore,
vllm#53488; a record from before that was known proves nothing).

Imports stay light (no torch/vllm/numpy/httpx, no dataclasses): this is on the recipe path, where with no record
on disk the gate costs one directory listing; store, evidence, record and fingerprint are imported inside the
functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rocm_dspark.probe import listing

if TYPE_CHECKING:
    from rocm_dspark.probe import store
    from rocm_dspark.probe.record import LevelResult, Record
    from rocm_dspark.recipe.plan import State

_SHOWN = 3  # notes kept in the verdict's one line; the rest are counted


def level_counts(level: LevelResult, record: Record) -> str | None:
    """None when this level's result counts as evidence for the gate, else why not."""
    from rocm_dspark.probe.evidence import GateEvidence

    ev = GateEvidence.of(level.evidence)
    if not level.valid_for_gating:
        why = level.gating_note.removeprefix("not valid for gating: ") or "not valid for gating"
        return f"its {level.name} level does not count ({why})"
    if level.name == "static" and ev.forced_platform is not False:
        return "its static level ran with the ROCm platform forced (no AMD GPU)"
    if level.name == "kernel" and ev.interpreted is not False:
        return "its kernel level ran in the Triton interpreter, not on the GPU"
    if level.name == "live" and record.live_override is not None:
        return "its live level ran another command than the plan's"
    if level.name == "live" and ev.attached is not False and ev.command_verified is not True:
        return "its live level attached to a server not shown to run the plan's command"
    if level.name == "live" and ev.reference_unreliable is True:
        return "its live level's re-scoring reference was unreliable (vllm#53488)"
    return None


def level_proves(level: LevelResult) -> str | None:
    """For a counting, passed level: None when its evidence is complete, else what is missing."""
    from rocm_dspark.probe.evidence import GateEvidence

    ev = GateEvidence.of(level.evidence)
    if level.name == "kernel":
        if ev.graph_replay is not True:
            return "its kernel level has no graph replay"
        if ev.negative_control_caught is not True:
            return "its kernel level did not show the negative control caught"
    if level.name == "live":
        if ev.adaptive_verification is not True:
            return "its live level did not run with enable_adaptive_verification on"
        if ev.ready is not True:
            return "its live level never saw the server ready"
        if ev.token_correct is not True:
            return "its live level did not prove the emitted tokens by re-scoring (probe.rescore)"
        if ev.reference_independent is not True:  # records from before the field: re-probe
            return (
                "its live level's re-scoring reference is not shown to be out of the drafter's reach "
                "(vllm#53488): re-probe"
            )
    return None


def evidence_state(record: Record) -> tuple[State, str]:
    """(PROVEN | REFUTED | NOT_PROVEN, why) for a record, ignoring its fingerprint."""
    from rocm_dspark.probe.record import LEVELS
    from rocm_dspark.recipe.plan import NOT_PROVEN, PROVEN, REFUTED

    gaps = []
    for name in LEVELS:
        level = record.level(name)
        if level is None:
            gaps.append(f"no {name} level")
            continue
        why_not = level_counts(level, record)
        if why_not:
            gaps.append(why_not)
            continue
        if not level.passed:
            return REFUTED, f"its {name} level failed: {level.reason}"
        missing = level_proves(level)
        if missing:
            gaps.append(missing)
    if gaps:
        return NOT_PROVEN, "; ".join(gaps)
    return PROVEN, (
        "static, GPU kernel (graph replay, negative control caught) and live (tokens re-scored "
        "against an independent reference, 0 violations) passed"
    )


def load_records(state_dir=None, names: list[str] | None = None, *, need_key: bool = True) -> store.Loaded:
    """Every candidate in probe/, checked by the README's trust model (store.load_signed)."""
    from rocm_dspark.probe import store
    from rocm_dspark.probe.record import parse_record_data

    return store.load_signed(
        listing.records_dir(state_dir), names, parse_record_data, kind="probe record", label="record", need_key=need_key
    )


def _joined(notes: list[str]) -> str:
    shown = notes[:_SHOWN]
    more = len(notes) - len(shown)
    return "; ".join(shown) + (f"; and {more} more record(s) not matching" if more else "")


def gate_verdict(catalog, plan, state_dir=None, *, gpus: dict | None = None, soft: dict | None = None):
    """The Verdict for this host and plan (resolve_plan's, before any verdict), from the trusted records in
    the state directory (README: trust model). The plan is not resolved again: its adaptive command is what
    a record must match. `soft`: the software the plan runs on, when not this Python's (an image's)."""
    from rocm_dspark.recipe.plan import PROVEN, REFUTED, Verdict

    directory = listing.records_dir(state_dir)
    names = listing.record_names(directory)
    if not names:
        return Verdict(False, f"no probe record in {directory}")
    loaded = load_records(state_dir, names)
    if loaded.untrusted:
        return Verdict(False, f"probe records in {directory} are not trusted: {loaded.untrusted}")
    from rocm_dspark.probe import fingerprint

    current = fingerprint.current_fingerprint(catalog, plan, gpus, soft)
    notes: list[str] = loaded.notes
    for path, record in loaded.trusted:
        differ = fingerprint.mismatches(record.fingerprint, current)
        if differ:
            notes.append(f"record {record.id} is for " + ", ".join(differ) + ": ignored")
            continue
        state, why = evidence_state(record)
        where = f"record {record.id} ({record.created_at}, {fingerprint.summary(record.fingerprint)})"
        if state == PROVEN:
            return Verdict(True, f"{where} matches this host and plan: {why}", str(path), PROVEN)
        if state == REFUTED:
            return Verdict.refuted(f"{where} matches this host and plan, but {why}", str(path))
        notes.append(f"record {record.id} matches but is not enough: {why}")
    return Verdict(False, f"{len(names)} probe record(s) in {directory}, none proves it here: {_joined(notes)}")
