"""The `rocm-dspark` command: a click group whose subcommands load lazily.

Each subcommand lives in its own module and is imported only when it runs, so
`rocm-dspark recipe` never pays for (or needs) torch, triton or vllm.
"""

from __future__ import annotations

import errno
import gc
import importlib
import sys

import click

from rocm_dspark.errors import EXIT_ENVIRONMENT, EXIT_USAGE, PENDING_WARNINGS, EnvironmentFailure, UsageError

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
    "canary": "rocm_dspark.cli.canary:canary",
    "images": "rocm_dspark.cli.images:images",
}


BARE = (
    f"usage: rocm-dspark COMMAND [OPTIONS]; commands: {', '.join(COMMANDS)}\n"
    "start with: rocm-dspark recipe --model V4.1-Flash\n"
    "rocm-dspark COMMAND --help: a command's options; rocm-dspark --help: every command in a line"
)


# Write errors that mean the output stream failed (a full disk, a closed or broken pipe), not a bad argument.
STREAM_ERRNOS = (errno.ENOSPC, errno.EPIPE, errno.EBADF, errno.EIO, errno.EFBIG, errno.EDQUOT)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C


class _ClosedStdout:
    """sys.stdout when the process started with fd 1 closed (`>&-`): Python leaves None there and click then
    prints nothing; this raises the write error instead, so a command that prints fails naming stdout."""

    def write(self, _text) -> int:
        raise OSError(errno.EBADF, "stdout is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _error(message: str, code: int = EXIT_USAGE):
    # Lines joined, spaces within a line kept: a value quoted in the message prints as the user gave it.
    one_line = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    click.echo(f"rocm-dspark: error: {one_line}", err=True)
    sys.exit(code)


class LazyGroup(click.Group):
    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Every usage error, click's included, is one line on stderr and exit status 2 (README, "Bad input"), a
        failing environment one line and status 3; a bare `rocm-dspark` prints the command list (BARE), status 2.

        Arguments are strict UTF-8 (README, "Encoding"): one that is not is refused before anything runs."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        PENDING_WARNINGS.clear()  # none left from an earlier command in this process
        argv = sys.argv[1:] if args is None else list(args)
        for i, arg in enumerate(argv, start=1):
            try:
                str(arg).encode("utf-8")
            except UnicodeEncodeError:  # a byte that is not UTF-8 reaches Python as a lone surrogate
                _error(
                    f"argument {i} ({ascii(arg)}) is not valid UTF-8; rocm-dspark takes UTF-8 arguments and paths only"
                )
        if sys.stdout is None:
            sys.stdout = _ClosedStdout()
        try:
            try:
                rv = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
            except SystemExit as exc:  # a command that exits with its own status (up, validate): its warnings too
                if not isinstance(exc.code, (int, type(None))):
                    raise
                rv = exc.code
            finally:  # a command that calls sys.exit too: a buffered write to a full disk fails here, handled below
                sys.stdout.flush()
        except click.exceptions.Abort as exc:
            if isinstance(exc.__cause__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
                _error("interrupted (Ctrl-C)", EXIT_INTERRUPTED)
            _error("aborted", 1)
        except KeyboardInterrupt:  # raised outside click's own handling
            _error("interrupted (Ctrl-C)", EXIT_INTERRUPTED)
        except click.exceptions.ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # a bare `rocm-dspark`: the commands, in a few lines
                click.echo(BARE, err=True)
                sys.exit(exc.exit_code)
            _error(exc.format_message() + " (see --help)", exc.exit_code)
        except UsageError as exc:
            _error(str(exc))
        except EnvironmentFailure as exc:  # the input was fine; the host or server failed under us
            _error(str(exc), EXIT_ENVIRONMENT)
        except OSError as exc:
            if exc.filename is None and exc.errno in STREAM_ERRNOS:  # the environment, not the input: exit 3
                sys.stdout = _ClosedStdout()  # nothing more goes to the broken stream
                _error(
                    f"cannot write to stdout: {exc.strerror or exc}; check where stdout goes (a full disk, a closed pipe)",
                    EXIT_ENVIRONMENT,
                )
            # a path the system refuses (name too long, permission, ...): the user's to fix
            where = f"{exc.filename}: " if exc.filename else ""
            _error(f"{where}{exc.strerror or exc}")
        for message in PENDING_WARNINGS if rv in (None, 0, 1) else ():  # it ran: its warnings, after its output
            click.echo(f"rocm-dspark: warning: {message}", err=True)
        PENDING_WARNINGS.clear()
        sys.exit(rv if isinstance(rv, int) else 0)

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        if name not in SHORT_LIVED and _gc_was_enabled:  # see main()
            gc.enable()
        module, attr = target.split(":")
        from rocm_dspark.cli.bounds import refuse_empty

        return refuse_empty(getattr(importlib.import_module(module), attr))


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
    "numpy": "planner",
    "matplotlib": "plot",
    "torch": "kernels",
    "triton": "kernels",
    "httpx": "validate",
    "prometheus_client": "validate",
}


# Commands that print and exit within milliseconds: they run without the cyclic garbage collector (main()).
SHORT_LIVED = frozenset({"recipe", "list"})
_gc_was_enabled = True


def main(argv=None):
    # Start-up allocates many objects and frees few (the catalog, the plan); a collector pass over them is pure
    # cost in a process that ends in milliseconds (about 2 ms of `recipe`, benchmarks/recipe_latency.py). Off
    # until the command is known; every command but SHORT_LIVED (up, validate, probe run long) turns it back on.
    global _gc_was_enabled
    _gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return cli.main(args=argv, prog_name="rocm-dspark", standalone_mode=True)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in EXTRAS:
            raise
        click.echo(
            f"rocm-dspark: error: this command needs {top}; install it with pip install 'rocm-dspark[{EXTRAS[top]}]'",
            err=True,
        )
        sys.exit(EXIT_ENVIRONMENT)  # the command is right; this install lacks a part (docs/cli.md)
    finally:
        if _gc_was_enabled:  # as it was (an in-process caller, a test runner)
            gc.enable()
