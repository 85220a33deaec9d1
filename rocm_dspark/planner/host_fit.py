"""This host's calibration, the fit: `rocm-dspark plan --calibrate FILE` fits the step model to the operator's
own measurements (docs/calibration.md); rocm_dspark.probe.calibration_record keeps the fit, signed.

FILE is a plain table (CSV with a header, or JSON: a list of rows or {"rows": [...]}) with exactly the
columns COLUMNS, a `validate --ab` record (its two arms become two rows) or a `validate` report.json (one
row per sweep level of the plan it ran). One row is one measured run:
arm (a name), k (0 for no speculation), adaptive (true/false), concurrency, capture_size (the server's
largest captured graph size), output_tok_s, acceptance_length (tokens per request per step, 1 without
speculation); optionally `mono` (true where the server ran with --monokernel; false when absent). A
`validate` report or A/B record is tagged mono from its plan's argv. The fit imports numpy.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from rocm_dspark.errors import UsageError
from rocm_dspark.planner.calibration import (
    Calibration,
    StepParams,
    adaptive_overhead,
    design_row,
    left_out_by_concurrency,
    load_data,
    nonneg_lstsq,
    physics_for,
    predict_run_tok_s,
    stored,
)
from rocm_dspark.recipe.plan import Command

COLUMNS = ("arm", "k", "adaptive", "concurrency", "capture_size", "output_tok_s", "acceptance_length")
OPTIONAL = ("mono",)  # a newer column: a table without it is runs without --monokernel
# A fit whose worst left-out run is further off than this is shown but not kept for plan and the gate
# (docs/calibration.md: the reason for 25%).
LOO_BOUND_PCT = 25.0
# The terms a host fit may leave unidentified, and what a run needs to identify each.
TERMS = {
    "adaptive_ms": "an adaptive run",
    "eager_launch_ms": "a run whose verify batch exceeds its capture size",
    "eager_per_token_ms": "a run whose verify batch exceeds its capture size",
    "spread": "a per-request acceptance split (no host table has one)",
    "rho": "runs whose routed-expert reads are not saturated (small batches)",
    "mono": "runs with --monokernel (mono true) whose decode steps fit its rows, at two or more concurrencies",
}
# The mono verify-step speedup s is searched on this grid (planner/mono_term.py: mono step = step - verify +
# verify / s); below 1 is allowed, so a host where the kernels are slower says so.
MONO_GRID = (0.5, 4.0, 0.005)
# rho (drafted tokens' expert overlap) is fitted only where its column is not within this share of the span of the
# linear columns: past ~16 requests nearly every expert is read, so rho's effect is a near-constant per
# speculative step, and trades against the draft term (docs/calibration.md). Otherwise the public rho is used.
RHO_SPAN_PCT = 10.0


# --- the table ------------------------------------------------------------------------------------------


def _bad(path, what: str) -> UsageError:
    return UsageError(f"--calibrate {str(path)!r}: {what}")  # repr: a control character in a name cannot break the line


def _argv_setting(path, name: str, argv) -> tuple[int, bool, str, bool]:
    """(K, adaptive, capture size, mono) from a vLLM argv (the plan's): --speculative-config,
    --max-cudagraph-capture-size and --monokernel, as the plan writes them."""
    command = Command.from_words(argv or [])
    cap, spec = command.value("max_cudagraph_capture_size"), command.spec_config()
    if cap is None:
        raise _bad(path, f"{name}: its argv names no --max-cudagraph-capture-size; use a plain table instead")
    if spec is None and command.value("speculative_config") is not None:
        raise _bad(path, f"{name}: --speculative-config is not a JSON object")
    spec = spec or {}
    return (
        spec.get("num_speculative_tokens", 0),
        bool(spec.get("enable_adaptive_verification")),
        cap,
        command.bool_flag("monokernel") is True,
    )


def _run(arm: str, setting: tuple, concurrency, output_tok_s, acceptance_length) -> dict:
    """A row of a validate record or report, its (K, adaptive, capture size, mono) from the plan's argv."""
    k, adaptive, cap, mono = setting
    return {
        "arm": arm,
        "k": k,
        "adaptive": adaptive,
        "mono": mono,
        "concurrency": concurrency,
        "capture_size": cap,
        "output_tok_s": output_tok_s,
        "acceptance_length": acceptance_length if k else 1.0,
    }


def _rows_from_ab(path, data: dict) -> list[dict]:
    """A validate --ab record: block and adaptive arms at its concurrency."""
    rows = []
    for name in ("block", "adaptive"):
        arm = data["arms"][name]
        setting = _argv_setting(path, f"arm {name}", arm.get("argv"))
        rows.append(
            _run(name, setting, data["concurrency"], arm["output_throughput_tok_s"], arm.get("acceptance_length"))
        )
    return rows


def _rows_from_report(path, data: dict) -> list[dict]:
    """A `validate` report.json: one row per sweep level of the plan it ran."""
    setting = _argv_setting(path, "the report's plan", (data.get("plan") or {}).get("argv"))
    k, adaptive, _, mono = setting
    arm = f"{'adaptive' if adaptive else 'fixed' if k else 'none'}-k{k}{'-mono' if mono else ''}"
    return [
        _run(arm, setting, lv.get("concurrency"), lv.get("output_throughput_tok_s"), lv.get("acceptance_length"))
        for lv in ((data.get("measurements") or {}).get("sweep") or [])
        if not lv.get("failed")
    ]


def read_table(path) -> list[dict]:
    """Rows of FILE, each checked: exactly COLUMNS, finite non-negative numbers, no duplicate run."""
    import csv
    import io

    from rocm_dspark.inputs import JSONInputError, parse_json, read_text

    text = read_text(path, "--calibrate")  # bounded, regular files only, strict UTF-8
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            data = parse_json(text, "--calibrate")  # no NaN, no duplicate key
        except JSONInputError as exc:
            raise _bad(path, f"not valid JSON ({exc.detail})") from None
        # ab-record/1: measured by the toolkit's own client, before `vllm bench serve`: still a measurement here
        if isinstance(data, dict) and data.get("schema") in ("rocm-dspark/ab-record/1", "rocm-dspark/ab-record/2"):
            rows = _rows_from_ab(path, data)
        elif isinstance(data, dict) and "measurements" in data and "plan" in data:
            rows = _rows_from_report(path, data)
        else:
            listed = data.get("rows") if isinstance(data, dict) else data
            if not isinstance(listed, list) or not all(isinstance(r, dict) for r in listed):
                raise _bad(path, 'JSON must be a list of rows (objects) or {"rows": [...]}, or a validate --ab record')
            rows = listed
    else:
        reader = csv.DictReader(io.StringIO(text))
        rows = [dict(r) for r in reader]
        if reader.fieldnames is None:
            raise _bad(path, f"empty; give a CSV header {','.join(COLUMNS)} and one row per run")
        if None in (reader.fieldnames or []) or any(None in r for r in rows):
            raise _bad(path, "a row has more fields than the header")
    for i, r in enumerate(rows, 1):
        unknown = sorted(set(r) - set(COLUMNS) - set(OPTIONAL))
        missing = [c for c in COLUMNS if c not in r]
        if unknown:
            raise _bad(
                path,
                f"row {i}: unknown column(s) {', '.join(unknown)}; the columns are {','.join(COLUMNS)} "
                f"(and optionally {','.join(OPTIONAL)})",
            )
        if missing:
            raise _bad(path, f"row {i}: missing column(s) {', '.join(missing)}")
    return [_check_row(path, i, r) for i, r in enumerate(rows, 1)]  # every row's columns first, then its values


def _number(path, i, name, value, *, integer=False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise _bad(path, f"row {i}: {name} {value!r} is not a number") from None
    if not math.isfinite(x):
        raise _bad(path, f"row {i}: {name} is {value!r}; every value must be a finite number")
    if x < 0:
        raise _bad(path, f"row {i}: {name} {value!r} is negative")
    if integer and x != int(x):
        raise _bad(path, f"row {i}: {name} {value!r} is not a whole number")
    return x


def _flag(path, i: int, name: str, value) -> bool:
    if isinstance(value, str):
        if value.strip().lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise _bad(path, f"row {i}: {name} {value!r} is not true or false")
        return value.strip().lower() in ("true", "1", "yes")
    if not isinstance(value, bool):
        raise _bad(path, f"row {i}: {name} {value!r} is not true or false")
    return value


def _check_row(path, i: int, r: dict) -> dict:
    adaptive = _flag(path, i, "adaptive", r["adaptive"])
    mono = _flag(path, i, "mono", r["mono"]) if r.get("mono") not in (None, "") else False
    row: dict[str, Any] = {"arm": str(r["arm"]).strip(), "adaptive": adaptive, "mono": mono}
    for name in ("k", "concurrency", "capture_size"):
        row[name] = int(_number(path, i, name, r[name], integer=True))
    for name in ("output_tok_s", "acceptance_length"):
        row[name] = _number(path, i, name, r[name])
    if not row["arm"]:
        raise _bad(path, f"row {i}: arm is empty")
    if row["concurrency"] < 1 or row["output_tok_s"] <= 0 or row["capture_size"] < 1:
        raise _bad(path, f"row {i}: concurrency, capture_size and output_tok_s must be positive")
    if not 1.0 <= row["acceptance_length"] <= row["k"] + 1:
        raise _bad(
            path, f"row {i}: acceptance_length {row['acceptance_length']:g} must lie in [1, k+1] = [1, {row['k'] + 1}]"
        )
    if row["adaptive"] and row["k"] == 0:
        raise _bad(path, f"row {i}: an adaptive run drafts k >= 1 tokens")
    return row


def check_points(path, rows: list[dict]) -> None:
    seen: dict[tuple, int] = {}
    for i, r in enumerate(rows, 1):
        # the same arm name, or the same setting under another name, at one concurrency: one run twice
        for key in (
            ("arm", r["arm"], r["concurrency"]),
            ("setting", r["k"], r["adaptive"], r.get("mono", False), r["capture_size"], r["concurrency"]),
        ):
            if key in seen:
                raise _bad(
                    path,
                    f"row {i}: arm {r['arm']!r} (K={r['k']}, adaptive {str(r['adaptive']).lower()}, "
                    f"mono {str(r.get('mono', False)).lower()}, capture {r['capture_size']}) at concurrency {r['concurrency']} repeats row "
                    f"{seen[key]}; give each run once",
                )
            seen[key] = i
    linear = [r for r in rows if not r["adaptive"] and not r.get("mono")]
    unknowns = 4 + (2 if any(r["concurrency"] * (1 + r["k"]) > r["capture_size"] for r in linear) else 0)
    need = unknowns + 2
    if (
        len(linear) < need
        or len({r["concurrency"] for r in linear}) < 3
        or not any(r["k"] for r in linear)
        or not any(r["k"] == 0 for r in linear)
    ):
        raise _bad(
            path,
            f"{len(linear)} non-adaptive run(s) without mono are too few to fit: it needs at least {need} "
            f"(no speculation and fixed K, at three or more concurrencies: each is left out in turn "
            f"for the leave-one-out error; {unknowns} unknowns plus two)",
        )


# --- the fit --------------------------------------------------------------------------------------------


def rho_span_pct(physics, rows) -> float:
    """How far rho's column (the weight reads it moves, rho 0 to 0.75) lies outside the span of the linear
    columns over these runs, % of its norm: near 0 means those runs cannot tell rho from the other terms."""
    import numpy as np

    def weights_ms(r, rho):
        c = r["concurrency"]
        return float(physics.weights_ms(c, c * (1 + r["k"]), rho))

    linear = [r for r in rows if not r["adaptive"] and not r.get("mono")]
    pairs = [design_row(physics, r, 0.0) for r in linear]
    a = np.array([p[0] for p in pairs])
    # p[0][0] = 1 / measured ms: relative, as the other columns
    col = np.array([(weights_ms(r, 0.0) - weights_ms(r, 0.75)) * p[0][0] for r, p in zip(linear, pairs)])
    if not col.any():
        return 0.0
    x, *_ = np.linalg.lstsq(a, col, rcond=None)
    return float(100 * np.linalg.norm(a @ x - col) / np.linalg.norm(col))


def _fit_linear(physics, rows, rho_grid):
    import numpy as np

    if rho_span_pct(physics, rows) < RHO_SPAN_PCT:
        rho_grid = [stored().params.rho]
    best: tuple[float, float | None, Any] = (math.inf, None, None)
    for rho in rho_grid:
        pairs = [design_row(physics, r, float(rho)) for r in rows]
        a = np.array([p[0] for p in pairs])
        b = np.array([p[1] for p in pairs])
        cols = [i for i in range(a.shape[1]) if a[:, i].any()]
        x_sub, resid = nonneg_lstsq(a[:, cols], b)
        x = np.zeros(a.shape[1])
        x[cols] = x_sub
        if resid < best[0]:
            best = (resid, float(rho), x)
    return best[1], best[2]


def _step_ms(r, tok_s: float) -> float:
    return 1e3 * r["concurrency"] * r["acceptance_length"] / tok_s


def fit_mono(params, physics, rows) -> float | None:
    """The mono verify-step speedup s from the runs tagged mono (None without any): the s on MONO_GRID that
    minimises the squared relative tok/s error, the step without mono taken from `params` (fitted to the runs
    without it), as adaptive_overhead does for the adaptive work."""
    import numpy as np

    mono = [r for r in rows if r.get("mono")]
    if not mono:
        return None
    measured = np.array([_step_ms(r, r["output_tok_s"]) for r in mono])
    whole = np.array([_step_ms(r, predict_run_tok_s(params, physics, {**r, "mono": False})) for r in mono])
    verify = whole - np.array([_step_ms(r, predict_run_tok_s(params, physics, r, 1e9)) for r in mono])
    grid = np.arange(*MONO_GRID)
    err = ((measured[None, :] / (whole[None, :] - verify[None, :] + verify[None, :] / grid[:, None]) - 1) ** 2).sum(
        axis=1
    )
    return round(float(grid[int(np.argmin(err))]), 3)


def fit_rows(physics, rows, rho_grid):
    """StepParams from the rows: the linear terms by NNLS on the non-adaptive runs, then adaptive_ms by the
    model's one estimator (calibration.adaptive_overhead) on the adaptive runs."""
    linear = [r for r in rows if not r["adaptive"] and not r.get("mono")]  # mono runs: fit_mono's, after
    rho, x = _fit_linear(physics, linear, rho_grid)
    fixed, per_request, per_token, draft, launch, eager = map(float, x)  # the columns of design_row
    params = StepParams(
        fixed, per_request, per_token, draft, adaptive_ms=0.0, rho=rho, eager_launch_ms=launch, eager_per_token_ms=eager
    )
    adaptive = [r for r in rows if r["adaptive"] and not r.get("mono")]
    if adaptive:
        measured = [_step_ms(r, r["output_tok_s"]) for r in adaptive]
        base = [_step_ms(r, predict_run_tok_s(params, physics, r)) for r in adaptive]
        params = replace(params, adaptive_ms=adaptive_overhead(measured, base)[0])
    return params


def leave_one_out(physics, rows, rho_grid, public_mono: float = 1.0) -> list[float]:
    """Per run: |predicted / measured - 1| (%) from a fit without every run at its concurrency: the public
    fit's meaning (calibration.left_out_by_concurrency). A term the fold's runs do not identify takes the
    public value there, as in the whole fit (fold_notes says which); a mono run whose fold has no other mono
    run takes `public_mono`."""

    def fit_without(c):
        kept = [r for r in rows if r["concurrency"] != c]
        params = fit_rows(physics, kept, rho_grid)
        return params, fit_mono(params, physics, kept) or public_mono

    def error_at(fitted, c):
        params, mono = fitted
        return {
            i: abs(predict_run_tok_s(params, physics, r, mono) / r["output_tok_s"] - 1) * 100
            for i, r in enumerate(rows)
            if r["concurrency"] == c
        }

    every = sorted({r["concurrency"] for r in rows})
    errs = {i: e for _, by_row in left_out_by_concurrency(every, fit_without, error_at) for i, e in by_row.items()}
    return [errs[i] for i in range(len(rows))]


def fold_notes(physics, rows) -> list[str]:
    """One line per left-out concurrency whose remaining runs do not identify rho (RHO_SPAN_PCT)."""
    out = []
    for c in sorted({r["concurrency"] for r in rows}):
        pct = rho_span_pct(physics, [r for r in rows if r["concurrency"] != c])
        if pct < RHO_SPAN_PCT:
            out.append(
                f"left out c{c}: rho not identified by the other runs (its column is {pct:.1f}% outside the "
                f"span of the fixed, per-request, per-token and draft columns, under {RHO_SPAN_PCT:g}%: their "
                f"routed-expert reads are nearly saturated, so rho trades against the draft term); that fold "
                f"uses the public rho {stored().params.rho:g}"
            )
    return out


def unidentified(rows, physics, *, has_mono: bool = False) -> tuple[str, ...]:
    """The TERMS no row identifies (their columns or runs are absent, or rho's column is in the others' span);
    `has_mono`: the model has a mono decode layer, so its term is one (identified by mono runs at two or more
    concurrencies, so that each left-out fold keeps one)."""
    linear = [r for r in rows if not r["adaptive"] and not r.get("mono")]
    crosses = any(r["concurrency"] * (1 + r["k"]) > r["capture_size"] for r in linear)
    out = [] if any(r["adaptive"] and not r.get("mono") for r in rows) else ["adaptive_ms"]
    out += [] if crosses else ["eager_launch_ms", "eager_per_token_ms"]
    out += ["rho"] if rho_span_pct(physics, rows) < RHO_SPAN_PCT else []
    out += ["mono"] if has_mono and len({r["concurrency"] for r in rows if r.get("mono")}) < 2 else []
    return tuple(out + ["spread"])


def calibration(
    params,
    *,
    acceptance_length: float,
    loo_error_pct: float,
    payoff_error_pp: float,
    points: list,
    model: str,
    gpu: str,
    tp: int,
    not_identified,
    source_url: str,
    source_label: str,
    mono: dict | None = None,
):
    """This host's fit as a Calibration: the one constructor, for the fit (calibrate) and for its signed record
    read back (probe.calibration_record.host_calibration), so a kept fit is read back as it was fitted."""
    return Calibration(
        params=params,
        acceptance_length=float(acceptance_length),
        held_out_error_pct=float(loo_error_pct),
        held_out_payoff_error_pp=float(payoff_error_pp),
        cross_build_spread_pct=0.0,
        cross_build_spread_pp=0.0,
        source_url=source_url,
        source_label=source_label,
        model=model,
        gpu=gpu,
        tp=int(tp),
        bandwidth_efficiency=float(load_data()["bandwidth_efficiency"]),
        capture_size=max((int(r["capture_size"]) for r in points), default=None),
        host=True,
        not_identified=tuple(not_identified),
        mono=dict(mono) if mono else None,
    )


def calibrate(path, catalog, model, gpu_key: str):
    """Read, check and fit FILE (or a list of files, their runs together) for (model, GPU).
    Returns (Calibration, leave-one-out errors, rows). Terms no run identifies take the public values."""
    paths = list(path) if isinstance(path, (list, tuple)) else [path]
    rows = [r for p in paths for r in read_table(p)]
    path = ", ".join(map(str, paths))
    check_points(path, rows)
    gpu = catalog.find_gpu(gpu_key)
    profile = model.profiles.get(gpu.key)
    if profile is None:
        raise UsageError(
            f"{model.key} has no profile for {gpu.key}; pass one --gpu of {', '.join(sorted(model.profiles))}"
        )
    tp = profile.tp
    rows, mono_notes = _mono_runs(catalog, model, gpu, rows)
    has_mono = bool(catalog.mono) and model.key in catalog.mono["models"]
    lo, hi = catalog.mono["public_gain"]["per_layer"] if has_mono else (1.0, 1.0)
    fold_mono = math.sqrt(lo * hi)  # the public range's geometric middle: a fold with no other mono run takes it
    data = load_data()
    physics = physics_for(model, gpu, tp, float(data["bandwidth_efficiency"]))
    params = fit_rows(physics, rows, data["rho_grid"])
    loo = leave_one_out(physics, rows, data["rho_grid"], fold_mono)
    missing = unidentified(rows, physics, has_mono=has_mono)
    public = stored(data).params
    # spread stays 0 (one request class): the fit's predictor reads each run's measured acceptance length, so the
    # public A/B's heterogeneity would not match the adaptive overhead fitted here
    params = replace(params, **{term: getattr(public, term) for term in missing if term not in ("spread", "mono")})
    spec = [r["acceptance_length"] for r in rows if r["k"] and not r["adaptive"] and not r.get("mono")]
    # the step model's error is that of the runs without mono; the mono runs' left-out error is the mono term's
    err = round(max(e for e, r in zip(loo, rows) if not r.get("mono")), 1)
    mono, mono_lines = _mono_term(physics, params, rows, loo, missing, has_mono, catalog)
    calib = calibration(
        params,
        acceptance_length=round(sum(spec) / len(spec), 2),
        loo_error_pct=err,
        payoff_error_pp=round(2 * err, 1),
        points=rows,
        model=model.key,
        gpu=gpu.key,
        tp=tp,
        not_identified=missing,
        source_url=str(path),
        source_label=f"this host ({model.key}, {tp}x {gpu.key}, plan --calibrate, {len(rows)} runs)",
        mono=mono,
    )
    return replace(calib, notes=tuple(fold_notes(physics, rows) + mono_notes + mono_lines)), loo, rows


def public_mono(catalog) -> str:
    g = catalog.mono["public_gain"]
    lo, hi = g["per_layer"]
    return (
        f"the public {lo:g}-{hi:g}x per layer ({g['source']}, second-hand) stays: public and uncalibrated, "
        f"its error the range itself"
    )


def _mono_runs(catalog, model, gpu, rows) -> tuple[list[dict], list[str]]:
    """Runs tagged mono whose decode steps cannot take the kernels (another model, arch without them, or more
    rows than the arch's kernels take: recipe/mono.py's rule) ran vLLM's own path: fitted as runs without it."""
    from rocm_dspark.recipe.mono import step_rows

    m = catalog.mono or {}
    arch = (m.get("archs") or {}).get(gpu.arch) if model.key in (m.get("models") or ()) else None
    out, notes = [], []
    for r in rows:
        if r.get("mono"):
            rows_ = step_rows(r["concurrency"], r["k"], r["capture_size"])
            if arch is None or rows_ > arch["max_rows"]:
                why = f"{rows_} rows > {arch['max_rows']}" if arch else f"{model.key} on {gpu.arch} has no mono kernels"
                notes.append(
                    f"mono run {r['arm']} at c{r['concurrency']}: its decode steps do not take the kernels "
                    f"({why}): fitted as a run without --monokernel"
                )
                r = {**r, "mono": False}
        out.append(r)
    return out, notes


def _mono_term(physics, params, rows, loo, missing, has_mono: bool, catalog) -> tuple[dict | None, list[str]]:
    """The mono term this host's runs give: ({speedup, loo_error_pct, runs} or None, lines). Kept for plan only
    where mono runs at two or more concurrencies identify it and its left-out error is within the bound;
    otherwise the public, uncalibrated term stays (planner/mono_term.py), and the lines say why."""
    mono = [(r, e) for r, e in zip(rows, loo) if r.get("mono")]
    if not has_mono or not mono:  # no mono run: not_identified says so (probe/calibration_record.run_calibrate)
        return None, []
    public = public_mono(catalog)
    s = fit_mono(params, physics, rows)
    worst = round(max(e for _, e in mono), 1)
    fitted = (
        f"mono term: verify step x1/{s:g} with --monokernel, fitted to {len(mono)} mono run(s) against the "
        f"step model of the runs without it"
    )
    if "mono" in missing:
        return None, [
            f"{fitted}, at one concurrency: not identified for the leave-one-out (needs {TERMS['mono']}); {public}"
        ]
    if worst > LOO_BOUND_PCT:
        return None, [f"{fitted}; left-out error {worst:g}%, above the {LOO_BOUND_PCT:g}% bound: not kept; {public}"]
    return (
        {"speedup": s, "loo_error_pct": worst, "runs": len(mono)},
        [f"{fitted}; left-out error {worst:g}% (tok/s): plan uses it for rows where mono runs"],
    )
