"""`rocm-dspark plan`: predicted tokens/s for no speculation, fixed K, per-batch-size K and adaptive
verification across concurrency, and a recommended setting (rocm_dspark.planner)."""

from __future__ import annotations

import json

import click

from rocm_dspark.cli import bounds
from rocm_dspark.errors import UsageError


@click.command(short_help="Predict tokens/s per speculation setting; recommend one.")
@click.option("--model", "-m", default="V4.1-Flash", show_default=True, help="Model name or alias.")
@click.option(
    "--gpu",
    help="GPU profile(s), comma-separated (mi300x,mi325x,mi350x,mi355x); default: every profile of the model.",
)
@click.option(
    "--concurrency",
    default="1,16,64,128,512",
    show_default=True,
    help="Concurrent requests to plan for, comma-separated.",
)
@click.option(
    "--acceptance-length",
    type=bounds.ACCEPTANCE,
    help="Mean tokens per request per step with every draft verified (vLLM's synthetic_acceptance_length); "
    "default: the model's golden from recipes/.",
)
@click.option(
    "--acceptance-rates",
    help="Conditional acceptance per drafted position, comma-separated: P(draft j accepted | 1..j-1 accepted).",
)
@click.option(
    "--acceptance-shape",
    type=click.Choice(["geometric", "synthetic"]),
    default="geometric",
    show_default=True,
    help="How --acceptance-length spreads over positions: one constant conditional rate, or vLLM's "
    "synthetic schedule [1,..,1,frac,0,..] (what its synthetic benchmark mode runs).",
)
@click.option(
    "--cost-table",
    help="Measured step costs (JSON {verify:[[tokens,ms]..], draft:[[reqs,ms]..]} or CSV tokens,ms) "
    "instead of the roofline.",
)
@click.option(
    "--cost-model",
    type=click.Choice(["calibrated", "roofline"]),
    default="calibrated",
    show_default=True,
    help="Without --cost-table: the step model fit to public measurements (recipes/step_cost.yaml), "
    "or the uncalibrated roofline.",
)
@click.option(
    "--nodes",
    type=bounds.NODES,
    help="Also predict each multi-node strategy (recipes/strategies.yaml) at this many nodes, one line each.",
)
@click.option(
    "--capture-size",
    type=click.IntRange(1, 1 << 20),
    help="The server's largest captured graph size (default: the recipe's); verify batches above it are "
    "priced as eager/piecewise steps and marked.",
)
@click.option(
    "--max-num-seqs",
    type=click.IntRange(1, 1 << 16),
    help="The server's max_num_seqs (default: the recipe's): plan concurrencies above it without queueing; "
    "the recipe's capture size follows it up to the cap, so bigger verify batches are priced eager.",
)
@click.option(
    "--calibrate",
    "calibrate_file",
    multiple=True,
    help="Fit the step model to your own runs (a plain table, a `validate --ab` record or a `validate` "
    "report.json; repeat to combine) for one --gpu, print the leave-one-out error and keep the fit "
    "as this host's calibration (docs/calibration.md).",
)
@click.option("--state-dir", help="Where this host's calibration is kept (default: the probe's state dir).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--plot",
    help="Also write a PNG of tokens/s against concurrency (needs matplotlib); the path it wrote goes to stderr.",
)
@click.option("--seed-example", is_flag=True, help="Reproduce the seed document's cost model and tables, and exit.")
@click.option(
    "--seed",
    type=click.IntRange(0, 2**32 - 1),
    default=0,
    show_default=True,
    help="Seed of the simulator's acceptance draws.",
)
def plan(
    model,
    gpu,
    concurrency,
    nodes,
    capture_size,
    max_num_seqs,
    calibrate_file,
    state_dir,
    as_json,
    plot,
    seed_example,
    **inputs,
):
    """Plan DSpark speculation for a GPU profile and a workload (a model, not a measurement).

    \b
    Example:
      rocm-dspark plan --gpu mi300x,mi355x --concurrency 1,16,64,128
      rocm-dspark plan --gpu mi355x --cost-table costs.json --plot plan.png
    """
    if seed_example:
        from rocm_dspark.planner.seed.example import seed_lines, seed_report

        report = seed_report()
        click.echo(json.dumps(report, indent=2) if as_json else "\n".join(seed_lines(report)))
        return

    from rocm_dspark.planner.profile import parse_concurrency, plan_profile
    from rocm_dspark.planner.report import table_lines, to_dict, write_plot
    from rocm_dspark.recipe.catalog import load_catalog

    catalog = load_catalog()
    spec = catalog.find_model(model)
    concurrencies = bounds.check_levels(parse_concurrency(concurrency))
    gpus = [g.strip() for g in gpu.split(",") if g.strip()] if gpu is not None else sorted(spec.profiles)
    if not gpus:
        raise UsageError(f"--gpu {gpu!r} names no GPU profile; give e.g. --gpu mi300x,mi355x or leave it out")
    if calibrate_file:
        from rocm_dspark.probe.calibration_record import run_calibrate

        if len(gpus) != 1:
            raise UsageError("--calibrate fits one GPU profile: pass exactly one --gpu (the GPU the runs used)")
        lines, kept = run_calibrate(catalog, spec, gpus[0], list(calibrate_file), state_dir, as_json=as_json)
        click.echo("\n".join(lines))
        if not kept:  # shown, not kept (above the leave-one-out bound): exit 1 so a script notices
            raise SystemExit(1)
        return
    from rocm_dspark.probe.calibration_record import host_calibration

    # The rest of the options are the planner's inputs, the same for each profile and for its strategies' lines.
    inputs["concurrencies"] = concurrencies
    server = {"capture_size": capture_size, "max_num_seqs": max_num_seqs}  # the profiles' only
    plans = []
    for g in gpus:
        key = catalog.find_gpu(g).key
        profile = spec.profiles.get(key)  # this host's `plan --calibrate` fit for it, ahead of the public one
        own, note = host_calibration(spec.key, key, profile.tp, state_dir) if profile else (None, None)
        plans.append(plan_profile(catalog, spec, g, **inputs, **server, calibration=own, calibration_note=note))
    scaling = None
    if nodes is not None:
        from rocm_dspark.planner.strategies import strategy_lines

        scaling = {g: strategy_lines(catalog, spec, g, nodes, p, **inputs) for g, p in zip(gpus, plans)}
    if plot:  # last: a usage error in any input above must leave nothing written
        write_plot(plans, plot)
        click.echo(f"wrote {plot}", err=True)
    # The one `recipe` command that applies each recommendation, checked by resolving it (rocm_dspark.recipe.plan_apply).
    from rocm_dspark.recipe.plan_apply import apply_command

    def applied(g, p):
        argv, why = apply_command(catalog, spec, g, p.speculative_config)
        if why is None or not p.fixed_k:
            return argv, why, None
        return argv, why, apply_command(catalog, spec, g, {"num_speculative_tokens": p.fixed_k})[0]

    applies = [applied(g, p) for g, p in zip(gpus, plans)]
    if as_json:
        out = {
            "model": spec.key,
            "plans": [
                dict(to_dict(p), apply={"recipe": argv, "refused": why, "instead": other})
                for p, (argv, why, other) in zip(plans, applies)
            ],
        }
        if scaling is not None:
            out["strategies"] = {g: [row for row, _ in rows] for g, rows in scaling.items()}
        click.echo(json.dumps(out, indent=2))
        return
    import shlex

    from rocm_dspark import textwidth

    def fitted(line):  # table rows as they are (at most textwidth.MAX_TABLE); the rest is prose, wrapped
        return [line] if " | " in line or not line.strip("-") else textwidth.prose(line)

    def with_apply(lines, applied):
        argv, why, other = applied
        at = next((i for i, ln in enumerate(lines) if ln.startswith("note: ")), len(lines))
        if why is None:  # the command alone, broken with `\` so that it pastes and runs
            new = textwidth.command_lines(["  apply:", *map(shlex.quote, argv)], "    ")
            if argv[-2:] == ["--adaptive", "on"]:
                new += textwidth.prose("    (turns on once `rocm-dspark probe` has proven it on this host)")
        else:
            new = textwidth.prose(
                f"  apply: `recipe` refuses it on every build ({why})"
                + (f"; the best fixed K it runs: {shlex.join(other)}" if other else "")
            )
        return [w for ln in lines[:at] for w in fitted(ln)] + new + [w for ln in lines[at:] for w in fitted(ln)]

    text = "\n\n".join("\n".join(with_apply(table_lines(p), a)) for p, a in zip(plans, applies))
    if scaling is not None:
        text += "".join("\n\n" + "\n".join(w for _, line in rows for w in fitted(line)) for rows in scaling.values())
    click.echo(text)
