"""`rocm-dspark up`, `down` and `status`: one resumable command from a node to a validated endpoint."""

from __future__ import annotations

import json
import sys

import click

from rocm_dspark.cli import bounds
from rocm_dspark.cli.options import check_model_path, concurrency_levels, selection_options
from rocm_dspark.errors import UsageError, warn


@click.command(short_help="Bring this node to a validated endpoint; rerun to resume.")
@selection_options
@click.option(
    "--concurrency",
    default=None,
    metavar="C[,C...]",
    help="Validation sweep (and A/B) levels; the largest also sizes the plan's workload rules (as recipe "
    "--concurrency). Default: validate's levels and the profile's workload.",
)
@click.option(
    "--mode",
    type=click.Choice(["systemd", "foreground", "container"]),
    default=None,
    help="systemd: a unit running the pinned image; container: the pinned image, no unit; foreground: the "
    "host's vLLM, no container. Default: systemd where usable, else container, else foreground.",
)
@click.option("--dry-run", is_flag=True, help="Print every step and the exact commands; run and write nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before installing the systemd unit.")
@click.option("--quick", is_flag=True, help="Validate with the small workload (validate --quick).")
@click.option("--name", default=None, help="Launcher, unit and container name (default: rocm-dspark-<profile>).")
@click.option(
    "--service-user",
    default=None,
    help="systemd: the user the unit runs as (default: you); also the user the device check tests.",
)
@click.option(
    "--ready-timeout",
    type=bounds.SECONDS,
    default=3600.0,
    show_default=True,
    help="Seconds each vLLM start may take to become ready.",
)
@click.option(
    "--request-timeout",
    type=bounds.SECONDS,
    default=120.0,
    show_default=True,
    help="Seconds each validation request may take.",
)
@click.option(
    "--probe-levels",
    default="static,kernel",
    show_default=True,
    help="Probe levels before validation (live runs on the started server when it is the plan's adaptive command).",
)
@click.option(
    "--target",
    type=click.Choice(["node", "local-cpu"]),
    default="node",
    show_default=True,
    help="local-cpu is a TEST target: the installed vLLM on --model-path (with --mode container: the CPU "
    "image --image names), no GPU checks; nothing it produces counts for the gate.",
)
@click.option(
    "--vllm-bin", default=None, help="local-cpu: the vllm executable (default: beside this Python, else PATH)."
)
@click.option(
    "--ready-port",
    type=bounds.PORT,
    default=None,
    metavar="PORT",
    help="Also answer GET /ready on this port (on --host) for a load balancer: 200 once the served command "
    "is final and validated, 503 while a load runs, adaptive verification is proved, or it is down.",
)
def up(
    concurrency,
    mode,
    dry_run,
    yes,
    quick,
    name,
    service_user,
    ready_timeout,
    request_timeout,
    probe_levels,
    target,
    vllm_bin,
    ready_port,
    **opts,
):
    """Detect, choose, check, pull, write, start, probe, A/B, validate, summarise; rerun to continue.

    Exit status: 0 done, 1 a step failed (the line says the fix), 2 bad usage, 130 interrupted.

    \b
    Example:
      rocm-dspark up --model V4.1-Flash --dry-run
      rocm-dspark up --model V4.1-Flash --concurrency 1,64 --yes
    """
    from rocm_dspark.probe.run import parse_levels
    from rocm_dspark.runtime.progress import Display
    from rocm_dspark.up.runner import UpOptions, run_up

    check_model_path(opts, runs_here=True)
    from rocm_dspark.recipe.catalog import load_catalog

    catalog = load_catalog()  # a misspelt name is refused before any step prints (the dry run's on stdout)
    catalog.find_model(opts["model"])
    for flag, find in (("gpu", catalog.find_gpu), ("build", catalog.find_build), ("vllm_version", catalog.find_build)):
        if opts.get(flag):
            find(opts[flag])
    nodes = opts.get("nodes") or 1
    if nodes > 1:  # up has no --strategy: it brings up this node, node 0 of a data-parallel group
        if not opts.get("dp"):
            raise UsageError(
                f"--nodes {nodes}: up brings up one node, node 0 of a data-parallel group: add --dp (a "
                f"multiple of {nodes}); for a strategy's layout, `rocm-dspark launch --nodes {nodes} "
                f"--strategy NAME` writes every node's files (docs/multinode.md)"
            )
        warn(
            f"up brings up node 0 of the {nodes}-node group only; each other node runs the same command with what the "
            f"plan's multi-node note adds (docs/multinode.md)"
        )
    levels = tuple(lv for lv in parse_levels(probe_levels) if lv != "live")
    if (opts.get("adaptive") or "auto") == "on":
        raise UsageError(
            "--adaptive on: `up` follows the gate (auto) or forces block verification (off); "
            "prove adaptive verification with `rocm-dspark probe` first"
        )
    options = UpOptions(
        selection=opts,
        target=target,
        mode=mode,
        concurrency=concurrency_levels(concurrency),
        dry_run=dry_run,
        yes=yes,
        quick=quick,
        name=name,
        service_user=service_user,
        vllm_bin=vllm_bin,
        ready_timeout_s=ready_timeout,
        request_timeout_s=request_timeout,
        probe_levels=levels,
        ready_port=ready_port,
    )
    display = Display(sys.stdout if dry_run else sys.stderr)
    sys.exit(run_up(options, display))


@click.command(short_help="Stop the service `up` started; keep its state and files.")
@click.option("--state-dir", default=None, help="The state directory `up` used.")
@click.option("--purge-cache", is_flag=True, help="Then remove the compile cache (the next start compiles cold).")
def down(state_dir, purge_cache):
    """Stop the service `up` started; keep the state, launchers, records and reports.

    \b
    Example:
      rocm-dspark down
      rocm-dspark down --purge-cache
    """
    from rocm_dspark.probe.store import state_dir as resolve
    from rocm_dspark.runtime.progress import Display
    from rocm_dspark.service.status import down as stop

    sys.exit(stop(resolve(state_dir), Display(sys.stdout), purge_cache=purge_cache))


@click.command()
@click.option("--state-dir", default=None, help="The state directory `up` used.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--ready",
    "ready_check",
    is_flag=True,
    help="Only the readiness line; exit 0 when the service may take traffic, 1 while it is proved or down "
    "(a load balancer's or an exec readiness check).",
)
@click.option(
    "--listen",
    default=None,
    metavar="[HOST:]PORT",
    help="With --ready: answer GET /ready over HTTP until stopped (200 ready, 503 not ready; the same "
    "answer as the exit status). `up --ready-port` runs this.",
)
def status(state_dir, as_json, ready_check, listen):
    """Show `up`'s steps and whether its service runs.

    \b
    Example:
      rocm-dspark status --json
      rocm-dspark status --ready
      rocm-dspark status --ready --listen 0.0.0.0:8001
    """
    from rocm_dspark.probe.store import state_dir as resolve
    from rocm_dspark.service.status import status_lines
    from rocm_dspark.up.runner import status as get

    if listen is not None:
        from rocm_dspark.service.readiness import parse_listen, serve_forever

        if not ready_check:
            raise UsageError("--listen serves the readiness check: give it with --ready (status --ready --listen PORT)")
        host, port = parse_listen(listen)
        sys.exit(serve_forever(resolve(state_dir), host, port, say=lambda line: click.echo(line, err=True)))
    st = get(resolve(state_dir), sizes=not ready_check)
    if ready_check:
        r = st["readiness"]
        click.echo(json.dumps(r) if as_json else f"{'ready' if r['ready'] else 'not ready'}: {r['phase']}: {r['why']}")
        sys.exit(0 if r["ready"] else 1)
    if as_json:
        click.echo(json.dumps(st, indent=1, default=str))
    else:
        click.echo("\n".join(status_lines(st)))
