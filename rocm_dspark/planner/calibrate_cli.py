"""`rocm-dspark plan --calibrate FILE`: fit, print the leave-one-out error, keep the fit (host_calibration)."""

from __future__ import annotations

import json


def run_calibrate(catalog, model, gpu_key: str, path, state_dir=None, *, as_json: bool = False) -> list[str]:
    from rocm_dspark.planner.host_calibration import build_record, calibrate, write
    from rocm_dspark.planner.payoff_table import grid_for
    from rocm_dspark.planner.profile import plan_profile

    calib, loo, rows = calibrate(path, catalog, model, gpu_key)
    profile = model.profiles[catalog.find_gpu(gpu_key).key]
    length = model.speculative.get("golden_acceptance_length") or calib.acceptance_length
    plan = plan_profile(catalog, model, gpu_key, concurrencies=grid_for(profile.max_num_seqs),
                        acceptance_length=float(length), steps=1, calibration=calib)
    payoff = {"tp": profile.tp, "error_pp": plan.payoff_error_pp, "acceptance_length": float(length),
              "capture_size": _largest(catalog, model, gpu_key),
              "gain_pct": {str(r.concurrency): round(plan.adaptive_gain_pct(r), 1) for r in plan.rows}}
    source = ", ".join(map(str, path)) if isinstance(path, (list, tuple)) else str(path)
    record = build_record(calib, loo, rows, payoff, source)
    written = write(state_dir, record)
    p = calib.params
    if as_json:
        return [json.dumps({"record": str(written), "leave_one_out_pct": [round(e, 2) for e in loo],
                            "params": record["params"], "payoff": payoff}, indent=2)]
    lines = [f"calibration of {model.key} on {calib.tp}x {calib.gpu} from {source}: {len(rows)} runs",
             f"fit: fixed {p.fixed_ms:.3f} ms + per request {p.per_request_ms:.4f} ms + per token {p.per_token_ms:.5f} ms "
             f"+ draft {p.draft_ms:.3f} ms + adaptive {p.adaptive_ms:.2f} ms + eager {p.eager_launch_ms:g} ms/layer + "
             f"{p.eager_per_token_ms:g} ms/token above the capture size; rho {p.rho:g}",
             f"{'arm':>12} {'K':>2} {'AV':>3} {'conc':>5} {'capture':>7} | {'measured':>9} | {'left-out error':>15}"]
    for r, e in zip(rows, loo):
        lines.append(f"{r['arm'][:12]:>12} {r['k']:>2} {'yes' if r['adaptive'] else 'no':>3} {r['concurrency']:>5} "
                     f"{r['capture_size']:>7} | {r['output_tok_s']:>9.1f} | {e:>15.1f}%")
    lines.append(f"leave-one-out error: max {max(loo):.1f}%, mean {sum(loo) / len(loo):.1f}% (tok/s); stated for "
                 f"plan: +-{calib.held_out_error_pct:g}% tok/s, +-{calib.held_out_payoff_error_pp:g} points of "
                 f"adaptive gain (twice the tok/s error: a ratio of two predictions)")
    lines.append(f"kept as this host's calibration: {written}; `plan` and the gate's payoff half use it ahead of "
                 f"the public one")
    return lines


def _largest(catalog, model, gpu_key: str) -> int:
    from rocm_dspark.capture import capture_size

    profile = model.profiles[catalog.find_gpu(gpu_key).key]
    return capture_size(profile.max_num_seqs, model.block_size, profile.capture_cap)
