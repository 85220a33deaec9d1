"""`rocm-dspark probe`: gather the evidence that gates adaptive verification, or show the records."""

from __future__ import annotations

import json
import sys

import click

from rocm_dspark.cli import bounds
from rocm_dspark.cli.options import selection_options
from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.selection import build_selection


def _model_optional(fn):
    # `probe --show` needs no model; the check that a probe run has one is in the command body.
    for param in getattr(fn, "__click_params__", []):
        if param.name == "model":
            param.required = False
    return fn


@click.command(short_help="Prove (or refute) adaptive verification on this host.")
@_model_optional
@selection_options
@click.option(
    "--levels",
    default="static,kernel,live",
    show_default=True,
    help="Comma-separated levels to run: static, kernel, live.",
)
@click.option(
    "--deadline",
    type=bounds.SECONDS,
    default=3600.0,
    show_default=True,
    help="Seconds the live level waits for the server to become ready.",
)
@click.option(
    "--server-json",
    "server_json",
    metavar="FILE",
    help="JSON file describing the server the live level runs instead of the plan's (same format as "
    "validate --server-json; hosts where the plan cannot run, e.g. CPU tests); such a record "
    "never turns the flag on.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout (progress stays on stderr).")
@click.option("--show", is_flag=True, help="Print the latest probe records in the state directory and exit.")
@click.option("--limit", type=bounds.COUNT, default=5, show_default=True, help="With --show: how many records.")
def probe(levels, deadline, server_json, as_json, show, limit, **opts):
    """Prove (or refute) adaptive verification on this host and write a fingerprinted record.

    \b
    Example:
      rocm-dspark probe --model V4.1-Flash --gpu mi300x
      rocm-dspark probe --model V4.1-Flash --levels static,kernel --json
      rocm-dspark probe --show
    """
    from rocm_dspark.probe import show as shown
    from rocm_dspark.probe import store

    state_dir = opts.get("state_dir")
    if show:
        entries = shown.latest(state_dir, max(1, limit))
        if as_json:
            click.echo(json.dumps(shown.entries_json(entries), indent=1))
        else:
            click.echo("\n".join(shown.show_lines(entries, store.records_dir(state_dir))))
        return
    if not opts.get("model"):
        raise UsageError("--model is required to probe (e.g. --model V4.1-Flash); only --show works without it")
    if (opts.get("adaptive") or "auto") != "auto":
        raise UsageError("--adaptive does not apply to probe: the probe always tests adaptive verification on")

    from rocm_dspark.probe.live import target_from_spec
    from rocm_dspark.probe.run import parse_levels, run_probe
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.runtime.server_spec import load_server_spec

    wanted = parse_levels(levels)
    catalog = load_catalog()
    selection = build_selection(opts, catalog)
    target = None
    if server_json:
        if "live" not in wanted:
            raise UsageError("--server-json only applies to the live level: add live to --levels")
        target = target_from_spec(
            load_server_spec(server_json, flag="--server-json"), catalog.find_model(selection.model)
        )

    outcome = run_probe(
        catalog,
        selection,
        levels=wanted,
        state_dir=state_dir,
        deadline_s=deadline,
        live_target=target,
        progress=lambda message: click.echo(f"[probe] {message}", err=True),
    )
    from rocm_dspark.recipe.resolve import resolve_plan
    from rocm_dspark.usecase.verdict import judge

    plan = resolve_plan(catalog, selection)  # the verdict on every record now here, this one included
    verdict = judge(catalog, plan, state_dir=state_dir, concurrency=plan.concurrency).verdict
    if as_json:
        summary = {**outcome.summary(), "verdict": {"state": verdict.outcome, "reason": verdict.reason}}
        click.echo(json.dumps(summary, indent=1))
    else:
        lines = shown.record_lines(outcome.record, str(outcome.path), outcome.gate_state, outcome.gate_reason)
        click.echo("\n".join([*lines, f"verdict for this host and plan: {verdict.outcome} ({verdict.reason})"]))
    sys.exit(0 if outcome.passed else 1)
