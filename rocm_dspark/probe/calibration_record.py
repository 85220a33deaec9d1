"""This host's calibration, the record: `rocm-dspark plan --calibrate FILE` keeps the fit of
rocm_dspark.planner.host_fit, signed, in `<state dir>/calibration/<id>.json` (docs/calibration.md).

Later `plan` and the gate's payoff half use the newest trusted record for the model, GPU and TP ahead of
the public calibration, and say so. Records are read by the probe records' trust model
(rocm_dspark.probe.store: owner and mode checks, bounded safe reads, this host's HMAC, sane times).
Module-level imports stay light: the gate reads records on the `recipe` path (gate_prediction).
"""

from __future__ import annotations

import json

from rocm_dspark.probe import store
from rocm_dspark.probe.record import check_keys, check_preamble, seal

SCHEMA = "rocm-dspark/host-calibration/1"
SUBDIR = "calibration"
_TOP = {
    "schema": str,
    "id": str,
    "created_at": str,
    "finished_at": str,
    "model": str,
    "gpu": str,
    "tp": int,
    "source_file": str,
    "points": list,
    "params": dict,
    "acceptance_length": (int, float),
    "loo_error_pct": (int, float),
    "payoff_error_pp": (int, float),
    "payoff": dict,
    "sha256": str,
}


def directory(state_dir=None):
    return store.state_dir(state_dir) / SUBDIR


def build_record(calib, rows, payoff: dict, source_file: str) -> dict:
    from dataclasses import asdict

    now = store.utc_now()
    data = {
        "schema": SCHEMA,
        "id": store.new_record_id(now),
        "created_at": store.iso(now),
        "finished_at": store.iso(now),
        "model": calib.model,
        "gpu": calib.gpu,
        "tp": int(calib.tp),
        "source_file": source_file,
        "points": rows,
        "params": asdict(calib.params),
        "acceptance_length": calib.acceptance_length,
        "loo_error_pct": calib.held_out_error_pct,
        "payoff_error_pp": calib.held_out_payoff_error_pp,
        "payoff": payoff,
        "not_identified": list(calib.not_identified),
    }
    if calib.mono:  # the mono term this host measured (host_fit._mono_term); absent: the public one stays
        data["mono"] = dict(calib.mono)
    return seal(data, "calibration", parse_data)


class HostRecord(dict):
    """A parsed record: a dict with the .id and .finished_at that store.load_signed reads."""

    id = property(lambda self: self["id"])
    finished_at = property(lambda self: self["finished_at"])


def parse_data(data) -> HostRecord:
    # not_identified and mono: newer fields; an older record without them parses as before
    extra = {k: t for k, t in (("not_identified", list), ("mono", dict)) if isinstance(data, dict) and k in data}
    data = check_preamble(data, SCHEMA, {**_TOP, **extra})
    if "mono" in data:
        check_keys(data["mono"], {"speedup": (int, float), "loo_error_pct": (int, float), "runs": int}, "record mono")
    return HostRecord(data)


def write(state_dir, data: dict):
    return store.write_record(directory(state_dir), data)


def newest(model_key: str, gpu_key: str, tp: int, state_dir=None):
    """(record or None, note or None): the newest trusted record for this model, GPU and TP."""
    target = directory(state_dir)
    loaded = store.load_signed(target, None, parse_data, kind="host calibration", label="calibration")
    if loaded.untrusted:
        return None, f"host calibrations in {target} are not trusted ({loaded.untrusted}): the public one is used"
    for _, rec in loaded.trusted:
        if (rec["model"], rec["gpu"], rec["tp"]) == (model_key, gpu_key, tp):
            from rocm_dspark.planner.host_fit import LOO_BOUND_PCT  # only with a record: not on every recipe run

            if rec["loo_error_pct"] > LOO_BOUND_PCT:  # kept by a toolkit without the bound
                return None, (
                    f"host calibration {rec['id']} has a leave-one-out error of {rec['loo_error_pct']:g}%, "
                    f"above the {LOO_BOUND_PCT:g}% bound (docs/calibration.md): the public one is used"
                )
            return rec, None
    return None, None


def host_calibration(model_key: str, gpu_key: str, tp: int, state_dir=None):
    """(Calibration or None, note): this host's stored fit for plan, ahead of the public calibration."""
    rec, note = newest(model_key, gpu_key, tp, state_dir)
    if rec is None:
        return None, note
    from rocm_dspark.planner.calibration import StepParams
    from rocm_dspark.planner.host_fit import calibration

    calib = calibration(
        StepParams(**{k: float(v) for k, v in rec["params"].items()}),
        acceptance_length=rec["acceptance_length"],
        loo_error_pct=rec["loo_error_pct"],
        payoff_error_pp=rec["payoff_error_pp"],
        points=rec["points"],
        model=rec["model"],
        gpu=rec["gpu"],
        tp=rec["tp"],
        not_identified=rec.get("not_identified", ()),
        mono=rec.get("mono"),
        source_url=f"{directory(state_dir)}/{rec['id']}.json",
        source_label=f"this host's calibration {rec['id']} ({len(rec['points'])} runs)",
    )
    return calib, (
        f"cost: this host's own calibration (plan --calibrate, record {rec['id']}, "
        f"{len(rec['points'])} runs, leave-one-out error {rec['loo_error_pct']:g}%) is used ahead of the "
        f"public one"
    )


def run_calibrate(
    catalog, model, gpu_key: str, path, state_dir=None, *, as_json: bool = False
) -> tuple[list[str], bool]:
    """Fit, show, and keep the fit as this host's calibration only within the leave-one-out bound:
    (lines, kept)."""
    from rocm_dspark.planner.host_fit import LOO_BOUND_PCT, TERMS, calibrate, public_mono
    from rocm_dspark.planner.payoff_table import grid_for
    from rocm_dspark.planner.profile import plan_profile
    from rocm_dspark.recipe.capture import capture_size

    calib, loo, rows = calibrate(path, catalog, model, gpu_key)
    profile = model.profiles[catalog.find_gpu(gpu_key).key]
    length = model.speculative.get("golden_acceptance_length") or calib.acceptance_length
    plan = plan_profile(
        catalog,
        model,
        gpu_key,
        concurrencies=grid_for(profile.max_num_seqs),
        acceptance_length=float(length),
        steps=1,
        calibration=calib,
    )
    payoff = {
        "tp": profile.tp,
        "error_pp": plan.payoff_error_pp,
        "acceptance_length": float(length),
        "capture_size": capture_size(profile.max_num_seqs, model.block_size, profile.capture_cap),
        "gain_pct": {str(r.concurrency): round(plan.adaptive_gain_pct(r), 1) for r in plan.rows},
    }
    source = ", ".join(map(str, path)) if isinstance(path, (list, tuple)) else str(path)
    # the step model's own runs decide; the mono runs' error decides only the mono term (host_fit._mono_term)
    step_loo = [e for e, r in zip(loo, rows) if not r.get("mono")]
    kept = max(step_loo) <= LOO_BOUND_PCT
    record = build_record(calib, rows, payoff, source)
    written = write(state_dir, record) if kept else None
    p = calib.params
    if as_json:
        out = {
            "record": str(written) if written else None,
            "kept": kept,
            "loo_bound_pct": LOO_BOUND_PCT,
            "leave_one_out_pct": [round(e, 2) for e in loo],
            "not_identified": list(calib.not_identified),
            "fold_notes": list(calib.notes),
            "mono": calib.mono,
            "params": record["params"],
            "payoff": payoff,
        }
        return [json.dumps(out, indent=2)], kept

    def term(name: str, text: str) -> str:
        return f"{name} not identified" if f"{name}_ms" in calib.not_identified else text

    eager = (
        "eager not identified"
        if "eager_launch_ms" in calib.not_identified
        else f"eager {p.eager_launch_ms:g} ms/layer + {p.eager_per_token_ms:g} ms/token above the capture size"
    )
    lines = [
        f"calibration of {model.key} on {calib.tp}x {calib.gpu} from {source}: {len(rows)} runs",
        f"fit: fixed {p.fixed_ms:.3f} ms + per request {p.per_request_ms:.4f} ms + per token {p.per_token_ms:.5f} ms "
        f"+ draft {p.draft_ms:.3f} ms + {term('adaptive', f'adaptive {p.adaptive_ms:.2f} ms')} + {eager}; "
        f"rho {p.rho:g}",
    ]
    with_mono = any(r.get("mono") for r in rows)
    for name in calib.not_identified:
        if name == "spread":
            lines.append(
                f"spread: not identified (needs {TERMS[name]}); one request class is used, not the public "
                "value: the adaptive overhead above is fitted to each run's measured acceptance length"
            )
        elif name == "mono":
            if not with_mono:  # else host_fit._mono_term's line (calib.notes) says why
                lines.append(
                    f"mono term: not identified (needs {TERMS[name]}, beside runs without it); {public_mono(catalog)}"
                )
        elif name != "eager_per_token_ms":  # the eager term is said once, by eager_launch_ms
            shown = "eager term" if name.startswith("eager") else name.removesuffix("_ms").replace("_", " ")
            value = (
                f"{p.eager_launch_ms:g} ms/layer + {p.eager_per_token_ms:g} ms/token"
                if name.startswith("eager")
                else f"{getattr(p, name):g}" + (" ms" if name.endswith("_ms") else "")
            )
            lines.append(f"{shown}: not identified (needs {TERMS[name]}); the public value {value} is used")
    lines += list(calib.notes)
    # the mono column only where a run used it: older output unchanged
    lines.append(
        f"{'arm':>12} {'K':>2} {'AV':>3} {'mono' if with_mono else ''}{' ' if with_mono else ''}{'conc':>5} "
        f"{'capture':>7} | {'measured':>9} | {'left-out error':>15}"
    )
    for r, e in zip(rows, loo):
        mono = f"{'yes' if r.get('mono') else 'no':>4} " if with_mono else ""
        lines.append(
            f"{r['arm'][:12]:>12} {r['k']:>2} {'yes' if r['adaptive'] else 'no':>3} {mono}{r['concurrency']:>5} "
            f"{r['capture_size']:>7} | {r['output_tok_s']:>9.1f} | {e:>15.1f}%"
        )
    lines.append(
        f"leave-one-out error{' (runs without mono)' if with_mono else ''}: max {max(step_loo):.1f}%, mean "
        f"{sum(step_loo) / len(step_loo):.1f}% (tok/s); stated for "
        f"plan: +-{calib.held_out_error_pct:g}% tok/s, +-{calib.held_out_payoff_error_pp:g} points of "
        f"adaptive gain (twice the tok/s error: a ratio of two predictions)"
    )
    if kept:
        lines.append(
            f"kept as this host's calibration: {written}; `plan` and the gate's payoff half use it ahead of "
            f"the public one"
        )
    else:
        lines.append(
            f"not kept: the leave-one-out error {max(step_loo):.1f}% is above the {LOO_BOUND_PCT:g}% bound "
            f"(docs/calibration.md); `plan` and the gate keep the public calibration. Measure more runs "
            f"(other concurrencies, repeats) and calibrate again"
        )
    return lines, kept
