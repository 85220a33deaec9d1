"""The `rocm-dspark` command: a click group whose subcommands load lazily.

Each subcommand lives in its own module and is imported only when it runs, so
`rocm-dspark recipe` never pays for (or needs) torch, triton or vllm.
"""

from __future__ import annotations

import importlib
import sys

import click

# command name -> "module:attribute" of a click.Command
COMMANDS = {
    "recipe": "rocm_dspark.cli.recipe:recipe",
    "list": "rocm_dspark.cli.recipe:list_catalog",
    "launch": "rocm_dspark.cli.launch:launch",
    "plan": "rocm_dspark.cli.plan:plan",
    "plugin": "rocm_dspark.cli.plugin:plugin",
    "probe": "rocm_dspark.cli.probe:probe",
    "validate": "rocm_dspark.cli.validate:validate",
    "up": "rocm_dspark.cli.up:up",
    "down": "rocm_dspark.cli.up:down",
    "status": "rocm_dspark.cli.up:status",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup)
@click.version_option(package_name="rocm-dspark")
def cli():
    """Trusted vLLM launches for DeepSeek-V4.1-Flash + DSpark on AMD MI300-class GPUs.

    Exit status: 0 done, 1 a check failed, 2 bad usage, 3 the environment failed.

    \b
    Example:
      rocm-dspark recipe --model V4.1-Flash
      rocm-dspark COMMAND --help
    """


# Optional dependency -> the extra that installs it, for a one-line hint instead of a traceback.
EXTRAS = {
    "numpy": "planner", "matplotlib": "plot", "torch": "kernels", "triton": "kernels", "httpx": "validate",
    "prometheus_client": "validate",
}


def main(argv=None):
    from rocm_dspark.errors import EXIT_ENVIRONMENT, EXIT_USAGE, EnvironmentFailure, UsageError

    try:
        return cli.main(args=argv, prog_name="rocm-dspark", standalone_mode=True)
    except UsageError as exc:  # raised outside a command's own handling
        click.echo(f"rocm-dspark: error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except EnvironmentFailure as exc:  # the input was fine; the host or server failed under us
        click.echo(f"rocm-dspark: error: {exc}", err=True)
        sys.exit(EXIT_ENVIRONMENT)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in EXTRAS:
            raise
        click.echo(f"rocm-dspark: error: this command needs {top}; install it with "
                   f"pip install 'rocm-dspark[{EXTRAS[top]}]'", err=True)
        sys.exit(EXIT_USAGE)
