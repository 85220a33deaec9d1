"""`rocm-dspark recipe` and `rocm-dspark list`: thin wrappers over the catalog and the resolver."""

from __future__ import annotations

import click

from rocm_dspark.cli.options import check_model_path, cluster_options, selection_options
from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.cluster import pop_cluster, refuse_without_strategy
from rocm_dspark.usecase.launch_plan import plan_from_options


@click.command(short_help="Print the vLLM launch for a model on an AMD GPU.")
@selection_options
@cluster_options
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["shell", "json", "docker", "k8s"]),
    default="shell",
    show_default=True,
    help="shell: copy-pasteable command; json: argv/env/image/notes; docker: docker run with AMD device flags; "
    "k8s: Kubernetes manifests (with --strategy).",
)
@click.option("--explain", is_flag=True, help="Print every note in full: reasons, evidence links, removal conditions.")
def recipe(fmt, explain, **opts):
    """Print the vLLM launch for a model on this (or the given) AMD GPU.

    \b
    Example:
      rocm-dspark recipe --model V4.1-Flash --gpu mi300x
      rocm-dspark recipe --model V4.1-Flash --format docker > serve.sh
    """
    copts = pop_cluster(opts)
    if copts.get("strategy") or fmt == "k8s":
        _cluster(fmt, opts, copts, explain)
    else:
        refuse_without_strategy(copts)
        from rocm_dspark.launch.render import RENDERERS

        click.echo(RENDERERS[fmt](plan_from_options(opts), explain=explain), nl=False)
    check_model_path(opts, runs_here=False)  # a warning, printed once the command succeeds (errors.warn)


def _cluster(fmt, opts, copts, explain=False):
    from rocm_dspark.usecase.launch_plan import cluster_for

    plan, cluster = cluster_for(opts, copts, k8s=fmt == "k8s")
    rank = copts.get("node_rank")
    if fmt == "json":
        from rocm_dspark.launch.render_cluster import render_cluster_json

        click.echo(render_cluster_json(plan, cluster, rank), nl=False)
    elif fmt == "k8s":
        from rocm_dspark.launch.k8s import manifests_for, render_yaml

        if rank is not None:
            raise UsageError("--format k8s prints the whole group (one LeaderWorkerSet); drop --node-rank")

        click.echo(render_yaml(manifests_for(plan, cluster)), nl=False)
    elif fmt == "docker":
        also = "" if cluster.strategy == "replicas" else " or k8s"  # replicas has no Kubernetes form
        raise UsageError(f"--format docker prints one node's container; with --strategy use shell or json{also}")
    else:
        from rocm_dspark.launch.render_cluster import render_cluster_shell

        click.echo(render_cluster_shell(plan, cluster, rank, explain=explain), nl=False)


@click.command(name="list", short_help="Show the models, GPUs, builds and profiles in recipes/.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_catalog(as_json):
    """Show the models, GPUs and profiles in recipes/, with each profile's status.

    \b
    Example:
      rocm-dspark list
      rocm-dspark list --json
    """
    from rocm_dspark.recipe.catalog import load_catalog

    cat = load_catalog()
    if as_json:
        import json

        models = {
            m.key: dict(
                hf_id=m.hf_id,
                aliases=list(m.aliases),
                fallback=m.fallback,
                profiles={
                    g: dict(status=p.status, date=p.status_date, tp=p.tp, evidence=list(p.evidence), image=p.image)
                    for g, p in m.profiles.items()
                },
            )
            for m in cat.models.values()
        }
        gpus = {
            g.key: dict(name=g.name, arch=g.arch, hbm_gb=g.hbm_gb, fp8=g.fp8_format, native_fp4=g.native_fp4)
            for g in cat.gpus.values()
        }
        builds = {
            b.name: dict(
                image=b.image,
                digest=b.digest,
                commit=b.vllm_commit,
                reported_version=b.reported_version,
                rocm=b.rocm,
                channel=b.channel,
                status=b.status,
                date=b.date,
                changes=list(b.changes),
                evidence_on={g: list(u) for g, u in b.gpus.items()},
            )
            for b in cat.builds.values()
        }
        click.echo(json.dumps({"models": models, "gpus": gpus, "builds": builds}, indent=2))
        return
    from rocm_dspark.textwidth import aligned

    gpu_rows = [
        (
            g.key,
            g.name,
            g.arch,
            f"{g.hbm_gb:g} GB",
            f"{g.hbm_bandwidth_tbps:g} TB/s",
            f"{g.fp8_format.upper()} fp8, {'native MXFP4' if g.native_fp4 else 'no native FP4'}",
        )
        for g in cat.gpus.values()
    ]
    build_rows = [
        (
            b.name,
            b.status,
            b.date or "-",
            f"reports {b.reported_version or '?'}",
            f"ROCm {b.rocm or '?'} ({b.channel})",
            f"evidence on {', '.join(b.gpus)}" if b.gpus else "",
        )
        for b in cat.builds.values()
    ]
    click.echo(
        "\n".join(["GPUs:", *aligned(gpu_rows, "  "), "vLLM builds (recipes/vllm.yaml):", *aligned(build_rows, "  ")])
    )
    click.echo("Models and profiles:")
    rows = iter(
        aligned(
            [
                (g, p.status, p.status_date, f"TP{p.tp}", f"build {p.vllm_build}", p.evidence[0])
                for m in cat.models.values()
                for g, p in m.profiles.items()
            ],
            "    ",
        )
    )  # one column set
    for m in cat.models.values():
        extra = f"  (fallback: {m.fallback})" if m.fallback else ""
        click.echo(f"  {m.key}  [{m.hf_id}]  aliases: {', '.join(m.aliases[:2])}{extra}")
        for _ in m.profiles:
            click.echo(next(rows))
