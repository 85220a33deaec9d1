"""From the catalog (model, GPU profile) and the user's workload to a PlanResult."""

from __future__ import annotations

from rocm_dspark.errors import UsageError
from rocm_dspark.planner.acceptance import geometric_rates, parse_rates, synthetic_rates


def parse_concurrency(text) -> list[int]:
    """'1,16,64' -> [1, 16, 64]; every value a positive integer."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise UsageError(
            f"--concurrency {text!r} is not a comma-separated list of integers; pass e.g. --concurrency 1,16,64,128"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise UsageError(f"--concurrency {text!r}: every value must be a positive integer, e.g. 1,16,64")
    return sorted(set(values))


# --acceptance-shape: how an acceptance length spreads over the drafted positions
SHAPES = {
    "geometric": (geometric_rates, "a constant conditional rate per position"),
    "synthetic": (synthetic_rates, "vLLM's synthetic minimum-variance schedule"),
}


def acceptance_for(model, *, length: float | None, rates_text: str | None, shape: str = "geometric"):
    """Conditional rates, a label saying where they come from, and the acceptance length they spread (None for
    given rates)."""
    gamma = model.block_size
    if length is not None and rates_text is not None:
        raise UsageError("pass either --acceptance-length or --acceptance-rates, not both")
    if rates_text is not None:
        rates = parse_rates(rates_text, gamma)
        return rates, f"conditional acceptance rates {rates} (given)", None
    source = "given"
    if length is None:
        length = model.speculative.get("golden_acceptance_length")
        if length is None:
            raise UsageError(f"{model.key} has no golden acceptance length in recipes; pass --acceptance-length")
        source = "the InferenceX golden for this model (thinking on), not your traffic"
    if shape not in SHAPES:
        raise UsageError(f"--acceptance-shape {shape!r}: expected one of {', '.join(SHAPES)}")
    spread, how = SHAPES[shape]
    length = float(length)
    rates = spread(length, gamma)
    shown = ", ".join(f"{r:.3f}" for r in rates)
    return rates, f"acceptance length {length:g} ({source}) as {how} -> conditional rates [{shown}]", length


def adaptive_status(catalog, profile) -> tuple[bool, str | None]:
    """Whether the profile's vLLM build accepts adaptive verification for V4.1 on ROCm (recipes/vllm.yaml:
    the build contains the change that lifts the refusal)."""
    build = catalog.builds.get(profile.vllm_build or "")
    if build is None:
        return True, None
    has = catalog.contains(build, catalog.adaptive_change)
    if has is not True:
        native = [b.name for b in catalog.builds.values() if catalog.contains(b, catalog.adaptive_change)]
        needs = f"a build with {catalog.adaptive_change} ({', '.join(native) or 'none known'})"
        return False, (
            f"the profile's vLLM build {build.name} refuses it on ROCm for V4.1 "
            f"(recipes/vllm.yaml: {catalog.adaptive_notes['refused_evidence']}); it needs {needs} "
            f"and a passing `rocm-dspark probe`"
        )
    return True, None


def roofline_notes(cost, model, profile) -> list[str]:
    target = cost.target
    notes = [
        "cost: roofline model (--cost-model roofline), uncalibrated: it leaves out the fixed per-step time, "
        "attention over the context and TP all-reduces, so its steps are far too short at small batches. "
        "Use the default calibrated model or --cost-table with measured step costs.",
        f"roofline per step: {target.dense_bytes / 1e9:.1f} GB dense + {target.expert_bytes / 1e9:.1f} GB routed "
        f"experts x (1 - (1 - {target.expert_share:.4f})^tokens) (uniform, independent routing); "
        f"{target.flops_per_token / 1e9:.0f} GFLOP per token (2 x active params); TP{profile.tp} divides bytes "
        f"and FLOPs; {cost.hardware.bandwidth_bytes_per_s / 1e12:.1f} TB/s and "
        f"{cost.hardware.flops_per_s / 1e15:.2f} PFLOP/s effective (0.8 x HBM bandwidth, 0.5 x FP8 peak: "
        f"the seed's factors)",
    ]
    if cost.capture_sizes:
        notes.append(
            f"verify tokens padded to vLLM's capture grid up to {cost.capture_sizes[-1]} "
            f"(max_num_seqs {profile.max_num_seqs} x (1+{model.block_size}), pow2, cap {profile.capture_cap})"
        )
    return notes


def calibrated_notes(calib, same: bool, error_pct: float, payoff_pp: float) -> list[str]:
    p = calib.params
    if calib.host:
        return host_fit_notes(calib, error_pct, payoff_pp)
    where = (
        "this is the calibration setting"
        if same
        else "outside the calibration setting: the stated error adds the spread between two builds of the same A/B"
    )
    return [
        f"cost: calibrated step model, fit to public measurements: {calib.source_label} ({calib.source_url}); "
        f"step = {p.fixed_ms:.2f} ms fixed + weight/expert reads (recipe bytes / HBM) + {p.per_request_ms:.4f} ms "
        f"x requests + {p.per_token_ms:.4f} ms x tokens + {p.draft_ms:.2f} ms draft + {p.adaptive_ms:.2f} ms "
        f"adaptive-verification work (calibration-setting values); routing overlap rho {p.rho:g}",
        f"error: held-out points of that A/B were within {calib.held_out_error_pct:g}% (tok/s) and "
        f"{calib.held_out_payoff_error_pp:g} points (adaptive vs fixed gain); a rebuild of the same A/B on another "
        f"image moved by {calib.cross_build_spread_pct:g}% and {calib.cross_build_spread_pp:g} points; {where}: "
        f"tok/s +-{error_pct:g}%, adaptive gain +-{payoff_pp:g} points",
        "not yet run on MI300-class hardware by this project; the calibration is one public A/B "
        "(recipes/step_cost.yaml says how thin the data is). Measure your own: `rocm-dspark validate` writes "
        "cost_table.json into its report (pass it as --cost-table), `rocm-dspark validate --ab --concurrency C` "
        "measures adaptive against block verification for the gate, and `plan --calibrate FILE` fits this "
        "model to your runs for plan and the gate (docs/calibration.md)",
    ]


def host_fit_notes(calib, error_pct: float, payoff_pp: float) -> list[str]:
    """The notes of a plan on this host's own fit (plan --calibrate): what it was fit to and what it left out."""
    p = calib.params
    adaptive = (
        f"adaptive not identified by these runs (the public value {p.adaptive_ms:.2f} ms)"
        if "adaptive_ms" in calib.not_identified
        else f"{p.adaptive_ms:.2f} ms adaptive-verification work"
    )
    public = [t.removesuffix("_ms").replace("_", " ") for t in calib.not_identified if t not in ("spread", "mono")]
    return [
        f"cost: calibrated step model, fit to this host's own runs: {calib.source_label} ({calib.source_url}); "
        f"step = {p.fixed_ms:.2f} ms fixed + weight/expert reads (recipe bytes / HBM) + {p.per_request_ms:.4f} ms "
        f"x requests + {p.per_token_ms:.4f} ms x tokens + {p.draft_ms:.2f} ms draft + {adaptive}; routing overlap "
        f"rho {p.rho:g}",
        f"error: each run left out of the fit was predicted within {calib.held_out_error_pct:g}% (tok/s); stated: "
        f"tok/s +-{error_pct:g}%, adaptive gain +-{payoff_pp:g} points (a ratio of two predictions)"
        + (
            f"; not identified by these runs, so the public calibration's values: {', '.join(public)}" if public else ""
        ),
    ]


COMMON_NOTES = (
    "adaptive: the confidence head is taken as calibrated and stationary; vllm#52362 measured adaptive "
    "4.7-8.3% below fixed K=7 at c4-c32 on MI350X (V4-Flash) and ahead from c64",
    "steady decode only: no prefill bursts, no EOS; tokens/s are output tokens of the whole server",
)


def recipe_capture(max_num_seqs: int, k: int, cap: int) -> int:
    """The capture size the recipe sets for max_num_seqs (rocm_dspark.recipe.capture), or, where a full verify
    batch would need more than the cap, the largest power of two within it (resolve.capture_layer's overrun)."""
    from rocm_dspark.recipe.capture import capture_size

    try:
        return capture_size(max_num_seqs, k, cap)
    except UsageError:
        return 1 << (cap.bit_length() - 1)


def plan_profile(
    catalog,
    model,
    gpu_key: str,
    *,
    concurrencies,
    acceptance_length=None,
    acceptance_rates=None,
    acceptance_shape="geometric",
    cost_table=None,
    cost_model="calibrated",
    steps=None,
    seed=0,
    dp=None,
    capture_size=None,
    calibration=None,
    calibration_note=None,
    max_num_seqs=None,
):
    """Plan one (model, GPU) profile. Cost: `cost_table` (a path: measured) or `cost_model`
    ("calibrated": `calibration`, this host's `plan --calibrate` fit that the caller found for the profile
    (`calibration_note` says so), else recipes/step_cost.yaml's fit, transferred to this profile; "roofline").
    `dp`: data-parallel ranks of the profile's TP group (default: the profile's; a strategy may give more).
    `capture_size`: the largest captured graph size the server runs with (default: the recipe's); verify
    batches above it pay the eager term (capture_term) and are marked. `max_num_seqs`: the server's limit on
    running requests (default: the recipe's), so a plan can cover concurrencies above it; the recipe's capture
    size follows it up to the profile's cap and stays there above (vLLM runs bigger steps without graphs:
    vllm/v1/cudagraph_dispatcher.py `dispatch`)."""
    call = dict(locals())  # this call's arguments, for the capture-assumption rerun at the end

    from rocm_dspark.planner.cost_table import load_cost_table
    from rocm_dspark.planner.recommend import hold_to_error, plan_grid
    from rocm_dspark.planner.roofline import profile_capture_grid

    gpu = catalog.find_gpu(gpu_key)
    profile = model.profiles.get(gpu.key)
    if profile is None:
        raise UsageError(f"{model.key} has no profile for {gpu.key}; profiles: {', '.join(sorted(model.profiles))}")
    if cost_model not in ("calibrated", "roofline"):
        raise UsageError(f"--cost-model {cost_model!r}: expected calibrated or roofline")
    extra_notes = []
    if max_num_seqs is not None:
        if max_num_seqs < 1:
            raise UsageError(f"--max-num-seqs {max_num_seqs}: must be at least 1")
        if capture_size is None:
            capture_size = recipe_capture(max_num_seqs, model.block_size, profile.capture_cap)
            if max_num_seqs * (1 + model.block_size) > capture_size:
                extra_notes.append(
                    f"max_num_seqs {max_num_seqs}: the recipe's capture size stays at {capture_size} (cap "
                    f"{profile.capture_cap}), below a full verify batch of {max_num_seqs} x (1+{model.block_size}) = "
                    f"{max_num_seqs * (1 + model.block_size)} tokens; pass --capture-size to price another"
                )
        profile = profile._replace(max_num_seqs=max_num_seqs)
    rates, acceptance_label, length = acceptance_for(
        model, length=acceptance_length, rates_text=acceptance_rates, shape=acceptance_shape
    )
    gamma = model.block_size
    error_pct = payoff_pp = None
    calib = None
    error_source = "uncalibrated"
    if cost_table is not None:
        cost = load_cost_table(cost_table, capture_sizes=profile_capture_grid(model, profile, capture_size))
        notes = [
            f"cost: {cost.label}, per DP rank; verify tokens padded to vLLM's capture grid (up to "
            f"{cost.capture_sizes[-1]}) unless the file lists its own capture_sizes"
        ]
        notes += cost.notes()
        if not cost.draft_ms and not cost.includes_draft:
            notes.append("the cost table has no draft curve: drafting taken as free, which flatters speculation")
        error_source = f"measured on your server ({cost.label}); its error is that run's noise, not stated here"
    elif cost_model == "roofline":
        from rocm_dspark.planner.roofline import from_catalog

        cost = from_catalog(model, gpu, profile, capture_size=capture_size)
        notes = roofline_notes(cost, model, profile)
    else:
        from rocm_dspark.planner.calibration import class_matrix, class_rates, stored, transfer

        calib, host_note = calibration or stored(), calibration_note
        cost, same, transfer_notes = transfer(calib, catalog, model, gpu, profile, capture_size=capture_size)
        # tok/s: held out; outside the calibration setting also the spread between two builds (the model cannot
        # see builds, hosts or transfer errors). The gain: always both, as the gate decides per host and build.
        error_pct = calib.held_out_error_pct + (0.0 if same else calib.cross_build_spread_pct)
        payoff_pp = calib.held_out_payoff_error_pp + calib.cross_build_spread_pp
        notes = (
            ([host_note] if host_note else []) + calibrated_notes(calib, same, error_pct, payoff_pp) + transfer_notes
        )
        error_source = f"{calib.source_label}, {'held out' if same else 'held out + cross-build spread'}"
        if length is not None and calib.params.spread > 0:
            try:
                alphas = class_rates(length, gamma, calib.params.spread)
                rates = class_matrix(alphas, len(alphas), gamma).tolist()
                acceptance_label += (
                    f"; split into two equal request classes with conditional rates "
                    f"{alphas[0]:.3f} and {alphas[1]:.3f} (the heterogeneity fitted to the A/B)"
                )
            except UsageError:
                pass
    allowed, blocker = adaptive_status(catalog, profile)
    dp = dp or profile.dp
    title = (
        f"{model.key} on {gpu.key} ({profile.tp * dp}x {gpu.name}, TP{profile.tp}"
        f"{f' DP{dp}' if dp > 1 else ''}), profile {profile.status}"
    )
    # Optional fact: the draft lengths a build accepts (InferenceX reports that one V4.1 image needs
    # multiples of n_predict=5); without it every K in 1..block_size is planned.
    k_values = model.speculative.get("allowed_num_speculative_tokens")
    if k_values is not None and (
        not isinstance(k_values, list) or not all(isinstance(k, int) and 1 <= k <= gamma for k in k_values)
    ):
        raise UsageError(
            f"recipes/models: {model.key}.speculative.allowed_num_speculative_tokens must be a list "
            f"of integers in [1, {gamma}]"
        )
    result = plan_grid(
        cost,
        rates,
        concurrencies,
        gamma=gamma,
        k_values=k_values,
        max_num_seqs=profile.max_num_seqs,
        dp=dp,
        adaptive_allowed=allowed,
        adaptive_blocker=blocker,
        title=title,
        acceptance_label=acceptance_label,
        steps=steps,
        seed=seed,
    )
    result.error_pct, result.payoff_error_pp, result.error_source = error_pct, payoff_pp, error_source
    hold_to_error(result)
    result.build = f"vLLM {profile.vllm_build or profile.vllm_version}"
    if cost_table is not None:
        sizes = [r.batch * (1 + k) for r in result.rows for k in (0, *result.rows[0].fixed)]
        far = cost.far_sizes(sizes)
        if far:
            result.notes.append(
                f"cost table: padded step sizes {', '.join(map(str, far))} tokens are more than 2x "
                f"from every sample; predictions there lean on interpolation or extrapolation. "
                f"Measure at concurrencies closer to them"
            )
    result.notes = notes + extra_notes + [f"acceptance: {acceptance_label}"] + list(COMMON_NOTES) + result.notes
    from rocm_dspark.planner.mono_term import mono_note, mono_rows

    host_mono = calib.mono if calib is not None and calib.host else None
    mono_capture = capture_size or recipe_capture(profile.max_num_seqs, result.fixed_k, profile.capture_cap)
    result.mono = mono_rows(catalog, model, gpu, profile, result, cost, mono_capture, host_mono)
    result.notes += [n for n in (mono_note(catalog, result.mono, host_mono),) if n]
    if cost_table is None and cost_model == "calibrated":
        from rocm_dspark.planner.capture_term import capture_notes

        def rerun(size, concurrencies_):
            return plan_profile(**{**call, "capture_size": size, "concurrencies": concurrencies_})

        result.notes += capture_notes(result, cost, rerun)
    return result
