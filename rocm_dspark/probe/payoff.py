"""The gate's payoff half: does adaptive verification pay for the declared workload (--concurrency C)?

Evidence, in order (docs/plan.md, "Adaptive verification where it pays"; the trust rules: docs/trust.md):
  1. The newest A/B record (rocm_dspark.probe.ab_record) that counts: trusted, the plan's own commands (no
     override), this host and plan (the probe's fingerprint), measured at exactly C. It decides: pays or loses.
  2. Otherwise this host's calibration (probe.calibration_record), then the public prediction
     (recipes/adaptive_payoff.yaml: the recipe path must not import numpy): the gain at C, interpolated in
     log2(C), decides only when the stated error cannot flip its sign.
  3. No --concurrency: unknown.

Imports stay light (yaml, json): this runs on `rocm-dspark recipe` when a probe record proves adaptive
verification.
"""

from __future__ import annotations

import math
from typing import NamedTuple

PAYS, LOSES, UNKNOWN = "pays", "loses", "unknown"
_SHOWN = 3


class Payoff(NamedTuple):
    state: str  # pays | loses | unknown
    evidence: str  # "A/B record <id>" | "prediction" | "none"
    text: str  # one line for the notes
    record: str | None = None


def _interpolate(points: dict, concurrency: int) -> tuple[float, str]:
    xs = sorted(int(c) for c in points)
    if concurrency in xs:
        return float(points[concurrency]), ""
    if concurrency > xs[-1]:  # the grid ends at the profile's max_num_seqs: more requests queue
        return float(points[xs[-1]]), (
            f" (c={concurrency} is above the profile's max_num_seqs {xs[-1]}: the running batch stays {xs[-1]})"
        )
    if concurrency < xs[0]:
        return float(points[xs[0]]), f" (below the planned c={xs[0]}: value there)"
    hi = next(x for x in xs if x > concurrency)
    lo = max(x for x in xs if x < concurrency)
    t = (math.log2(concurrency) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return float(points[lo]) + t * (float(points[hi]) - float(points[lo])), ""


def predicted(model_key: str, gpu: str, concurrency: int, tp: int | None = None) -> Payoff:
    from rocm_dspark.recipe.catalog import load_yaml, recipes_dir

    path = recipes_dir() / "adaptive_payoff.yaml"
    try:
        data = load_yaml(path)
        entry = data["models"][model_key]
        prof = entry["profiles"][gpu]
    except (KeyError, TypeError, OSError):
        return Payoff(UNKNOWN, "none", f"no predicted payoff for {model_key} on {gpu} in {path.name}")
    except Exception as exc:  # a broken data file must not break `recipe`: say so and stay off
        return Payoff(UNKNOWN, "none", f"{path.name} unreadable ({type(exc).__name__})")
    layout = "" if tp in (None, prof["tp"]) else f"; predicted for the profile's TP{prof['tp']}, not TP{tp}"
    capture = (
        f"; capture size {prof['capture_size']} holds fixed K's verify batch, so no fixed-K arm leaves the graphs"
        if prof.get("capture_size")
        else ""
    )
    return _predicted(
        prof,
        concurrency,
        "prediction",
        f"calibrated planner, {data.get('calibration')}, acceptance "
        f"length {entry['acceptance_length']:g}{layout}{capture}",
    )


def _predicted(fit: dict, concurrency: int, evidence: str, source: str) -> Payoff:
    """A fit's gain at `concurrency`: it decides only when its stated error cannot flip the sign."""
    gain, where = _interpolate({int(c): g for c, g in fit["gain_pct"].items()}, concurrency)
    err = float(fit["error_pp"])
    state = PAYS if gain - err > 0 else (LOSES if gain + err < 0 else UNKNOWN)
    word = {PAYS: "pays", LOSES: "loses", UNKNOWN: "cannot be told apart from zero"}[state]
    return Payoff(
        state,
        evidence,
        f"predicted {gain:+.1f} +- {err:g} points over block verification at c={concurrency}{where}: {word} ({source})",
    )


def gate_prediction(model_key: str, gpu_key: str, tp: int, concurrency: int, state_dir=None):
    """The gate's payoff prediction from this host's calibration (no numpy: the record carries the gains),
    or None when no trusted record is stored for this model, GPU and TP."""
    from rocm_dspark.probe.calibration_record import newest

    rec, _ = newest(model_key, gpu_key, tp, state_dir)
    if rec is None:
        return None
    pay = rec["payoff"]
    return _predicted(
        pay,
        concurrency,
        f"this host's calibration {rec['id']}",
        f"this host's calibration {rec['id']} from plan --calibrate, used ahead of the public one; "
        f"capture size {pay['capture_size']} holds fixed K's verify batch",
    )


def from_ab_records(
    catalog, plan, concurrency: int, state_dir=None, *, current=None, soft: dict | None = None
) -> tuple[Payoff | None, list[str]]:
    """The newest A/B record that counts for this host, plan and concurrency, or None and why not."""
    from rocm_dspark.probe import ab_record, store

    directory = ab_record.directory(state_dir)
    names = store.record_names(directory)
    if not names:
        return None, []
    loaded = ab_record.load(state_dir, names)  # the probe records' trust model: signed, safe reads
    if loaded.untrusted:
        return None, [f"A/B records in {directory} are not trusted: {loaded.untrusted}"]
    from rocm_dspark.probe import fingerprint

    current = current if current is not None else fingerprint.current_fingerprint(catalog, plan, soft=soft)
    notes = list(loaded.notes)
    for path, rec in loaded.trusted:  # newest first, by the signed finished_at
        if rec.override is not None:
            notes.append(
                f"A/B record {rec.id} ran other commands than the plan's ({rec.override.get('kind')}): does not count"
            )
            continue
        differ = fingerprint.mismatches(rec.fingerprint, current)
        if differ:
            notes.append(f"A/B record {rec.id} is for " + ", ".join(differ) + ": ignored")
            continue
        if rec.concurrency != concurrency:
            notes.append(f"A/B record {rec.id} measured c={rec.concurrency}, not c={concurrency}")
            continue
        if rec.verdict["gain_pct"] is None:
            notes.append(f"A/B record {rec.id}: {rec.verdict['text']}")
            continue
        return Payoff(
            PAYS if rec.verdict["pays"] else LOSES,
            f"A/B record {rec.id}",
            f"A/B record {rec.id} ({rec.created_at}): {rec.verdict['text']}",
            str(path),
        ), notes
    return None, notes


def payoff_verdict(
    catalog, plan, concurrency: int | None, state_dir=None, *, current=None, soft: dict | None = None
) -> Payoff:
    """Pays, loses or unknown for `concurrency` on this LaunchPlan, and which evidence decided."""
    if concurrency is None:
        return Payoff(
            UNKNOWN,
            "none",
            "no workload declared: pass --concurrency C (the concurrent requests you "
            "serve) so the gate can check that adaptive verification pays there",
        )
    decided, notes = from_ab_records(catalog, plan, concurrency, state_dir, current=current, soft=soft)
    if decided is not None:
        return decided
    host = gate_prediction(plan.model_key, plan.gpu, plan.tp, concurrency, state_dir)  # `plan --calibrate`
    pred = host if host is not None else predicted(plan.model_key, plan.gpu, concurrency, plan.tp)
    if notes:
        shown = "; ".join(notes[:_SHOWN]) + (f"; and {len(notes) - _SHOWN} more" if len(notes) > _SHOWN else "")
        pred = pred._replace(text=f"{pred.text}; no A/B record decides ({shown})")
    return pred
