"""Run the requested levels for a selection and write one record: the library behind `rocm-dspark probe`."""

from __future__ import annotations

import platform
import socket
import time
from pathlib import Path
from typing import NamedTuple

from rocm_dspark.errors import EnvironmentFailure, UsageError
from rocm_dspark.probe import fingerprint, store
from rocm_dspark.probe.gate import evidence_state
from rocm_dspark.probe.record import LEVELS, LevelResult, Record, build_record, parse_record_data

DEFAULT_DEADLINE_S = 3600.0  # the plan sets VLLM_ENGINE_READY_TIMEOUT_S=3600 for a 511 GB first load


class ProbeOutcome(NamedTuple):
    path: Path
    record: Record
    passed: bool  # every requested level passed
    gate_state: str  # a recipe.plan.State: what the gate makes of this record, its fingerprint aside
    gate_reason: str

    def summary(self) -> dict:
        """What `probe --json` prints."""
        return {
            "record_id": self.record.id,
            "record_path": str(self.path),
            "passed": self.passed,
            "levels": [
                {k: getattr(lv, k) for k in ("name", "passed", "valid_for_gating", "reason", "gating_note", "seconds")}
                for lv in self.record.levels
            ],
            "gate": {"state": self.gate_state, "reason": self.gate_reason},
        }


def parse_levels(text: str) -> tuple[str, ...]:
    names = [t.strip().lower() for t in (text or "").split(",") if t.strip()]
    bad = [n for n in names if n not in LEVELS]
    if not names or bad:
        raise UsageError(f"--levels {text!r}: use a comma-separated subset of {','.join(LEVELS)}")
    return tuple(n for n in LEVELS if n in names)  # always in dependency order


def _selection_dict(selection) -> dict:
    from rocm_dspark.recipe.secret_env import digest

    # --env values are kept by digest only (rocm_dspark/recipe/secret_env.py): a record never holds a secret.
    return {
        k: ([[n, digest(v_)] for n, v_ in v] if k == "extra_env" else list(v) if isinstance(v, tuple) else v)
        for k, v in selection._asdict().items()
    }


def _guarded(name: str, fn, progress) -> LevelResult:
    """Run one level; a bug in the probe fails the level (not valid for gating) instead of the run."""
    started, t0 = store.utc_now(), time.monotonic()
    try:
        return fn()
    except (UsageError, EnvironmentFailure):
        raise
    except Exception as exc:  # noqa: BLE001 - recorded as this level's reason
        progress(f"{name}: internal error: {type(exc).__name__}: {exc}")
        return LevelResult(
            name,
            False,
            False,
            f"internal error in the probe: {type(exc).__name__}: {exc}",
            "not valid for gating: the probe itself failed",
            store.iso(started),
            round(time.monotonic() - t0, 3),
            {},
        )


def run_probe(
    catalog,
    selection,
    *,
    levels=LEVELS,
    state_dir=None,
    deadline_s: float = DEFAULT_DEADLINE_S,
    live_target=None,
    attach_server=None,
    progress=lambda msg: None,
    kernel_python: str | None = None,
    earlier: Record | None = None,
    soft: dict | None = None,
) -> ProbeOutcome:
    """Run `levels` (subset of static, kernel, live) and write the record to the state directory.

    live_target: a live.LiveTarget replacing the plan's command (from a --server-json file: live.target_from_spec),
    recorded as an override.
    attach_server: a started VllmServer to use instead of starting one (`up`: the server it started); the live
    level counts only when /proc shows it serves the plan's own adaptive command (probe.serving).
    earlier: a record this host wrote for the same fingerprint (`up`: the levels that load no model, run before
    the first start); its levels not requested here are carried into this record, so one record holds all three.
    soft: the software the attached server runs when it is not this Python's (`up`'s container modes: the image's,
    as the gate reads it), for the fingerprint.
    """
    from rocm_dspark.probe import kernel, live, static

    if selection.benchmark_synthetic is not None:
        raise UsageError("--benchmark-synthetic fakes acceptance: the probe tests real adaptive verification; drop it")
    if deadline_s <= 0:
        raise UsageError(f"--deadline {deadline_s:g} must be a positive number of seconds")
    plan = fingerprint.adaptive_plan(catalog, selection)
    model = catalog.find_model(plan.model_key)
    if live_target is None and "live" in levels:
        live_target = live.target_from_plan(plan, model)
    directory = store.records_dir(state_dir)
    store.prepare_dir(directory)  # before an hour of work: refuse a directory whose records would not count
    created = store.utc_now()
    record_id = store.new_record_id(created)

    gpus = fingerprint.gpu_facts()
    host_fp = fingerprint.host_fingerprint(gpus, soft)
    fp = {**host_fp, **fingerprint.plan_fingerprint(plan, catalog)}
    progress(f"probe {record_id}: {fingerprint.summary(fp)}; levels {', '.join(levels)}")

    results: list[LevelResult] = []
    if earlier is not None:
        differ = fingerprint.mismatches(earlier.fingerprint, fp)
        if differ:
            raise UsageError(
                f"the earlier probe record {earlier.id} is for {', '.join(differ)}: its levels cannot be "
                f"carried into this one; run every level (--levels static,kernel,live)"
            )
        results = [lv for lv in earlier.levels if lv.name not in levels]
        levels = tuple(n for n in LEVELS if n in levels or any(lv.name == n for lv in results))
    run_level = {
        "static": lambda: static.run_static(plan, host_fp, progress=progress),
        "kernel": lambda: kernel.run_kernel(python=kernel_python, progress=progress),
        "live": lambda: live.run_live(
            live_target,
            deadline_s=deadline_s,
            log_path=directory / f"{record_id}.live.log",
            progress=progress,
            server=attach_server,
        ),
    }
    for name in levels:
        if any(r.name == name for r in results):
            continue
        result = _guarded(name, run_level[name], progress)
        progress(f"{name}: {'PASS' if result.passed else 'FAIL'}: {result.reason}")
        results.append(result)
    results.sort(key=lambda r: LEVELS.index(r.name))

    override = None
    if "live" in levels and live_target.source != "plan":
        override = {"kind": live_target.source, "path": live_target.detail, "argv": list(live_target.argv)}
    data = build_record(
        record_id=record_id,
        created_at=store.iso(created),
        finished_at=store.iso(store.utc_now()),
        toolkit_version=fp["toolkit_version"],
        host={"hostname": socket.gethostname(), "platform": platform.platform()},
        selection=_selection_dict(selection),
        fingerprint=fp,
        levels_requested=levels,
        levels=results,
        live_override=override,
    )
    path = store.write_record(directory, data)
    record = parse_record_data(data)
    state, why = evidence_state(record)
    return ProbeOutcome(path, record, all(r.passed for r in results), state, why)
