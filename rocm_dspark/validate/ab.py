"""`rocm-dspark validate --ab`: one workload at the target concurrency against two launches on this host,
block verification first, then adaptive verification; an A/B evidence record for the gate.

Each arm: start the server, wait until ready, warm up (graphs, caches) with a short run at the same
concurrency, then read /metrics, stream `requests` completions (the sweep's workload, ignore_eos, fixed
output length) at `concurrency` in flight, read /metrics again, stop the server. The two arms share the
host, workload, prompts and concurrency; only the launch differs. The record (rocm_dspark.probe.ab_record)
carries tokens/s, acceptance length (from the /metrics deltas), TTFT/TPOT/ITL percentiles and the verdict
("adaptive pays at c=C: +x%"). It is fingerprinted like a probe record (this host, the adaptive plan),
written atomically with a content digest into `<state dir>/ab/`, and copied into the report directory.

The arms are the plan's own two commands (block_argv and the adaptive argv), or two server-description
files (--server-json for the block arm, --ab-server-json for the adaptive one) where the plan cannot run:
such a record says so (`override`) and never counts for the gate.
"""

from __future__ import annotations

import asyncio
import json
import platform
import socket
from pathlib import Path

from rocm_dspark.errors import UsageError

AB_JSON = "ab.json"


def _arm_from_plan(plan, which: str) -> dict:
    argv = list(plan.adaptive_argv if which == "adaptive" else plan.block_argv)
    return {"argv": argv, "env": dict(plan.env), "host": plan.host, "port": plan.port,
            "served_name": plan.served_name, "description": f"the plan's {which} command ({plan.profile})"}


def _arm_from_spec(spec, flag: str) -> dict:
    if spec.served_name is None:
        raise UsageError(f"{flag} {spec.path}: the A/B needs served_name (the name in /v1/models)")
    return {"argv": list(spec.argv), "env": dict(spec.env), "host": spec.host, "port": spec.port,
            "served_name": spec.served_name, "description": spec.description or f"server from {spec.path}"}


def measure(server, served_name: str, name: str, *, concurrency: int, requests: int, max_tokens: int,
            timeout_s: float, say) -> dict:
    """One arm's numbers on a server that is up (started here, or the service `up` runs): warm up, then the
    workload between two /metrics reads. The server is neither started nor stopped."""
    from rocm_dspark.runtime.metrics import spec_decode_counters
    from rocm_dspark.validate.sweep import run_level, summarise

    warm = min(requests, max(concurrency, 2))
    asyncio.run(run_level(server.base_url, served_name, concurrency, warm, max_tokens, timeout_s))
    before = spec_decode_counters(server.client.metrics_text())
    records, wall = asyncio.run(run_level(server.base_url, served_name, concurrency, requests, max_tokens, timeout_s))
    after = spec_decode_counters(server.client.metrics_text())
    stats = summarise(records, wall, concurrency)
    al = (after - before).mean_acceptance_length
    say(f"A/B {name}: {stats['output_throughput_tok_s']} tok/s, acceptance length "
        f"{'n/a' if al is None else round(al, 3)}, {stats['failed']} failed")
    return {"output_throughput_tok_s": stats["output_throughput_tok_s"] or 0.0,
            "acceptance_length": None if al is None else round(al, 4),
            "ttft_ms": stats["ttft_ms"], "tpot_ms": stats["tpot_ms"], "itl_ms": stats["itl_ms"],
            "requests": stats["requests"], "failed": stats["failed"]}


def run_arm(arm: dict, name: str, *, concurrency: int, requests: int, max_tokens: int, timeout_s: float,
            ready_timeout_s: float, log_dir: Path, say) -> dict:
    from rocm_dspark.runtime.process import VllmServer

    server = VllmServer(arm["argv"], arm["env"], host=arm["host"], port=arm["port"], log_path=log_dir / f"{name}.log")
    say(f"A/B {name}: starting {arm['description']}")
    server.start()
    try:
        ready = server.wait_ready(ready_timeout_s)
        if not ready.ready:
            raise UsageError(f"A/B {name} arm did not start: {ready.reason()} (log {server.log_path})")
        stats = measure(server, arm["served_name"], name, concurrency=concurrency, requests=requests,
                        max_tokens=max_tokens, timeout_s=timeout_s, say=say)
    finally:
        server.stop()
    return {"argv": [str(a) for a in arm["argv"]], "description": arm["description"], **stats}


def default_requests(concurrency: int) -> int:
    return min(max(4 * concurrency, 8), 512)


def write_ab_record(*, catalog, selection, plan, concurrency: int, arms: dict, started, requests: int,
                    max_tokens: int, override, state_dir, report_dir: Path | None = None, say=print) -> dict:
    """Build, sign and store the A/B record of two measured arms (and copy it into report_dir); returns it."""
    from rocm_dspark import __version__
    from rocm_dspark.probe import ab_record, fingerprint, store

    data = ab_record.build(
        record_id=store.new_record_id(started), created_at=store.iso(started), finished_at=store.iso(store.utc_now()),
        toolkit_version=__version__, host={"hostname": socket.gethostname(), "platform": platform.system()},
        selection={k: v for k, v in selection._asdict().items()},
        fingerprint=fingerprint.current_fingerprint(catalog, plan), concurrency=concurrency,
        workload={"requests": requests, "max_tokens": max_tokens,
                  "prompts": "rocm_dspark.validate.spec_checks.WORKLOAD, ignore_eos, temperature 0"},
        arms=arms, override=override)
    path = ab_record.write(state_dir, data)
    where = str(path)
    if report_dir is not None:
        from rocm_dspark.atomic import write_atomic

        write_atomic(Path(report_dir) / AB_JSON, json.dumps(data, indent=1) + "\n", mode=0o644)
        where += f" and {Path(report_dir) / AB_JSON}"
    say(f"A/B record {data['id']} written to {where}")
    return data


def run_ab(*, catalog, selection, concurrency: int, report_dir: Path, state_dir=None, requests: int | None = None,
           max_tokens: int = 256, request_timeout_s: float = 120.0, ready_timeout_s: float = 3600.0,
           block_spec=None, adaptive_spec=None, say=print) -> dict:
    """Run both arms, write the record; returns the record (a dict)."""
    from rocm_dspark.probe import fingerprint, store

    if concurrency < 1:
        raise UsageError("--concurrency for --ab must be one positive integer, e.g. --concurrency 64")
    if (block_spec is None) != (adaptive_spec is None):
        raise UsageError("--ab with server files needs both: --server-json (block arm) and --ab-server-json "
                         "(adaptive arm); without either, the A/B runs the plan's own two commands")
    requests = requests or default_requests(concurrency)
    plan = fingerprint.adaptive_plan(catalog, selection)
    if block_spec is None:
        arms_in = {"block": _arm_from_plan(plan, "block"), "adaptive": _arm_from_plan(plan, "adaptive")}
        override = None
    else:
        arms_in = {"block": _arm_from_spec(block_spec, "--server-json"),
                   "adaptive": _arm_from_spec(adaptive_spec, "--ab-server-json")}
        override = {"kind": "server-json", "block": arms_in["block"]["description"],
                    "adaptive": arms_in["adaptive"]["description"]}
    report_dir = Path(report_dir)
    target = report_dir / AB_JSON
    if target.exists():
        raise UsageError(f"--report {report_dir} already holds {AB_JSON}: choose another directory")
    log_dir = report_dir / "ab-logs"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --report {report_dir}: {exc.strerror}") from None
    fingerprint.current_fingerprint(catalog, plan)   # before the arms: a host it cannot fingerprint costs no load
    started = store.utc_now()
    arms = {name: run_arm(arms_in[name], name, concurrency=concurrency, requests=requests, max_tokens=max_tokens,
                          timeout_s=request_timeout_s, ready_timeout_s=ready_timeout_s, log_dir=log_dir, say=say)
            for name in ("block", "adaptive")}
    return write_ab_record(catalog=catalog, selection=selection, plan=plan, concurrency=concurrency, arms=arms,
                           started=started, requests=requests, max_tokens=max_tokens, override=override,
                           state_dir=state_dir, report_dir=report_dir, say=say)
