"""Refit the planner's public step-cost model from recipes/step_cost.yaml and print it (an offline tool).

    python scripts/refit_step_cost.py            # the fit, the held-out error, the capture readings
    python scripts/refit_step_cost.py --loo      # also leave each concurrency out in turn (slow)
    python scripts/refit_step_cost.py --write    # store the fit in recipes/step_cost.yaml's `fit:` block

The model and the fit live in rocm_dspark/planner/calibration.py; this only prints and writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rocm_dspark.errors import UsageError  # noqa: E402
from rocm_dspark.planner.calibration import Calibration, data_path, fit, fit_block, leave_one_out, load_data  # noqa: E402



def _write_fit(calib: Calibration, path: Path) -> None:
    """Replace the `fit:` block of step_cost.yaml with this calibration (text edit keeps the comments)."""
    from rocm_dspark.atomic import write_atomic

    text = path.read_text(encoding="utf-8")
    head, sep, _ = text.partition("\nfit:\n")
    if not sep:
        raise UsageError(f"{path}: no `fit:` block to replace")
    values = fit_block(calib)
    body = "".join(f"  {key}: {round(value, 6) if isinstance(value, float) else value!r}\n"
                   for key, value in values.items())
    write_atomic(path, (head + sep + body).encode(), mode=0o644)


def report_lines(calib: Calibration, previous: dict | None = None) -> list[str]:
    p = calib.params
    lines = [f"calibration: {calib.source_label} ({calib.source_url})",
             f"fit: fixed {p.fixed_ms:.3f} ms + per request {p.per_request_ms:.4f} ms + per token "
             f"{p.per_token_ms:.5f} ms + draft {p.draft_ms:.3f} ms + adaptive {p.adaptive_ms:.2f} ms; rho {p.rho:g}; "
             f"acceptance classes {p.spread:g} apart; "
             f"workload acceptance length {calib.acceptance_length:g} (fitted, unpublished)",
             f"{'part':>8} {'conc':>5} | {'no-spec meas/pred':>19} | {'fixed K meas/pred':>19} | "
             f"{'adaptive meas/pred':>19} | {'AV gain meas/pred':>18}"]
    for r in calib.rows:
        m, q, g = r["measured"], r["predicted"], r["adaptive_gain_pct"]
        lines.append(f"{r['part']:>8} {r['concurrency']:>5} | {m[0]:>8.0f} / {q[0]:>8.0f} | {m[1]:>8.0f} / {q[1]:>8.0f} | "
                     f"{m[2]:>8.0f} / {q[2]:>8.0f} | {g[0]:>+7.1f}% / {g[1]:>+7.1f}%")
    lines.append(f"held-out error: tok/s within {calib.held_out_error_pct:g}%, adaptive-vs-fixed gain within "
                 f"{calib.held_out_payoff_error_pp:g} points; cross-build spread (same A/B, MI355X image): "
                 f"{calib.cross_build_spread_pct:g}% tok/s, {calib.cross_build_spread_pp:g} points of gain")
    return lines + capture_lines(calib, previous)


def capture_lines(calib: Calibration, previous: dict | None = None) -> list[str]:
    """The capture readings, the eager term and the held-out error next to the previous fit's."""
    p = calib.params
    lines = []
    for r in calib.readings:
        lines.append(f"capture reading {r['capture_size']}: {r['overrun_cells']} cell(s) overrun it; eager term "
                     f"{r['eager_launch_ms']:g} ms/layer + {r['eager_per_token_ms']:g} ms/token; fit-set error "
                     f"{r['fit_error_pct']:g}%, held-out {r['held_out_error_pct']:g}% tok/s and "
                     f"{r['held_out_payoff_error_pp']:g} points")
    how = ("published" if calib.capture_known else
           f"not published: both readings fitted, kept {calib.capture_size} (smaller fit-set error); the stated "
           f"error adds the readings' largest difference, {calib.reading_spread_pct:g}% and "
           f"{calib.reading_spread_pp:g} points")
    lines.append(f"capture size of the calibration runs: {how}; eager term in use: {p.eager_launch_ms:g} ms/layer + "
                 f"{p.eager_per_token_ms:g} ms/token above the largest captured size (from the reading in which "
                 f"steps cross it; it prices only plans whose verify batches leave the graphs)")
    if previous:
        lines.append(f"held-out error, previous fit (no capture term): {previous['held_out_error_pct']:g}% tok/s, "
                     f"{previous['held_out_payoff_error_pp']:g} points; this fit: {calib.fit_held_out_error_pct:g}% "
                     f"and {calib.fit_held_out_payoff_error_pp:g} points (stated, covering the readings: "
                     f"{calib.held_out_error_pct:g}% and {calib.held_out_payoff_error_pp:g} points)")
    return lines


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Refit the planner's step-cost model from recipes/step_cost.yaml.")
    parser.add_argument("--write", action="store_true", help="store the fit in recipes/step_cost.yaml")
    parser.add_argument("--loo", action="store_true", help="also leave each concurrency out in turn (slow)")
    args = parser.parse_args(argv)
    data = load_data()
    calib = fit(data)
    print("\n".join(report_lines(calib, data.get("previous_fit"))))
    if args.loo:
        from rocm_dspark.recipe.catalog import load_catalog

        for size in [r["capture_size"] for r in calib.readings]:
            pct, pp, cells = leave_one_out(data, load_catalog(), size)
            print(f"leave-one-concurrency-out (reading {size}): tok/s within {pct:g}%, gain within {pp:g} points; "
                  + ", ".join(f"c{c} {a:g}%/{b:g}pp" for c, a, b in cells))
    if args.write:
        _write_fit(calib, data_path())
        print(f"wrote the fit into {data_path()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
