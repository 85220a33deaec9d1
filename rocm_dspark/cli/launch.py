"""`rocm-dspark launch`: write a launcher script (and a systemd unit) for the resolved plan."""

from __future__ import annotations

import json
import shlex

import click

from rocm_dspark import textwidth
from rocm_dspark.cli import bounds
from rocm_dspark.cli.options import check_model_path, cluster_options, selection_options
from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.cluster import pop_cluster, refuse_without_strategy
from rocm_dspark.usecase.launch_plan import plan_from_options


@click.command(short_help="Write launcher files (bash, systemd, k8s) for a plan.")
@selection_options
@cluster_options
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["shell", "systemd", "k8s"]),
    default="shell",
    show_default=True,
    help="shell: a bash launcher; systemd: the launcher plus a .service unit and a 0600 env file; "
    "k8s: Kubernetes manifests (<name>.k8s.yaml). With --strategy: one launcher (or unit) per node.",
)
@click.option("--output", default=".", show_default=True, help="Existing directory to write the files into.")
@click.option("--name", help="File, unit and container name (default: rocm-dspark-<profile>).")
@click.option("--user", help="systemd: the dedicated user the service runs as (default: vllm).")
@click.option(
    "--env-file",
    help="The 0600 env file for secrets such as HF_TOKEN and every --env value (default: "
    "<output>/<name>.env). An existing one is kept, must be mode 0600, and gets the --env values set "
    "in it. systemd: the install commands copy it to /etc/rocm-dspark/<name>.env, the unit's "
    "EnvironmentFile=, unless the node has one there already.",
)
@click.option("--container", is_flag=True, help="Run vLLM in the plan's image (pinned by digest) with docker.")
@click.option(
    "--pull",
    is_flag=True,
    help="With --container: pull the image now and write its digest into the launcher (starts never pull).",
)
@click.option(
    "--ready-timeout",
    type=bounds.INT_SECONDS,
    default=3600,
    show_default=True,
    help="Seconds each start may take to answer /health and /v1/models.",
)
@click.option(
    "--stop-timeout",
    type=bounds.INT_SECONDS,
    default=300,
    show_default=True,
    help="Seconds vLLM may drain after SIGTERM before the launcher kills it (the unit's TimeoutStopSec "
    "is written for it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the written paths as JSON.")
def launch(fmt, output, name, user, env_file, container, pull, ready_timeout, stop_timeout, as_json, **opts):
    """Write launcher files for a model on this (or the given) AMD GPU.

    \b
    Example:
      rocm-dspark launch --model V4.1-Flash --gpu mi355x --format systemd --output /srv/vllm
      rocm-dspark launch --model V4.1-Flash --container --output .
    """
    how = dict(  # what both writers take
        name=name,
        user=user,
        env_file=env_file,
        container=container,
        ready_timeout_s=ready_timeout,
        stop_timeout_s=stop_timeout,
    )
    copts = pop_cluster(opts)
    if copts.get("strategy") or fmt == "k8s":
        _write_group(fmt, output, how, as_json, opts, copts)
    else:
        refuse_without_strategy(copts)
        _write_one(fmt, output, how, pull, as_json, opts)
    check_model_path(opts, runs_here=False)  # a warning, printed once the command succeeds (errors.warn)


def _write_group(fmt, output, how, as_json, opts, copts):
    from rocm_dspark.launch.launch_group import write_group
    from rocm_dspark.usecase.launch_plan import cluster_for

    plan, cluster = cluster_for(opts, copts, k8s=fmt == "k8s")
    written = write_group(plan, cluster, output, fmt, **how, node_rank=copts.get("node_rank"), bands=_bands(plan, opts))
    if as_json:
        click.echo(json.dumps(written, indent=2))
        return
    for item in written["files"]:
        _say(f"wrote {item['path']}  ({item['what']})")
    for line in written["next"]:
        click.echo(line)
    for node in written.get("install") or ():
        where = f" ({node['address']})" if node.get("address") else ""
        click.echo(f"node {node['node']}{where}, {node['role']}: in the directory holding its files, run:")
        for cmd in node["commands"]:
            click.echo(f"  {cmd}")


def _write_one(fmt, output, how, pull, as_json, opts):
    from rocm_dspark.launch import observability
    from rocm_dspark.launch.launchers import INSTALL_DIR, installed_env_file, write_launchers

    plan = plan_from_options(opts)
    if pull:
        if not how["container"]:
            raise UsageError("--pull pins the image of a container launcher: add --container")
        from rocm_dspark.images.pull import pin_for_launch
        from rocm_dspark.probe.store import state_dir

        plan, got = pin_for_launch(plan, state_dir(opts.get("state_dir")), say=lambda line: click.echo(line, err=True))
        click.echo(f"pinned {got['image']} to {got['pinned']}: the launcher runs that digest and never pulls", err=True)
    written = write_launchers(plan, output, fmt, **how)
    obs = observability.write(
        written.launcher.parent,
        observability.render(plan, written.name, observability.targets(plan), bands=_bands(plan, opts)),
    )
    if as_json:
        paths = {
            "format": written.fmt,
            "name": written.name,
            "launcher": str(written.launcher),
            "unit": str(written.unit) if written.unit else None,
            "env_file": str(written.env_file) if written.env_file else None,
            "env_file_written": written.env_file_written,
            "install_commands": list(written.install_commands),
            "observability": [str(p) for p in obs],
        }
        click.echo(json.dumps(paths, indent=2))
        return
    _say(f"wrote {written.launcher}")
    _say(
        f"wrote {', '.join(p.name for p in obs)} (Prometheus scrape config, rules, Grafana dashboard; docs/operations.md)"
    )
    if written.unit is None and written.env_file_written:
        _say(
            f"wrote {written.env_file} (mode 0600: the --env values, in docker --env-file syntax; the launcher hands "
            f"it to vLLM)"
        )
    if written.unit is None:
        from rocm_dspark.launch.launch_facts import state_root

        root = state_root() or "~/.local/state/rocm-dspark"  # the launcher's rule, read from this environment
        click.echo("Run it:")
        _command([str(written.launcher)])
        _say(f"State, logs and the exact command go to {root}/launch/{written.name} when run with this environment.")
        return
    _say(f"wrote {written.unit}")
    _say(
        f"{'wrote' if written.env_file_written else 'kept'} {written.env_file} (mode 0600; the install commands copy "
        f"it to {installed_env_file(written.name)}, the unit's EnvironmentFile=, unless that exists: put HF_TOKEN "
        "there)"
    )
    _say(
        f"The unit runs the launcher from {INSTALL_DIR} (root-owned, copied there by the install commands): "
        "run them again after regenerating it."
    )
    if plan.secret_env:  # the install commands never overwrite the node's env file (a token put there stays)
        _say(
            f"A node installed before keeps its {installed_env_file(written.name)}, so "
            f"these --env values ({', '.join(plan.secret_env)}) do not reach it; "
            "there, replace that whole file with:"
        )
        _command(
            [*"sudo install -m 0600 -o root -g root".split(), str(written.env_file), installed_env_file(written.name)]
        )
    click.echo("Install and start:")
    for cmd in written.install_commands:  # broken with `\` to the width: each still pastes and runs
        # each line is a command by construction (launchers.install_commands: shlex.join of its argv), so its
        # words are that argv's, quoted again the same way
        _command(shlex.split(cmd))


def _bands(plan, opts) -> dict:
    """The acceptance bands of the trusted A/B record at the plan's --concurrency (none without one)."""
    if not plan.speculative_config or plan.concurrency is None:
        return {}
    from rocm_dspark.probe.ab_band import bands_for
    from rocm_dspark.recipe.catalog import load_catalog

    return bands_for(load_catalog(), plan, opts.get("state_dir"))[0]


def _say(text: str) -> None:
    """One message wrapped to the width (a long path moves to its own, indented line)."""
    click.echo("\n".join(textwidth.wrap(text)))


def _command(argv: list[str]) -> None:
    """A command, quoted and broken with `\\` to the width so that it still pastes and runs."""
    click.echo("\n".join(textwidth.command([shlex.quote(w) for w in argv], "  ")))
