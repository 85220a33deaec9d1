"""The mono decode term: what --monokernel would change on the decode steps it takes (docs/recipe.md).

Per plan row, rocm_dspark.recipe.mono decides whether the profile's layout and a decode step of that many
requests take the kernels (the same decision `recipe` makes). Where they do, the public per-layer speedup
(recipes/vllm.yaml mono_decode.public_gain, second-hand from vLLM PR #60397) is applied to the target's verify
step, the draft and per-request work unchanged:

    mono step = step - verify + verify / s,    s in [per_layer low, per_layer high]

so the fixed-K row's tok/s is multiplied by step / mono step. The verify step also holds work that is not a
layer (sampling, the LM head), so the top of the range is an upper bound. Public and uncalibrated: no run of
rocm-dspark measured it, and its error is the range itself on top of the cost model's.

With this host's calibration holding a mono term (`plan --calibrate` on runs with and without --monokernel,
planner/host_fit.py), s is that fit's one value and the range is its left-out error instead.
"""

from __future__ import annotations


def mono_rows(catalog, model, gpu, profile, result, cost, capture_size: int, host_mono: dict | None) -> list[dict]:
    """One entry per plan row: whether mono runs and, where it does, the predicted fixed-K tok/s range
    (`host_mono`: this host's fitted term, host_fit._mono_term, ahead of the public one)."""
    from rocm_dspark.recipe.mono import decide

    m = catalog.mono
    build = catalog.builds.get(profile.vllm_build)
    out = []
    for r in result.rows:
        d = decide(
            m,
            model=model.key,
            gpu=gpu,
            build=profile.vllm_build or "?",
            has_change=catalog.contains(build, m["change"]) if build and m else None,
            tp=profile.tp,
            dp=result.dp,
            ep=profile.ep,
            nodes=1,
            k=result.fixed_k,
            concurrency=r.batch,
            capture_size=capture_size,
            k_schedule=False,
        )
        if d is None:
            return []
        row = {"concurrency": r.concurrency, "on": d.on, "why": d.short}
        if d.on:
            fixed = r.at_k(result.fixed_k)
            step = fixed.step_ms
            verify = 1000.0 * float(cost.verify_seconds(r.batch * (1 + result.fixed_k)))
            tps = fixed.expected_tokens_per_s
            # the host's one speedup with its left-out error as the range, or the public per-layer range
            speedups = [float(host_mono["speedup"])] * 2 if host_mono else m["public_gain"]["per_layer"]
            ratios = [step / (step - verify + verify / s) for s in speedups]
            e = float(host_mono["loo_error_pct"]) / 100 if host_mono else 0.0
            row.update(
                rows=d.rows,
                speedup=[round(x, 3) for x in ratios],
                source="host" if host_mono else "public",
                **({"error_pct": host_mono["loo_error_pct"]} if host_mono else {}),
                tok_s=[round(tps * ratios[0] * (1 - e), 1), round(tps * ratios[1] * (1 + e), 1)],
            )
        out.append(row)
    return out


def mono_note(catalog, rows: list[dict], host_mono: dict | None = None) -> str | None:
    if not rows:
        return None
    g = catalog.mono["public_gain"]
    lo, hi = g["per_layer"]
    on = [r for r in rows if r["on"]]
    if not on:
        return f"mono decode (--monokernel): off at every planned concurrency ({rows[0]['why'][5:]})"
    if host_mono:
        return (
            f"mono decode (--monokernel): this host's term (plan --calibrate, {host_mono['runs']} mono runs): "
            f"verify step x1/{host_mono['speedup']:g}, draft and per-request work unchanged; the range is its "
            f"left-out error +-{host_mono['loo_error_pct']:g}%, on top of the cost model's"
        )
    ilo, ihi = g["interactivity"]
    clo, chi = (int(c) for c in g["concurrency"])
    return (
        f"mono decode (--monokernel): a public, uncalibrated term, not yet run on MI300-class hardware: the "
        f"per-layer {lo:g}-{hi:g}x of {g['source']} (second-hand) applied to the fixed-K verify step, draft and "
        f"per-request work unchanged; the range is its error, on top of the cost model's, and its top is an "
        f"upper bound (the verify step is not all layers). The same source reports {ilo:g}-{ihi:g}x P90 "
        f"interactivity at concurrency {clo}-{chi}"
    )
