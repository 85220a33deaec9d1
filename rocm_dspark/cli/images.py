"""`rocm-dspark images`: what this host's registry holds for each candidate build, and what the plan runs."""

from __future__ import annotations

import json

import click

from rocm_dspark.errors import EnvironmentFailure, UsageError


@click.command(short_help="Ask the registry what each candidate image tag holds now.")
@click.option("--gpu", help="GPU (recipes/gpus.yaml key); detected with amd-smi/rocminfo when omitted.")
@click.option("--build", help="Ask about this build only (recipes/vllm.yaml).")
@click.option(
    "--state-dir",
    help="Where the answers are recorded (default: $ROCM_DSPARK_STATE_DIR or the XDG state dir).",
)
@click.option(
    "--skopeo/--http",
    "use_skopeo",
    default=None,
    help="Ask with skopeo, or with the Docker Registry HTTP API (default: skopeo when installed).",
)
@click.option("--image", metavar="REF", help="Ask about this image only (what `--image REF` runs).")
@click.option(
    "--registry",
    metavar="HOST[:PORT]",
    envvar="ROCM_DSPARK_REGISTRY",
    help="A mirror: ask it for the same repository and tag ($ROCM_DSPARK_REGISTRY).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def images(gpu, build, state_dir, use_skopeo, image, registry, as_json):
    """Ask the registry what each candidate image tag is now; record the answers for the plans.

    \b
    Example:
      rocm-dspark images --gpu mi300x
      rocm-dspark images --build v0.33.0-rocm72 --json
    """
    from rocm_dspark.images import pick, report
    from rocm_dspark.images import registry as reg
    from rocm_dspark.probe.store import state_dir as resolve_state_dir
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.recipe.selection import detect_gpu

    catalog = load_catalog()
    key = gpu or detect_gpu(catalog)
    spec = catalog.find_gpu(key) if key else None
    if image and build:
        raise UsageError("--image and --build: pass one of them")
    mirror = pick.check_mirror(registry) if registry else None
    ref = pick.check_ref(image) if image else None
    resolver = lambda tag: reg.resolve(tag, use_skopeo=use_skopeo)  # noqa: E731
    result = report.run(catalog, resolve_state_dir(state_dir), spec, build, resolver=resolver, mirror=mirror, image=ref)
    click.echo(json.dumps(result, indent=2) if as_json else "\n".join(report.lines(result)))
    runs = result.get("runs") or {}
    if runs.get("missing"):
        raise UsageError(runs["missing"])
    if all("error" in r for r in result["images"]):
        raise EnvironmentFailure(f"no registry answered: {result['images'][0]['error']}")
