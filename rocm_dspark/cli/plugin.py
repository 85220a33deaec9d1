"""`rocm-dspark plugin status`: a thin wrapper over rocm_dspark.vllm_plugin.status.plugin_status."""

from __future__ import annotations

import json
import os

import click

from rocm_dspark.errors import UsageError


@click.group(short_help="The vLLM plugin backporting vllm#58151 onto vLLM 0.30-0.32.")
def plugin():
    """The vLLM plugin: vllm#58151's adaptive-verification declarations backported onto vLLM 0.30-0.32 on ROCm.

    \b
    Example:
      rocm-dspark plugin status
    """


@plugin.command(short_help="Installed vLLM, plugin registration, what adaptive needs.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--host-only",
    is_flag=True,
    help="Evaluate only this host's platform (default: also vLLM's ROCm classes, forced to ROCm here).",
)
@click.option(
    "-k",
    "--num-speculative-tokens",
    type=click.IntRange(1, 16),
    default=5,
    show_default=True,
    help="K of the adaptive-verification config the checks use.",
)
@click.option(
    "--gpu",
    help="recipes/gpus.yaml key whose arch stands in when forcing ROCm (default: the first listed).",
)
@click.option(
    "--model",
    type=click.Path(exists=True, file_okay=False),
    help="A DeepSeek-V4.1 checkpoint dir whose config.json the checks use (default: a config-only stand-in).",
)
@click.option(
    "--python",
    type=click.Path(exists=True, dir_okay=False),
    help="Inspect the vLLM installed for this interpreter instead of the current one.",
)
def status(as_json, host_only, num_speculative_tokens, gpu, model, python):
    """Installed vLLM, entry-point registration, what would be patched, and vLLM's own AV checks.

    \b
    Example:
      rocm-dspark plugin status --python /opt/venv/bin/python
      rocm-dspark plugin status --host-only --json
    """
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.vllm_plugin.status import format_table, plugin_status

    # Usage errors here, not an `error` inside the report (the child reads these only where vLLM is installed).
    if gpu:
        load_catalog().find_gpu(gpu)
    if model and not os.path.isfile(os.path.join(model, "config.json")):
        raise UsageError(f"--model {model!r} holds no config.json: pass a DeepSeek-V4.1 checkpoint directory")
    report = plugin_status(
        force_platform=None if host_only else "rocm",
        num_speculative_tokens=num_speculative_tokens,
        gpu=gpu,
        model=model,
        python=python,
    )
    click.echo(json.dumps(report, indent=2, default=str) if as_json else format_table(report))
