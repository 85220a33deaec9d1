"""`rocm-dspark canary`: one bounded re-scoring of the served tokens (the library: rocm_dspark.service.canary)."""

from __future__ import annotations

import json
import sys

import click

from rocm_dspark.cli import bounds
from rocm_dspark.launch.launch_facts import CANARY_TIMEOUT_S


@click.command(short_help="Re-score the service's tokens once; an adaptive service that fails switches to block.")
@click.option("--state-dir", default=None, help="The state directory `up` used (the record goes there).")
@click.option(
    "--timeout",
    type=bounds.SECONDS,
    default=float(CANARY_TIMEOUT_S),
    show_default=True,
    help="Seconds the whole check may take (every request's timeout is what is left).",
)
@click.option(
    "--endpoint",
    default=None,
    metavar="URL",
    help="Check this server instead of the one `up` runs (checked and recorded only, never restarted).",
)
@click.option(
    "--capture-size",
    type=bounds.SEQS,
    default=None,
    help="With --endpoint: the server's largest captured graph size (default: vLLM's ceiling, 1024).",
)
@click.option("--max-num-batched-tokens", type=bounds.TOKENS, default=None, help="With --endpoint: the server's.")
@click.option("--json", "as_json", is_flag=True, help="The run's record as JSON on stdout.")
def canary(state_dir, timeout, endpoint, capture_size, max_num_batched_tokens, as_json):
    """Send a fixed, small set of greedy requests and re-score every emitted token on the same server through the
    independent reference (each context padded past the capture size). Records the result in the state dir; the
    readiness server's /metrics reports it; a violation on an adaptive service restarts it with block verification.

    Exit status: 0 pass (or the service is stopped), 1 a violation or an error, 2 bad usage (or another canary or
    `up` holds the state dir's lock).

    \b
    Example:
      rocm-dspark canary
      rocm-dspark canary --endpoint http://my-service:8000 --capture-size 1024 --max-num-batched-tokens 8192
    """
    from rocm_dspark.errors import UsageError
    from rocm_dspark.probe.store import state_dir as resolve
    from rocm_dspark.runtime.progress import Display
    from rocm_dspark.service.canary import Served, run_canary

    served = None
    if endpoint:
        from rocm_dspark.validate.context import parse_endpoint

        sizes = {"capture_size": capture_size, "max_num_batched_tokens": max_num_batched_tokens}
        served = Served(*parse_endpoint(endpoint), "unknown", **sizes)
    elif capture_size or max_num_batched_tokens:
        raise UsageError(
            "--capture-size and --max-num-batched-tokens describe an --endpoint; `up`'s service records its own"
        )
    code, entry = run_canary(resolve(state_dir), Display(sys.stderr), timeout_s=timeout, endpoint=served)
    if as_json:
        click.echo(json.dumps(entry, indent=1))
    sys.exit(code)
