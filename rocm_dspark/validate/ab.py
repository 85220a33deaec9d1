"""`rocm-dspark validate --ab`: one workload at the target concurrency against two launches on this host,
block verification first, then adaptive verification; an A/B evidence record for the gate.

Each arm: start the server, a warm-up `vllm bench serve` run, the measured run between two /metrics reads, stop
(docs/validate.md, "The A/B through `vllm bench serve`"); a request that fails fails its arm. The record
(rocm_dspark.probe.ab_record) is fingerprinted like a probe record, written into `<state dir>/ab/` and copied
into the report directory. The arms are the plan's own two commands, or two server files (--server-json,
--ab-server-json) where the plan cannot run: such a record says so (`override`) and never counts for the gate.
"""

from __future__ import annotations

import json
import platform
import shlex
import socket
from pathlib import Path

from rocm_dspark import __version__
from rocm_dspark.atomic import write_atomic
from rocm_dspark.errors import UsageError
from rocm_dspark.probe import ab_record, fingerprint, store
from rocm_dspark.probe.ab_record import CLIENT
from rocm_dspark.runtime.metrics import spec_decode_counters
from rocm_dspark.runtime.process import VllmServer
from rocm_dspark.validate import bench
from rocm_dspark.validate.sweep import bench_level, bench_setup

AB_JSON = "ab.json"
AB_BENCH_DIR = "ab-bench"  # in the report: each arm's `vllm bench serve` JSON, as written, and its output


def _arm(source, argv, description: str) -> dict:
    """What run_arm starts: argv, with the env, address and served name of `source` (the plan or a server file)."""
    address = {"host": source.host, "port": source.port, "served_name": source.served_name}
    return {"argv": list(argv), "env": dict(source.env), **address, "description": description}


WARMUP_SEED = 1  # the warm-up's prompts are not the measured ones (no prefix-cache hits carried over)
# No ready-check request (the default, vllm/benchmarks/serve.py 1941 in 0.32.0, 1989 in 0.33.0; --num-warmups
# defaults to 0 too, 1733/1781): named so that the /metrics window holds the workload's requests and no other.
NO_READY_CHECK = ("--ready-check-timeout-sec", "0")


def measure(
    server,
    served_name: str,
    name: str,
    *,
    prefix: list[str],
    tokenizer: str,
    concurrency: int,
    requests: int,
    input_len: int,
    max_tokens: int,
    timeout_s: float,
    out_dir: Path,
    say,
) -> dict:
    """One arm's numbers on a server that is up (started here, or the service `up` runs): a warm-up run of
    `vllm bench serve` at the same concurrency, then the measured run between two /metrics reads. Both runs'
    --save-result JSON and output stay in out_dir (`<name>.json`, `<name>-warmup.json`). The server is
    neither started nor stopped."""
    common = {
        "base_url": server.base_url,
        "served_name": served_name,
        "tokenizer": tokenizer,
        "concurrency": concurrency,
        "input_len": input_len,
        "output_len": max_tokens,
        "out_dir": out_dir,
        "request_timeout_s": timeout_s,
    }
    warm_n = min(requests, max(concurrency, 2))
    warm = bench_level(prefix, n=warm_n, stem=f"{name}-warmup", seed=WARMUP_SEED, **common)
    if warm["failed"] or warm["rc"] != 0:  # said, not fatal: the measured run decides the arm
        why = warm["errors"][0] if warm["errors"] else f"bench exited {warm['rc']}"
        say(f"A/B {name}: warm-up: {warm['failed']} of {warm_n} requests failed ({why})")
    before = spec_decode_counters(server.client.metrics_text())
    row = bench_level(prefix, n=requests, stem=name, extra=NO_READY_CHECK, **common)
    after = spec_decode_counters(server.client.metrics_text())
    if row["rc"] != 0 and not row["failed"]:
        # bench failed after writing a result: nothing in it is trusted, every request counts as failed
        row = bench.row(
            None,
            concurrency,
            requests,
            shlex.split(row["bench_command"]),
            row["errors"][0] if row["errors"] else f"vllm bench serve exited {row['rc']}",
        )
    al = (after - before).mean_acceptance_length
    say(
        f"A/B {name}: {row['output_throughput_tok_s']} tok/s (vllm bench serve), acceptance length "
        f"{'n/a' if al is None else round(al, 3)} (/metrics), {row['failed']} of {requests} failed"
        + (f"; first error: {row['errors'][0]}" if row["errors"] else "")
    )
    say(f"A/B {name}: reproduce with: {row['bench_command']}")
    return {
        "client": CLIENT,
        "bench_command": row["bench_command"],
        "bench_result": row["bench_result"],
        "output_throughput_tok_s": row["output_throughput_tok_s"] or 0.0,
        "acceptance_length": None if al is None else round(al, 4),
        "ttft_ms": row["ttft_ms"],
        "tpot_ms": row["tpot_ms"],
        "itl_ms": row["itl_ms"],
        "requests": requests,
        "failed": row["failed"],
        "errors": row["errors"],
    }


def workload(*, requests: int, input_len: int, max_tokens: int) -> dict:
    """The record's workload: what both arms' bench commands carry (ab_record checks it on read)."""
    return {
        "client": CLIENT,
        "dataset": "random",
        "requests": requests,
        "input_len": input_len,
        "max_tokens": max_tokens,
        "seed": bench.SEED,
        "ignore_eos": True,
    }


def run_arm(
    arm: dict,
    name: str,
    *,
    ready_timeout_s: float,
    log_dir: Path,
    out_dir: Path,
    plan,
    python: str | None,
    say,
    **workload,
) -> dict:
    """Start the arm, measure it (workload: measure's concurrency, requests, lengths and timeout), stop it."""
    # Started here, on this host: bench is the vLLM beside the one that serves (validate/sweep.bench_setup)
    prefix, tokenizer = bench_setup(arm["argv"], plan, python=python, container=None, result_dir=out_dir)
    server = VllmServer(arm["argv"], arm["env"], host=arm["host"], port=arm["port"], log_path=log_dir / f"{name}.log")
    say(f"A/B {name}: starting {arm['description']}")
    server.start()
    try:
        ready = server.wait_ready(ready_timeout_s)
        if not ready.ready:
            raise UsageError(f"A/B {name} arm did not start: {ready.reason()} (log {server.log_path})")
        stats = measure(
            server, arm["served_name"], name, prefix=prefix, tokenizer=tokenizer, out_dir=out_dir, say=say, **workload
        )
    finally:
        server.stop()
    return {"argv": [str(a) for a in arm["argv"]], "description": arm["description"], **stats}


def default_requests(concurrency: int) -> int:
    return min(max(4 * concurrency, 8), 512)


def write_ab_record(
    *,
    catalog,
    selection,
    plan,
    concurrency: int,
    arms: dict,
    started,
    requests: int,
    input_len: int,
    max_tokens: int,
    override,
    state_dir,
    report_dir: Path | None = None,
    say=print,
) -> dict:
    """Build, sign and store the A/B record of two measured arms (and copy it into report_dir); returns it."""
    data = ab_record.build(
        record_id=store.new_record_id(started),
        created_at=store.iso(started),
        finished_at=store.iso(store.utc_now()),
        toolkit_version=__version__,
        host={"hostname": socket.gethostname(), "platform": platform.system()},
        selection={k: v for k, v in selection._asdict().items()},
        fingerprint=fingerprint.current_fingerprint(catalog, plan),
        concurrency=concurrency,
        workload=workload(requests=requests, input_len=input_len, max_tokens=max_tokens),
        arms=arms,
        override=override,
    )
    path = ab_record.write(state_dir, data)
    where = str(path)
    if report_dir is not None:
        write_atomic(Path(report_dir) / AB_JSON, json.dumps(data, indent=1) + "\n", mode=0o644)
        where += f" and {Path(report_dir) / AB_JSON}"
    say(f"A/B record {data['id']} written to {where}")
    return data


def run_ab(
    *,
    catalog,
    selection,
    concurrency: int,
    report_dir: Path,
    state_dir=None,
    requests: int | None = None,
    input_len: int = 1024,
    max_tokens: int = 256,
    request_timeout_s: float = 120.0,
    ready_timeout_s: float = 3600.0,
    block_spec=None,
    adaptive_spec=None,
    python: str | None = None,
    say=print,
) -> dict:
    """Run both arms, write the record; returns the record (a dict)."""
    if concurrency < 1:
        raise UsageError("--concurrency for --ab must be one positive integer, e.g. --concurrency 64")
    if (block_spec is None) != (adaptive_spec is None):
        raise UsageError(
            "--ab with server files needs both: --server-json (block arm) and --ab-server-json "
            "(adaptive arm); without either, the A/B runs the plan's own two commands"
        )
    requests = requests or default_requests(concurrency)
    plan = fingerprint.adaptive_plan(catalog, selection)
    if block_spec is None:
        arms_in = {
            "block": _arm(plan, plan.block_argv, f"the plan's block command ({plan.profile})"),
            "adaptive": _arm(plan, plan.adaptive_argv, f"the plan's adaptive command ({plan.profile})"),
        }
        override = None
    else:
        specs = {"block": (block_spec, "--server-json"), "adaptive": (adaptive_spec, "--ab-server-json")}
        arms_in = {}
        for which, (spec, flag) in specs.items():
            if spec.served_name is None:
                raise UsageError(f"{flag} {spec.path}: the A/B needs served_name (the name in /v1/models)")
            arms_in[which] = _arm(spec, spec.argv, spec.description or f"server from {spec.path}")
        override = {
            "kind": "server-json",
            "block": arms_in["block"]["description"],
            "adaptive": arms_in["adaptive"]["description"],
        }
    report_dir = Path(report_dir)
    if (report_dir / AB_JSON).exists():
        raise UsageError(f"--report {report_dir} already holds {AB_JSON}: choose another directory")
    log_dir = report_dir / "ab-logs"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --report {report_dir}: {exc.strerror}") from None
    fingerprint.current_fingerprint(catalog, plan)  # before the arms: a host it cannot fingerprint costs no load
    started, bench_dir = store.utc_now(), (report_dir / AB_BENCH_DIR).absolute()
    arms = {
        name: run_arm(
            arms_in[name],
            name,
            concurrency=concurrency,
            requests=requests,
            input_len=input_len,
            max_tokens=max_tokens,
            timeout_s=request_timeout_s,
            ready_timeout_s=ready_timeout_s,
            log_dir=log_dir,
            out_dir=bench_dir,
            plan=plan,
            python=python,
            say=say,
        )
        for name in ("block", "adaptive")
    }
    return write_ab_record(
        catalog=catalog,
        selection=selection,
        plan=plan,
        concurrency=concurrency,
        arms=arms,
        started=started,
        requests=requests,
        input_len=input_len,
        max_tokens=max_tokens,
        override=override,
        state_dir=state_dir,
        report_dir=report_dir,
        say=say,
    )
