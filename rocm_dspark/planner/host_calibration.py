"""This host's calibration, the fit: `rocm-dspark plan --calibrate FILE` fits the step model to the operator's
own measurements (docs/calibration.md); rocm_dspark.probe.host_calibration keeps the fit, signed.

FILE is a plain table (CSV with a header, or JSON: a list of rows or {"rows": [...]}) with exactly the
columns COLUMNS, a `validate --ab` record (its two arms become two rows) or a `validate` report.json (one
row per sweep level of the plan it ran). One row is one measured run:
arm (a name), k (0 for no speculation), adaptive (true/false), concurrency, capture_size (the server's
largest captured graph size), output_tok_s, acceptance_length (tokens per request per step, 1 without
speculation). The fit imports numpy.
"""

from __future__ import annotations

import json
import math

from rocm_dspark.errors import UsageError

COLUMNS = ("arm", "k", "adaptive", "concurrency", "capture_size", "output_tok_s", "acceptance_length")


# --- the table ------------------------------------------------------------------------------------------


def _bad(path, what: str) -> UsageError:
    return UsageError(f"--calibrate {str(path)!r}: {what}")  # repr: a control character in a name cannot break the line


def _argv_setting(path, name: str, argv) -> tuple[int, bool, str]:
    """(K, adaptive, capture size) from a vLLM argv (the plan's): --speculative-config and
    --max-cudagraph-capture-size, as the plan writes them."""
    argv = [str(a) for a in argv or []]
    spec, cap = {}, None
    for i, tok in enumerate(argv[:-1]):
        if tok == "--speculative-config":
            try:
                spec = json.loads(argv[i + 1])
            except ValueError:
                raise _bad(path, f"{name}: --speculative-config is not JSON") from None
        if tok == "--max-cudagraph-capture-size":
            cap = argv[i + 1]
    if cap is None:
        raise _bad(path, f"{name}: its argv names no --max-cudagraph-capture-size; use a plain table instead")
    if not isinstance(spec, dict):
        raise _bad(path, f"{name}: --speculative-config is not a JSON object")
    return spec.get("num_speculative_tokens", 0), bool(spec.get("enable_adaptive_verification")), cap


def _rows_from_ab(path, data: dict) -> list[dict]:
    """A validate --ab record: block and adaptive arms at its concurrency (K and capture size from argv)."""
    rows = []
    for name in ("block", "adaptive"):
        arm = data["arms"][name]
        k, adaptive, cap = _argv_setting(path, f"arm {name}", arm.get("argv"))
        rows.append({"arm": name, "k": k, "adaptive": adaptive, "concurrency": data["concurrency"],
                     "capture_size": cap, "output_tok_s": arm["output_throughput_tok_s"],
                     "acceptance_length": arm["acceptance_length"] if k else 1.0})
    return rows


def _rows_from_report(path, data: dict) -> list[dict]:
    """A `validate` report.json: one row per sweep level of the plan it ran (K and capture size from argv)."""
    plan = data.get("plan") or {}
    k, adaptive, cap = _argv_setting(path, "the report's plan", plan.get("argv"))
    arm = f"{'adaptive' if adaptive else 'fixed' if k else 'none'}-k{k}"
    return [{"arm": arm, "k": k, "adaptive": adaptive, "concurrency": lv.get("concurrency"), "capture_size": cap,
             "output_tok_s": lv.get("output_throughput_tok_s"),
             "acceptance_length": (lv.get("acceptance_length") if k else 1.0)}
            for lv in ((data.get("measurements") or {}).get("sweep") or []) if not lv.get("failed")]


def read_table(path) -> list[dict]:
    """Rows of FILE, each checked: exactly COLUMNS, finite non-negative numbers, no duplicate run."""
    import csv
    import io
    from pathlib import Path

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad(path, f"cannot read it ({getattr(exc, 'strerror', None) or exc.__class__.__name__})") from None
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise _bad(path, f"not valid JSON ({exc.__class__.__name__})") from None
        if isinstance(data, dict) and data.get("schema") == "rocm-dspark/ab-record/1":
            rows = _rows_from_ab(path, data)
        elif isinstance(data, dict) and "measurements" in data and "plan" in data:
            rows = _rows_from_report(path, data)
        else:
            rows = data.get("rows") if isinstance(data, dict) else data
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise _bad(path, "JSON must be a list of rows (objects) or {\"rows\": [...]}, or a validate --ab record")
    else:
        reader = csv.DictReader(io.StringIO(text))
        rows = [dict(r) for r in reader]
        if reader.fieldnames is None:
            raise _bad(path, f"empty; give a CSV header {','.join(COLUMNS)} and one row per run")
        if None in (reader.fieldnames or []) or any(None in r for r in rows):
            raise _bad(path, "a row has more fields than the header")
    return [_check_row(path, i, r) for i, r in enumerate(rows, 1)] if _check_all(path, rows) else []


def _check_all(path, rows: list[dict]) -> bool:
    for i, r in enumerate(rows, 1):
        unknown = sorted(set(r) - set(COLUMNS))
        missing = [c for c in COLUMNS if c not in r]
        if unknown:
            raise _bad(path, f"row {i}: unknown column(s) {', '.join(unknown)}; the columns are {','.join(COLUMNS)}")
        if missing:
            raise _bad(path, f"row {i}: missing column(s) {', '.join(missing)}")
    return True


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


def _check_row(path, i: int, r: dict) -> dict:
    adaptive = r["adaptive"]
    if isinstance(adaptive, str):
        if adaptive.strip().lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise _bad(path, f"row {i}: adaptive {adaptive!r} is not true or false")
        adaptive = adaptive.strip().lower() in ("true", "1", "yes")
    elif not isinstance(adaptive, bool):
        raise _bad(path, f"row {i}: adaptive {adaptive!r} is not true or false")
    row = {"arm": str(r["arm"]).strip(), "adaptive": adaptive,
           "k": int(_number(path, i, "k", r["k"], integer=True)),
           "concurrency": int(_number(path, i, "concurrency", r["concurrency"], integer=True)),
           "capture_size": int(_number(path, i, "capture_size", r["capture_size"], integer=True)),
           "output_tok_s": _number(path, i, "output_tok_s", r["output_tok_s"]),
           "acceptance_length": _number(path, i, "acceptance_length", r["acceptance_length"])}
    if not row["arm"]:
        raise _bad(path, f"row {i}: arm is empty")
    if row["concurrency"] < 1 or row["output_tok_s"] <= 0 or row["capture_size"] < 1:
        raise _bad(path, f"row {i}: concurrency, capture_size and output_tok_s must be positive")
    if not 1.0 <= row["acceptance_length"] <= row["k"] + 1:
        raise _bad(path, f"row {i}: acceptance_length {row['acceptance_length']:g} must lie in [1, k+1] = "
                         f"[1, {row['k'] + 1}]")
    if row["adaptive"] and row["k"] == 0:
        raise _bad(path, f"row {i}: an adaptive run drafts k >= 1 tokens")
    return row


def check_points(path, rows: list[dict]) -> None:
    seen = {}
    for i, r in enumerate(rows, 1):
        # the same arm name, or the same setting under another name, at one concurrency: one run twice
        for key in (("arm", r["arm"], r["concurrency"]),
                    ("setting", r["k"], r["adaptive"], r["capture_size"], r["concurrency"])):
            if key in seen:
                raise _bad(path, f"row {i}: arm {r['arm']!r} (K={r['k']}, adaptive {str(r['adaptive']).lower()}, "
                                 f"capture {r['capture_size']}) at concurrency {r['concurrency']} repeats row "
                                 f"{seen[key]}; give each run once")
            seen[key] = i
    linear = [r for r in rows if not r["adaptive"]]
    unknowns = 4 + (2 if any(r["concurrency"] * (1 + r["k"]) > r["capture_size"] for r in linear) else 0)
    need = unknowns + 2
    if len(linear) < need or len({r["concurrency"] for r in linear}) < 2 or not any(r["k"] for r in linear) \
            or not any(r["k"] == 0 for r in linear):
        raise _bad(path, f"{len(linear)} non-adaptive run(s) are too few to fit: it needs at least {need} "
                         f"(no speculation and fixed K, at two or more concurrencies; {unknowns} unknowns plus "
                         f"two for the leave-one-out error)")


# --- the fit --------------------------------------------------------------------------------------------


def _design_row(physics, r, rho):
    import numpy as np

    from rocm_dspark.planner.capture_term import eager_columns

    c, k = r["concurrency"], r["k"]
    tokens = c * (1 + k)
    measured_ms = 1e3 * c * r["acceptance_length"] / r["output_tok_s"]
    known = float(physics.weights_ms(c, tokens, rho))
    row = np.array([1.0, c, tokens, 1.0 if k else 0.0, *eager_columns(tokens, r["capture_size"], physics.layers)])
    return row / measured_ms, 1.0 - known / measured_ms


def _fit_linear(physics, rows, rho_grid):
    import numpy as np

    from rocm_dspark.planner.calibration import nonneg_lstsq

    best = (math.inf, None, None)
    for rho in rho_grid:
        pairs = [_design_row(physics, r, float(rho)) for r in rows]
        a = np.array([p[0] for p in pairs])
        b = np.array([p[1] for p in pairs])
        cols = [i for i in range(a.shape[1]) if a[:, i].any()]
        x_sub, resid = nonneg_lstsq(a[:, cols], b)
        x = np.zeros(a.shape[1])
        x[cols] = x_sub
        if resid < best[0]:
            best = (resid, float(rho), x)
    return best[1], best[2]


def _params(x, rho, adaptive_ms=0.0):
    from rocm_dspark.planner.calibration import StepParams

    return StepParams(*map(float, x[:4]), adaptive_ms=adaptive_ms, rho=rho, eager_launch_ms=float(x[4]),
                      eager_per_token_ms=float(x[5]))


def predict_tok_s(params, physics, r) -> float:
    """Output tok/s of one run: c x acceptance length per step over the step time. An adaptive run verifies
    about c x acceptance length tokens (its trimmed drafts; a lower bound) and pays adaptive_ms."""
    from rocm_dspark.recipe.capture import vllm_capture_grid
    from rocm_dspark.planner.calibration import CalibratedCost

    c, k = r["concurrency"], r["k"]
    tokens = round(c * r["acceptance_length"]) if r["adaptive"] else c * (1 + k)
    cost = CalibratedCost(params=params, physics=physics, capture_sizes=tuple(vllm_capture_grid(r["capture_size"])),
                          requests=c)
    ms = 1e3 * float(cost.verify_seconds(tokens)) + params.per_request_ms * c
    ms += (params.draft_ms if k else 0.0) + (params.adaptive_ms if r["adaptive"] else 0.0)
    return 1e3 * c * r["acceptance_length"] / ms


def fit_rows(physics, rows, rho_grid):
    """(StepParams, per-row predictions) from the rows; adaptive_ms is the median excess of the adaptive runs."""
    import numpy as np

    linear = [r for r in rows if not r["adaptive"]]
    rho, x = _fit_linear(physics, linear, rho_grid)
    params = _params(x, rho)
    excess = []
    for r in rows:
        if r["adaptive"]:
            measured_ms = 1e3 * r["concurrency"] * r["acceptance_length"] / r["output_tok_s"]
            excess.append(measured_ms - 1e3 * r["concurrency"] * r["acceptance_length"] / predict_tok_s(params, physics, r))
    if excess:
        params = _params(x, rho, adaptive_ms=max(0.0, float(np.median(excess))))
    return params


def leave_one_out(physics, rows, rho_grid) -> list[float]:
    """|predicted / measured - 1| (%) of each run from a fit without it."""
    errs = []
    for i, r in enumerate(rows):
        rest = rows[:i] + rows[i + 1:]
        params = fit_rows(physics, rest, rho_grid)
        errs.append(abs(predict_tok_s(params, physics, r) / r["output_tok_s"] - 1) * 100)
    return errs


def calibrate(path, catalog, model, gpu_key: str, tp: int | None = None):
    """Read, check and fit FILE (or a list of files, their runs together) for (model, GPU).
    Returns (Calibration, leave-one-out errors, rows)."""
    from rocm_dspark.planner.calibration import Calibration, load_data, physics_for

    paths = list(path) if isinstance(path, (list, tuple)) else [path]
    rows = [r for p in paths for r in read_table(p)]
    path = ", ".join(map(str, paths))
    check_points(path, rows)
    gpu = catalog.find_gpu(gpu_key)
    profile = model.profiles.get(gpu.key)
    if profile is None:
        raise UsageError(f"{model.key} has no profile for {gpu.key}; pass one --gpu of {', '.join(sorted(model.profiles))}")
    tp = tp or profile.tp
    data = load_data()
    physics = physics_for(model, gpu, tp, float(data["bandwidth_efficiency"]))
    params = fit_rows(physics, rows, data["rho_grid"])
    loo = leave_one_out(physics, rows, data["rho_grid"])
    spec = [r["acceptance_length"] for r in rows if r["k"] and not r["adaptive"]]
    err = round(max(loo), 1)
    calib = Calibration(params=params, acceptance_length=round(sum(spec) / len(spec), 2), held_out_error_pct=err,
                        held_out_payoff_error_pp=round(2 * err, 1), cross_build_spread_pct=0.0,
                        cross_build_spread_pp=0.0, source_url=str(path),
                        source_label=f"this host ({model.key}, {tp}x {gpu.key}, plan --calibrate, {len(rows)} runs)",
                        model=model.key, gpu=gpu.key, tp=tp, bandwidth_efficiency=float(data["bandwidth_efficiency"]),
                        capture_size=max(r["capture_size"] for r in rows))
    return calib, loo, rows
