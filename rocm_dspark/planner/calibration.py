"""A step-cost model calibrated against public measured throughput (recipes/step_cost.yaml).

One decode step of R running requests that verify T target tokens in all (T = R + verified drafts)
costs, in milliseconds,

    step(R, T) = fixed                                   per-step overhead: launches, sampler, scheduler
               + (dense + experts x touched(R, T)) / BW   weight and routed-expert reads (recipe physics)
               + per_request x R                          attention over each request's context
               + per_token x T                            per-token GEMMs and the TP all-reduce
               + draft                                    the DSpark drafter (speculative steps only)
               + adaptive                                 adaptive verification's own work (AV steps only)

touched(R, T) = 1 - (1 - k/E)^(R x (1 + (T/R - 1)(1 - rho))): a request's T/R tokens share context,
so past its first token each adds only (1 - rho) of an independent top-k draw (rho = 0 is the
roofline's independent routing). dense/experts come from recipes/models (roofline.moe_model_cost) and
BW from recipes/gpus.yaml; fixed, per_request, per_token, draft, adaptive and rho are fitted, together
with the unpublished acceptance length of the measured workload, by `fit()` on some concurrencies of
the public A/B and checked on the others (`held_out()`).

Outside the calibration setting (another model, GPU or TP) the fitted terms are carried over with
stated scaling rules (see `transfer`), which no public measurement validates; the stated error there
adds the spread between two builds of the same A/B. `python scripts/refit_step_cost.py` refits and prints
everything (`--write` stores the fit in recipes/step_cost.yaml).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

from rocm_dspark.errors import UsageError
from rocm_dspark.planner.roofline import ModelCost, catalog_model_cost


@dataclass(frozen=True)
class Physics:
    """The weight-read term of one (model, GPU, TP): the model's bytes per step and the bandwidth that reads them."""

    weights: ModelCost  # the recipe physics (roofline.catalog_model_cost)
    bandwidth_bytes_per_s: float  # TP x HBM x efficiency
    layers: int = 0  # the eager term's launches are per layer (capture_term)

    def weights_ms(self, requests, tokens, rho: float):
        import numpy as np

        requests = np.maximum(np.asarray(requests, dtype=np.float64), 1.0)
        tokens = np.asarray(tokens, dtype=np.float64)
        # independent top-k draws: the roofline's tokens, a request's tokens past its first counted (1 - rho)
        draws = requests * (1.0 + np.maximum(tokens / requests - 1.0, 0.0) * (1.0 - rho))
        return 1e3 * self.weights.bytes_read(np.where(tokens > 0, draws, 0.0)) / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class StepParams:
    fixed_ms: float
    per_request_ms: float
    per_token_ms: float
    draft_ms: float
    adaptive_ms: float
    rho: float
    spread: float = 0.0  # acceptance heterogeneity: two equal request classes, alpha_hi - alpha_lo
    eager_launch_ms: float = 0.0  # per layer, steps above the largest captured size (capture_term)
    eager_per_token_ms: float = 0.0  # per token, same steps


@dataclass(frozen=True)
class Calibration:
    """The fitted parameters, where they come from, and how wrong they were on points left out."""

    params: StepParams
    acceptance_length: float  # of the measured workload (a nuisance parameter of the fit)
    held_out_error_pct: float  # max |predicted / measured - 1| over the held-out points, tok/s
    held_out_payoff_error_pp: float  # max |predicted - measured| adaptive-vs-fixed gain, points
    cross_build_spread_pct: float  # max |build B / build A - 1| for the same cell, tok/s
    cross_build_spread_pp: float  # same, adaptive-vs-fixed gain
    source_url: str
    source_label: str  # "DeepSeek-V4-Flash, 8x mi350x TP8, vllm#52362"
    model: str
    gpu: str
    tp: int
    bandwidth_efficiency: float
    rows: list = field(default_factory=list, compare=False)  # per point: measured and predicted
    capture_size: int | None = None  # the largest captured size the fitted reading takes for the A/B
    capture_known: bool = True  # False: the run's capture size is not published (both readings fit)
    fit_held_out_error_pct: float | None = None  # the chosen reading's own held-out error (before covering)
    fit_held_out_payoff_error_pp: float | None = None
    reading_spread_pct: float = 0.0  # max |reading A / reading B - 1| of the predictions, tok/s
    reading_spread_pp: float = 0.0  # same, adaptive-vs-fixed gain
    readings: tuple = field(default=(), compare=False)  # per capture reading: its own errors
    host: bool = False  # this host's fit (plan --calibrate), not the public A/B
    not_identified: tuple = ()  # terms no run of the fit identifies: they carry the public values
    notes: tuple = field(default=(), compare=False)  # host fit: what a leave-one-out fold could not identify
    mono: dict | None = None  # host fit: the measured mono verify-step speedup (planner/mono_term.py)


# --- data -------------------------------------------------------------------------------------------


def data_path() -> Path:
    from rocm_dspark.recipe.catalog import recipes_dir

    return recipes_dir() / "step_cost.yaml"


def load_data() -> dict:
    import yaml

    from rocm_dspark.inputs import read_text

    p = data_path()
    text = read_text(p, "the step-cost calibration data")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"{p}: cannot read the step-cost calibration data: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != "rocm-dspark/step-cost/1":
        raise UsageError(f"{p}: not a rocm-dspark/step-cost/1 file")
    return data


def physics_for(model, gpu, profile_tp: int, bandwidth_efficiency: float) -> Physics:
    return Physics(
        weights=catalog_model_cost(model),
        bandwidth_bytes_per_s=profile_tp * gpu.hbm_bandwidth_tbps * 1e12 * bandwidth_efficiency,
        layers=int(model.architecture.get("layers") or 0),
    )


def _cells(source: dict, concurrencies):
    table = {int(c): v for c, v in source["output_tok_s"].items()}
    missing = [c for c in concurrencies if c not in table]
    if missing:
        raise UsageError(f"step_cost.yaml: no measurement at concurrency {missing}")
    return [(c, *map(float, table[c])) for c in concurrencies]


# --- fit --------------------------------------------------------------------------------------------


def nonneg_lstsq(a, b):
    """min ||a x - b|| with x >= 0 by trying every support (n unknowns: 2^n small solves, n <= 6).

    Supports whose residuals agree to 1e-9 (relative, or 1e-15 of ||b||^2 for an exact fit) are a tie the data cannot break: two columns the runs do
    not tell apart, as the two eager columns are when every step above the capture size has the same token
    count. The tie goes to the fewest columns, then the earliest, so the fit never depends on BLAS rounding."""
    import numpy as np

    n = a.shape[1]
    found = []
    for support in itertools.product((False, True), repeat=n):
        cols = tuple(i for i in range(n) if support[i])
        x = np.zeros(n)
        if cols:
            sol, *_ = np.linalg.lstsq(a[:, list(cols)], b, rcond=None)
            if (sol < 0).any():
                continue
            x[list(cols)] = sol
        found.append((float(np.sum((a @ x - b) ** 2)), cols, x))
    best = min(r for r, *_ in found)
    tol = 1e-9 * best + 1e-15 * float(np.sum(np.asarray(b) ** 2))  # an exact fit's residual is rounding noise
    resid, _, x = min((f for f in found if f[0] <= best + tol), key=lambda f: (len(f[1]), f[1]))
    return x, resid


def design_row(physics: Physics, run: dict, rho: float):
    """One measured run {concurrency, k, acceptance_length, output_tok_s, capture_size} as a row of the linear
    fit, in relative units: a x = 1 when the model matches the measured step time (concurrency x acceptance
    length / tok/s) exactly. The last two columns are the eager term of a step above the capture size
    (capture_term). Both fits use it."""
    import numpy as np

    from rocm_dspark.planner.capture_term import eager_columns

    c, k = run["concurrency"], run["k"]
    tokens = c * (1 + k)
    measured_ms = 1e3 * c * run["acceptance_length"] / run["output_tok_s"]
    known = float(physics.weights_ms(c, tokens, rho))
    row = np.array([1.0, c, tokens, 1.0 if k else 0.0, *eager_columns(tokens, run["capture_size"], physics.layers)])
    return row / measured_ms, 1.0 - known / measured_ms


def _design(physics: Physics, cells, k: int, acceptance_length: float, rho: float, largest: int):
    """design_row for each measured no-spec and fixed-K cell of the public A/B."""
    import numpy as np

    pairs = [
        design_row(physics, {"concurrency": c, "capture_size": largest, **run}, rho)
        for c, nospec, fixed, _ in cells
        for run in (
            {"k": 0, "acceptance_length": 1.0, "output_tok_s": nospec},
            {"k": k, "acceptance_length": acceptance_length, "output_tok_s": fixed},
        )
    ]
    a = np.array([p[0] for p in pairs])
    if not a[:, 4:].any():  # no step crosses the capture size: the eager term is not identified here
        a = a[:, :4]
    return a, np.array([p[1] for p in pairs])


OVERHEAD_GRID_MS = (0.0, 20.0, 0.01)


def adaptive_overhead(measured_ms, base_ms) -> tuple[float, float]:
    """Adaptive verification's own per-step work, the one estimator of both fits: the overhead o >= 0 (on a
    0.01 ms grid up to 20 ms) that minimises the squared relative tok/s error sum((measured / (base + o) - 1)^2)
    of the adaptive runs, given each run's measured step time and the model's step without the overhead.
    Returns (o, that error)."""
    import numpy as np

    measured, base = np.asarray(measured_ms, dtype=np.float64), np.asarray(base_ms, dtype=np.float64)
    overheads = np.arange(*OVERHEAD_GRID_MS)
    err = ((measured[None, :] / (base[None, :] + overheads[:, None]) - 1) ** 2).sum(axis=1)
    i = int(np.argmin(err))
    return float(overheads[i]), float(err[i])


def predict_run_tok_s(params: StepParams, physics: Physics, run: dict, mono_speedup: float | None = None) -> float:
    """The one predictor of a measured run {concurrency, k, adaptive, capture_size, acceptance_length}:
    output tok/s = c x acceptance length per step over CalibratedCost's step. A fixed-K run verifies
    c x (1+K) tokens; an adaptive run about c x acceptance length (its trimmed drafts; a lower bound) and
    pays adaptive_ms. The public A/B's adaptive cells publish no acceptance length, so there the scheduler
    (simulator, same CalibratedCost) gives the tokens verified (_predict_cells). `mono_speedup` divides the
    verify step of a run tagged mono, whose steps take the mono decode kernels (planner/mono_term.py's model)."""
    from rocm_dspark.recipe.capture import vllm_capture_grid

    c, k = run["concurrency"], run["k"]
    tokens = round(c * run["acceptance_length"]) if run["adaptive"] else c * (1 + k)
    cost = CalibratedCost(
        params=params, physics=physics, capture_sizes=tuple(vllm_capture_grid(run["capture_size"])), requests=c
    )
    ms = 1e3 * (
        float(cost.verify_seconds(tokens)) / (mono_speedup if run.get("mono") and mono_speedup else 1.0)
        + cost.request_seconds(c)
        + cost.draft_seconds(c, k)
        + (cost.adaptive_seconds if run["adaptive"] else 0.0)
    )
    return 1e3 * c * run["acceptance_length"] / ms


def left_out_by_concurrency(concurrencies, fit_without, error_at, only=None) -> list:
    """The one leave-one-out of both fits: each concurrency in turn is left out, the model is fitted to the
    others (`fit_without(c)`) and judged on the points at it (`error_at(model, c)`). [(c, error), ...]"""
    return [(c, error_at(fit_without(c), c)) for c in (only or concurrencies)]


def class_rates(acceptance_length: float, k: int, spread: float):
    """Two equal classes of requests with constant conditional rates alpha_lo and alpha_lo + spread
    whose mean acceptance length (all k drafts verified) is `acceptance_length`. spread 0 is the
    seeds' single geometric rate; a confidence head can only gain from trimming when requests differ,
    as they do across prompts (the DSpark paper's acceptance runs from 45.7% on chat to 76.9% on math)."""
    from rocm_dspark.planner.acceptance import bisect_increasing, geometric_rates

    if spread <= 0:
        a = geometric_rates(acceptance_length, k)[0]
        return [a, a]

    def mean_length(a):
        return (sum(a**j for j in range(k + 1)) + sum((a + spread) ** j for j in range(k + 1))) / 2

    hi = max(0.0, 1.0 - spread)
    if not mean_length(0.0) <= acceptance_length <= mean_length(hi):
        raise UsageError(
            f"acceptance length {acceptance_length:g} cannot be split into classes {spread:g} apart over {k} drafts"
        )
    a = bisect_increasing(mean_length, acceptance_length, 0.0, hi, steps=80)
    return [a, a + spread]


def class_matrix(alphas, batch: int, k: int):
    """[batch, k] conditional rates: requests alternate between the classes."""
    import numpy as np

    return np.array([[alphas[i % len(alphas)]] * k for i in range(batch)])


def _predict_cells(params: StepParams, physics: Physics, cells, k: int, acceptance_length: float, grid=()):
    """Predicted (no-spec, fixed K, adaptive) tok/s per cell; adaptive through the real scheduler."""
    from rocm_dspark.planner.simulator import Policy, simulate

    alphas = class_rates(acceptance_length, k, params.spread)
    cost = CalibratedCost(params=params, physics=physics, capture_sizes=tuple(grid))
    policies = (Policy("none"), Policy("fixed", k), Policy("adaptive", k))
    return [
        tuple(
            simulate(cost, class_matrix(alphas, c, k), c, policy, steps=1).expected_tokens_per_s for policy in policies
        )
        for c, *_ in cells
    ]


def capture_readings(src: dict) -> tuple[list[int], bool]:
    """The capture size(s) a source's runs used: ([size], True) when published, else every stated
    reading and False (step_cost.yaml `capture`)."""
    cap = src.get("capture") or {}
    if cap.get("max_cudagraph_capture_size") is not None:
        return [int(cap["max_cudagraph_capture_size"])], True
    readings = [int(r["max_cudagraph_capture_size"]) for r in cap.get("readings", [])]
    if not readings:
        raise UsageError("step_cost.yaml: the calibration source states no capture size and no readings")
    return readings, False


def fit(data: dict | None = None, catalog=None) -> Calibration:
    """Fit once per capture reading of the calibration source (fit_reading). An unknown capture size
    gives two readings: the one whose fit-set error is smaller is kept, and its stated held-out error
    adds the largest difference between the readings' predictions, so it covers either being true."""
    from rocm_dspark.recipe.catalog import load_catalog

    data = data or load_data()
    catalog = catalog or load_catalog()
    src = data["sources"][data["split"]["source"]]
    sizes, known = capture_readings(src)
    fits = [fit_reading(data, catalog, size) for size in sizes]
    chosen = min(fits, key=lambda c: (c.readings[0]["fit_error_pct"], c.capture_size))
    spread_pct = spread_pp = 0.0
    for other in fits:
        for a, b in zip(chosen.rows, other.rows):
            spread_pct = max(spread_pct, *(abs(p / q - 1) * 100 for p, q in zip(a["predicted"], b["predicted"])))
            spread_pp = max(spread_pp, abs(a["adaptive_gain_pct"][1] - b["adaptive_gain_pct"][1]))
    own_pct, own_pp = chosen.held_out_error_pct, chosen.held_out_payoff_error_pp
    identified = [f for f in fits if f.readings[0]["overrun_cells"]]
    if not chosen.readings[0]["overrun_cells"] and identified:
        # The kept reading has no step past its capture size, so it cannot price one: the eager term is
        # taken from the reading in which steps cross it (the same A/B's only estimate; capture_lines says so).
        eager = identified[0].params
        params = replace(
            chosen.params, eager_launch_ms=eager.eager_launch_ms, eager_per_token_ms=eager.eager_per_token_ms
        )
        chosen = replace(chosen, params=params)
    return replace(
        chosen,
        capture_known=known,
        fit_held_out_error_pct=own_pct,
        fit_held_out_payoff_error_pp=own_pp,
        held_out_error_pct=round(own_pct + (0.0 if known else spread_pct), 1),
        held_out_payoff_error_pp=round(own_pp + (0.0 if known else spread_pp), 1),
        reading_spread_pct=round(spread_pct, 1),
        reading_spread_pp=round(spread_pp, 1),
        readings=tuple(r for f in fits for r in f.readings),
    )


def leave_one_out(data: dict, catalog, largest: int, only=None) -> tuple[float, float, list]:
    """Leave one concurrency out of the whole A/B (left_out_by_concurrency), fit on the rest (fit_reading),
    predict it: the worst tok/s error (%) and adaptive-gain error (points) over the left-out cells, and the
    per-cell errors. `only`: leave out just these concurrencies (each fit takes seconds)."""
    src = data["sources"][data["split"]["source"]]
    every = sorted(int(c) for c in src["output_tok_s"])

    def fit_without(c):
        one = {
            **data,
            "split": {**data["split"], "fit_concurrency": [x for x in every if x != c], "held_out_concurrency": [c]},
        }
        return fit_reading(one, catalog, largest)

    def error_at(calib, c):
        row = next(r for r in calib.rows if r["part"] == "held-out")
        return (
            round(max(abs(p / m - 1) * 100 for p, m in zip(row["predicted"], row["measured"])), 1),
            round(abs(row["adaptive_gain_pct"][1] - row["adaptive_gain_pct"][0]), 1),
        )

    cells = [(c, *err) for c, err in left_out_by_concurrency(every, fit_without, error_at, only)]
    return max(x[1] for x in cells), max(x[2] for x in cells), cells


def fit_reading(data: dict, catalog, largest: int) -> Calibration:
    """Fit the linear terms (non-negative least squares on relative step-time error) for every rho in
    the grid and every acceptance length on a 0.01 grid, keep the best; then the adaptive overhead by a
    1-D search; then measure the error on the held-out concurrencies and across builds. Steps above
    `largest` (the run's largest captured size) carry the eager term (capture_term), fitted with the rest."""
    import numpy as np

    from rocm_dspark.recipe.capture import vllm_capture_grid

    grid = tuple(vllm_capture_grid(largest))
    split = data["split"]
    src = data["sources"][split["source"]]
    model = catalog.find_model(src["model"])
    gpu = catalog.find_gpu(src["gpu"])
    k = int(src["num_speculative_tokens"])
    eff = float(data["bandwidth_efficiency"])
    physics = physics_for(model, gpu, int(src["tp"]), eff)
    train = _cells(src, split["fit_concurrency"])
    test = _cells(src, split["held_out_concurrency"])

    best = (math.inf, None)
    for rho in data["rho_grid"]:
        for al in np.arange(1.5, k + 1.0 + 1e-9, 0.01):
            a, b = _design(physics, train, k, float(al), float(rho), largest)
            x, resid = nonneg_lstsq(a, b)
            if resid < best[0]:
                best = (resid, (float(rho), float(al), x))
    _, (rho, al, x) = best
    eager = [float(v) for v in x[4:]] or [0.0, 0.0]
    params = StepParams(
        *map(float, x[:4]), adaptive_ms=0.0, rho=rho, eager_launch_ms=eager[0], eager_per_token_ms=eager[1]
    )

    # Adaptive verification: how much requests differ (spread) and its own per-step work (adaptive_ms),
    # both from the adaptive cells of the fit set (relative error). The overhead is a constant per step
    # outside the budget search (vLLM's profiled tables leave it out), so one scheduler run per spread
    # gives tokens and step time, and every overhead on the grid is then a division.
    from rocm_dspark.planner.simulator import Policy, simulate

    measured = np.array([cell[3] for cell in train])
    cost = CalibratedCost(params=params, physics=physics, capture_sizes=grid)
    best_av = (math.inf, 0.0, 0.0)
    for spread in data.get("spread_grid", [0.0]):
        try:
            alphas = class_rates(al, k, float(spread))
        except UsageError:
            continue
        tokens, step = [], []
        for c, *_ in train:
            res = simulate(cost, class_matrix(alphas, c, k), c, Policy("adaptive", k), steps=1)
            step.append(res.step_ms)
            tokens.append(res.expected_tokens_per_s * res.step_ms / 1e3)
        tokens, step = np.array(tokens), np.array(step)
        overhead, err = adaptive_overhead(tokens * 1e3 / measured, step)  # measured step ms = tokens / tok/s
        if err < best_av[0]:
            best_av = (err, float(spread), overhead)
    params = replace(params, spread=best_av[1], adaptive_ms=best_av[2])

    rows = []
    worst = {"fit": 0.0, "held-out": 0.0}  # max |predicted / measured - 1|, %
    worst_pp = 0.0  # held out, adaptive-vs-fixed gain
    for part, cells in (("fit", train), ("held-out", test)):
        for (c, *measured), predicted in zip(cells, _predict_cells(params, physics, cells, k, al, grid)):
            gain_m, gain_p = (100 * (x[2] / x[1] - 1) for x in (measured, predicted))
            rows.append(
                {
                    "part": part,
                    "concurrency": c,
                    "measured": measured,
                    "predicted": [round(p, 2) for p in predicted],
                    "adaptive_gain_pct": [round(gain_m, 2), round(gain_p, 2)],
                }
            )
            worst[part] = max(worst[part], *(abs(p / m - 1) * 100 for p, m in zip(predicted, measured)))
            if part == "held-out":
                worst_pp = max(worst_pp, abs(gain_p - gain_m))
    fit_pct, worst_pct = worst["fit"], worst["held-out"]
    spread_pct = spread_pp = 0.0  # the same cells measured on another build
    for name, other in data["sources"].items():
        if name == split["source"]:
            continue
        for c, *o in _cells(other, sorted(int(c) for c in other["output_tok_s"])):
            _, *b = _cells(src, [c])[0]
            spread_pct = max(spread_pct, *(abs(x / y - 1) * 100 for x, y in zip(o, b)))
            spread_pp = max(spread_pp, abs(100 * (o[2] / o[1] - b[2] / b[1])))
    return public_calibration(
        data,
        params,
        acceptance_length=round(al, 2),
        held_out_error_pct=round(worst_pct, 1),
        held_out_payoff_error_pp=round(worst_pp, 1),
        cross_build_spread_pct=round(spread_pct, 1),
        cross_build_spread_pp=round(spread_pp, 1),
        rows=rows,
        capture_size=int(largest),
        readings=(
            {
                "capture_size": int(largest),
                "fit_error_pct": round(fit_pct, 1),
                "held_out_error_pct": round(worst_pct, 1),
                "held_out_payoff_error_pp": round(worst_pp, 1),
                "eager_launch_ms": round(params.eager_launch_ms, 6),
                "eager_per_token_ms": round(params.eager_per_token_ms, 6),
                "overrun_cells": sum(1 for c, *_ in train + test if c * (1 + k) > largest),
            },
        ),
    )


# The `fit:` block of recipes/step_cost.yaml, in the file's order: fit() -> fit_block() (scripts/refit_step_cost.py
# --write) -> stored(). One list, so a field the fit gains cannot be dropped on the way to `plan`. A StepParams
# field goes to the params, the others to the Calibration; a field with a default there may be absent.
FIT_KEYS = (
    "fixed_ms per_request_ms per_token_ms draft_ms adaptive_ms rho spread acceptance_length held_out_error_pct "
    "held_out_payoff_error_pp cross_build_spread_pct cross_build_spread_pp eager_launch_ms eager_per_token_ms "
    "capture_size capture_known fit_held_out_error_pct fit_held_out_payoff_error_pp reading_spread_pct reading_spread_pp"
).split()
_PARAM_KEYS = {f.name for f in fields(StepParams)}


def source_label(src: dict) -> str:
    """ "DeepSeek-V4-Flash, 8x mi350x TP8, vllm#52362": a public source's label, fitted or stored."""
    return (
        f"{src['model']}, {src['tp']}x {src['gpu']} TP{src['tp']}, {src['url'].rsplit('/', 3)[-3]}#"
        f"{src['url'].rsplit('/', 1)[-1]}"
    )


def fit_block(calib: Calibration) -> dict:
    """The `fit:` block's values for this calibration (what stored() reads back)."""
    return {key: getattr(calib.params if key in _PARAM_KEYS else calib, key) for key in FIT_KEYS}


def stored(data: dict | None = None) -> Calibration:
    """The fit as stored in step_cost.yaml (what `plan` uses: no refit on every run)."""
    data = data or load_data()
    given = {key: value for key, value in (data.get("fit") or {}).items() if value is not None}
    spec = {f.name: f for cls in (StepParams, Calibration) for f in fields(cls)}
    if any(key not in given and spec[key].default is MISSING for key in FIT_KEYS):
        raise UsageError("recipes/step_cost.yaml has no fit; run `python scripts/refit_step_cost.py --write`")
    f = {key: given.get(key, spec[key].default) for key in FIT_KEYS}
    # numbers as their fields declare them: a hand-written 44 reads as the fit's 44.0
    rest = {key: float(f[key]) if spec[key].type == "float" else f[key] for key in FIT_KEYS if key not in _PARAM_KEYS}
    params = StepParams(**{key: float(f[key]) for key in _PARAM_KEYS})
    return public_calibration(data, params, **{**rest, "capture_known": bool(f["capture_known"])})


def public_calibration(data: dict, params: StepParams, **fields) -> Calibration:
    """The public calibration's one constructor, for the fit (fit_reading) and the stored fit (stored): where it
    comes from is step_cost.yaml's calibration source, in both."""
    src = data["sources"][data["split"]["source"]]
    return Calibration(
        params=params,
        **fields,
        source_url=src["url"],
        source_label=source_label(src),
        model=src["model"],
        gpu=src["gpu"],
        tp=int(src["tp"]),
        bandwidth_efficiency=float(data["bandwidth_efficiency"]),
    )


# --- the cost object the simulator and the scheduler use --------------------------------------------


@dataclass(frozen=True)
class CalibratedCost:
    """Step cost from the calibrated model, with vLLM's graph padding; same interface as RooflineCost
    (seconds), plus request_seconds (the per-request term) and adaptive_seconds (AV's own work).
    The routing term depends on tokens per request, so the cost is bound to a request count
    (`for_requests`); unbound, each token is taken as its own request's first."""

    params: StepParams
    physics: Physics
    capture_sizes: tuple[int, ...] = ()
    requests: int = 0
    label: str = "calibrated model"

    def for_requests(self, requests: int) -> CalibratedCost:
        return self if requests == self.requests else replace(self, requests=int(requests))

    def verify_seconds(self, tokens):
        import numpy as np

        from rocm_dspark.planner.capture_term import eager_ms
        from rocm_dspark.planner.roofline import pad_to_capture

        padded = pad_to_capture(tokens, self.capture_sizes).astype(np.float64)
        requests = self.requests or padded
        p = self.params
        ms = (
            p.fixed_ms
            + self.physics.weights_ms(np.minimum(requests, np.maximum(padded, 1)), padded, p.rho)
            + p.per_token_ms * padded
        )
        if p.eager_launch_ms or p.eager_per_token_ms:  # steps past the largest captured size (capture_term)
            ms = ms + eager_ms(
                padded,
                self.capture_sizes[-1] if self.capture_sizes else None,
                layers=self.physics.layers,
                launch_ms_per_layer=p.eager_launch_ms,
                per_token_ms=p.eager_per_token_ms,
            )
        return np.where(padded > 0, ms, 0.0) / 1e3

    def request_seconds(self, num_requests: int) -> float:
        return self.params.per_request_ms * num_requests / 1e3 if num_requests > 0 else 0.0

    def draft_seconds(self, num_requests: int, k: int) -> float:
        return self.params.draft_ms / 1e3 if k > 0 and num_requests > 0 else 0.0

    @property
    def adaptive_seconds(self) -> float:
        return self.params.adaptive_ms / 1e3


def transfer(
    calibration: Calibration, catalog, model, gpu, profile, *, capture_size: int | None = None
) -> tuple[CalibratedCost, bool, list[str]]:
    """The calibrated cost for any (model, GPU, TP): (cost, is the calibration setting itself, notes).

    Scaling rules outside the calibration setting (stated, not validated by any public measurement):
      * weight reads: recipe physics of the target model and GPU (bytes / (TP x HBM x efficiency));
      * fixed per-step overhead: x layers / calibration layers (kernel launches per layer);
      * per-token term: x (active params per token / TP x peak FP8) / same for the calibration setting;
      * per-request term: x layers / calibration layers x calibration HBM / HBM (KV reads; the
        MLA latent cache is replicated over TP, so TP does not divide it);
      * drafter and adaptive overhead: unchanged;
      * eager term (capture_term): per-layer launch unchanged (x this model's layers), per token as the
        per-token term.
    """
    from rocm_dspark.planner.roofline import profile_capture_grid

    ref_model = catalog.find_model(calibration.model)
    ref_gpu = catalog.find_gpu(calibration.gpu)
    tp = profile.tp
    physics = physics_for(model, gpu, tp, calibration.bandwidth_efficiency)
    same = model.key == ref_model.key and gpu.key == ref_gpu.key and tp == calibration.tp
    p = calibration.params
    notes = []
    if not same:
        layers = float(model.architecture.get("layers") or 1) / float(ref_model.architecture.get("layers") or 1)
        compute = (float(model.params["active_output_token_b"]) / (tp * gpu.peak_fp8_tflops)) / (
            float(ref_model.params["active_output_token_b"]) / (calibration.tp * ref_gpu.peak_fp8_tflops)
        )
        kv = layers * ref_gpu.hbm_bandwidth_tbps / gpu.hbm_bandwidth_tbps
        p = replace(
            p,
            fixed_ms=p.fixed_ms * layers,
            per_token_ms=p.per_token_ms * compute,
            per_request_ms=p.per_request_ms * kv,
            eager_per_token_ms=p.eager_per_token_ms * compute,
        )
        notes.append(
            f"calibration transferred from {calibration.source_label} to {model.key} on {tp}x {gpu.key}: "
            f"fixed x{layers:.2f} (layers), per-token x{compute:.2f} (active params / TP x FP8 peak), "
            f"per-request x{kv:.2f} (layers, HBM); these rules are not validated by any public measurement"
        )
    cost = CalibratedCost(
        params=p,
        physics=physics,
        capture_sizes=profile_capture_grid(model, profile, capture_size),
        label=f"calibrated ({'calibration setting' if same else 'transferred from'} {calibration.source_label})",
    )
    return cost, same, notes
