"""`rocm-dspark validate`: smoke-validate a node (host, software, server, speculative decoding, load sweep)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click

from rocm_dspark.cli import bounds
from rocm_dspark.cli.options import check_model_path, concurrency_levels, pop_selection, selection_options
from rocm_dspark.errors import UsageError


def _ab(selection_opts: dict, kwargs: dict, as_json: bool):
    import json

    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.recipe.selection import build_selection
    from rocm_dspark.runtime.server_spec import load_server_spec
    from rocm_dspark.validate.ab import run_ab

    levels = concurrency_levels(kwargs["concurrency"])
    if not levels or len(levels) != 1:
        raise UsageError("--ab needs one --concurrency C (the workload's concurrent requests), e.g. --concurrency 64")
    if kwargs["endpoint"]:
        raise UsageError("--ab starts both servers itself (the same host, one after the other): drop --endpoint")
    block = load_server_spec(kwargs["server_json"], flag="--server-json") if kwargs["server_json"] else None
    adaptive = load_server_spec(kwargs["ab_server_json"], flag="--ab-server-json") if kwargs["ab_server_json"] else None
    catalog = load_catalog()
    # The plan for the declared workload (concurrency drives workload rules): what `recipe --concurrency C` resolves.
    selection = build_selection({**selection_opts, "concurrency": levels[0]}, catalog)
    from rocm_dspark.validate.sweep import input_len

    record = run_ab(
        catalog=catalog,
        selection=selection,
        concurrency=levels[0],
        report_dir=kwargs["report_dir"],
        state_dir=selection_opts.get("state_dir"),
        requests=kwargs["requests_per_level"],
        input_len=input_len(kwargs["quick"]),
        max_tokens=kwargs["max_tokens"] or (32 if kwargs["quick"] else 256),
        request_timeout_s=kwargs["request_timeout_s"],
        ready_timeout_s=kwargs["ready_timeout_s"],
        block_spec=block,
        adaptive_spec=adaptive,
        python=kwargs["python"],
        say=lambda line: click.echo(line, err=True),
    )
    if as_json:
        click.echo(json.dumps(record, indent=2))
    else:
        click.echo(record["verdict"]["text"])
        if record["override"]:
            click.echo("the arms ran server files, not the plan's commands: this record does not count for the gate")
    # an arm with a failed request has no verdict: a failure, though its record is kept to be read
    sys.exit(0 if record["verdict"]["gain_pct"] is not None else 1)


@click.command("validate", short_help="Check a node up to the first blocking failure; report.")
@selection_options
@click.option(
    "--report",
    "report_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Directory for report.json, report.md and the PNG plots.",
)
@click.option("--force", is_flag=True, help="Overwrite report files already in --report.")
@click.option("--endpoint", metavar="URL", help="Check a running server, e.g. http://127.0.0.1:8000.")
@click.option("--launch", is_flag=True, help="Start the server from the generated launcher, check it, stop it.")
@click.option(
    "--server-json",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help="JSON file describing the server actually run when it is not the recipe's plan (argv, port, "
    "served_name, recipe_model, ...; same format as probe --server-json).",
)
@click.option(
    "--quick", is_flag=True, help="Small workload (concurrency 1,4; 32 tokens): for CPU hosts and smoke runs."
)
@click.option("--concurrency", "concurrency", metavar="N,N,...", help="Sweep levels (default 1,16,64,128).")
@click.option(
    "--requests-per-level",
    type=bounds.COUNT,
    help="Requests per level (default 4 x concurrency, at most 512).",
)
@click.option("--max-tokens", type=bounds.TOKENS, help="Output tokens per request (default 256; 32 with --quick).")
@click.option(
    "--request-timeout",
    "request_timeout_s",
    type=bounds.SECONDS,
    default=120.0,
    show_default=True,
    help="Seconds each request may take.",
)
@click.option(
    "--ready-timeout",
    "ready_timeout_s",
    type=bounds.SECONDS,
    default=3600.0,
    show_default=True,
    help="Seconds --launch waits for readiness.",
)
@click.option("--gsm8k", is_flag=True, help="Also run GSM8K through lm-eval (must be installed).")
@click.option("--gsm8k-limit", type=bounds.COUNT, help="Only the first N GSM8K questions.")
@click.option("--acceptance-min", type=bounds.ACCEPTANCE, help="Acceptance-length floor instead of the recipe's.")
@click.option("--service-user", help="User vLLM runs as, for the /dev/kfd access check (default: you).")
@click.option("--require-gpu", is_flag=True, help="Fail (not n/a) when no AMD GPU is found.")
@click.option(
    "--server-log",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    metavar="FILE",
    help="The running server's log (with --endpoint): read for capture truncation and JIT compiles.",
)
@click.option(
    "--python",
    type=click.Path(exists=True, dir_okay=False),
    help="The Python environment vLLM runs in (for software checks).",
)
@click.option(
    "--ab",
    is_flag=True,
    help="A/B instead of the checks: one workload at --concurrency C against block verification, then "
    "adaptive, each started here; writes an evidence record the gate reads (recipe --concurrency C).",
)
@click.option(
    "--ab-server-json",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help="--ab where the plan cannot run: the adaptive arm's server file (--server-json is the block "
    "arm's). Such a record is kept but never counts for the gate.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report JSON on stdout instead of the summary.")
def validate(**kwargs):
    """Check a node in order, stop at the first blocking failure, and write a report.

    Exit status: 0 every blocking check passed, 1 a blocking check failed or was skipped (the report says
    INCOMPLETE), 2 bad usage (neither --endpoint nor --launch included), 3 the environment failed under it.

    \b
    Example:
      rocm-dspark validate --model V4.1-Flash --endpoint http://127.0.0.1:8000 --report ./report
      rocm-dspark validate --model V4.1-Flash --launch --quick --report ./report
    """
    import json

    from rocm_dspark.recipe.secret_env import redact_argv
    from rocm_dspark.validate import ValidateOptions, run_validation

    selection = pop_selection(kwargs, keep=("concurrency",))
    check_model_path(selection, runs_here=kwargs["launch"] or kwargs["ab"])
    if kwargs["endpoint"]:  # usage, refused before any check runs
        from rocm_dspark.validate.context import parse_endpoint

        parse_endpoint(kwargs["endpoint"])
    as_json = kwargs.pop("as_json")
    if kwargs.pop("ab"):
        return _ab(selection, kwargs, as_json)
    if kwargs.pop("ab_server_json"):
        raise UsageError("--ab-server-json is only for --ab")
    levels = concurrency_levels(kwargs.pop("concurrency"))
    opts = ValidateOptions(**kwargs, concurrencies=levels)  # the rest of the options by their names
    from rocm_dspark.runtime.progress import Display

    display = Display(sys.stderr)  # rich on a terminal, plain lines in a pipe or under journald
    existed = Path(opts.report_dir).exists()
    try:
        rep = run_validation(
            opts, selection, command=["rocm-dspark", *redact_argv(sys.argv[1:])], say=display.say, display=display
        )
    except KeyboardInterrupt:  # Ctrl-C: the CLI exits 130; a report directory this run made and left empty goes
        if not existed:
            _remove_if_empty(Path(opts.report_dir))
        raise
    s = rep["summary"]
    if as_json:
        click.echo(json.dumps(rep, indent=2, default=str))
    else:
        counts = ", ".join(f"{n} {st}" for st, n in s["counts"].items() if n)
        click.echo(f"validation {s['result'].upper()} ({counts}); report in {opts.report_dir}/report.md")
        if s["stopped_at"]:
            click.echo(f"stopped at {s['stopped_at']}: {s['reason']}")
        elif s["reason"]:
            click.echo(f"not a PASS: {s['reason']}")
        if not s["hardware_checked"]:
            click.echo("no AMD GPU was checked: this run does not validate an MI300-class node")
    sys.exit(s["exit_status"])


def _remove_if_empty(directory: Path) -> None:
    """Remove `directory` when it holds only (empty) directories: nothing a user could want was written."""
    import shutil

    with contextlib.suppress(OSError):
        if (
            directory.is_dir()
            and not directory.is_symlink()
            and all(p.is_dir() and not p.is_symlink() for p in directory.rglob("*"))
        ):
            shutil.rmtree(directory)
