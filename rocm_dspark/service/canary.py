"""`rocm-dspark canary` (docs/operations.md, "The canary"): a bounded check that the service still emits the tokens
its own model gives, each re-scored on the same server through the reference the gate trusts
(rocm_dspark.probe.rescore: out of the drafter's reach, vllm#53488); its record, <state>/up/canary.json
(docs/trust.md); the switch of an adaptive service to block on a violation (one load through
rocm_dspark.service.start); its lines in `status`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import NamedTuple

from rocm_dspark.atomic import write_atomic
from rocm_dspark.errors import UsageError
from rocm_dspark.launch.launch_facts import CANARY_TIMEOUT_S
from rocm_dspark.probe import rescore
from rocm_dspark.runtime.client import ServerError, VllmClient, base_url
from rocm_dspark.service import control
from rocm_dspark.service.state import UpState, digest, up_dir, utc_now
from rocm_dspark.service.trust import int_in, load_state, prepare, up_lock

FILE = "canary.json"
SCHEMA = 1
RESULTS = ("pass", "violation", "error")
PROMPTS = rescore.RESCORE_PROMPTS[: rescore.MIN_PROMPTS]  # 4 x GEN_TOKENS 64 = rescore.MIN_TOKENS: the smallest proof
TIMEOUT_S = float(CANARY_TIMEOUT_S)
RUNS_KEPT = 20
# local-cpu only (the test's plant): the canary's generation samples at this temperature, so the reference rejects
# its tokens (rescore's negative control), as it would a service that emits wrong ones.
PLANT_ENV = "ROCM_DSPARK_CANARY_LOCAL_TEMPERATURE"


class _DeadlineClient(VllmClient):
    """Every request's timeout is what is left of one deadline; none starts after it."""

    def __init__(self, host: str, port: int, deadline: float):
        super().__init__(host, port)
        self.deadline = deadline

    def request(self, method, path, body=None, timeout_s=60.0):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ServerError(f"{method} {path}: the canary's time is up")
        return super().request(method, path, body, timeout_s=min(timeout_s, left))


# -- the record ------------------------------------------------------------------------------------------


def _shape(data, _dir, schema) -> str | None:
    if not isinstance(data, dict) or data.get("schema") != schema:
        return f"not an object of schema {schema}"
    counts = data.get("counts")
    if not isinstance(counts, dict) or not all(int_in(counts.get(r, 0), 0) for r in RESULTS):
        return "counts is not a count per result"
    runs = data.get("runs")
    if not isinstance(runs, list) or any(not isinstance(r, dict) or r.get("result") not in RESULTS for r in runs):
        return "runs is not a list of runs"
    return None


def load_record(state_dir) -> dict:
    """The canary record (empty when there is none yet); one UsageError line when it may not be believed."""
    data = load_state(up_dir(Path(state_dir)), FILE, SCHEMA, shape=_shape)
    return data or {"schema": SCHEMA, "counts": dict.fromkeys(RESULTS, 0), "runs": []}


def save(state_dir, entry: dict) -> dict:
    rec = load_record(state_dir)
    rec["counts"] = {r: int(rec["counts"].get(r, 0)) + (r == entry["result"]) for r in RESULTS}
    rec["runs"] = (rec["runs"] + [entry])[-RUNS_KEPT:]
    write_atomic(up_dir(Path(state_dir)) / FILE, json.dumps(rec, indent=1) + "\n", mode=0o600)
    return rec


# -- one check ---------------------------------------------------------------------------------------------


class Served(NamedTuple):
    host: str
    port: int
    command: str  # adaptive | block | unknown (--endpoint)
    served_name: str | None = None
    k: int | None = None
    capture_size: int | None = None
    max_num_batched_tokens: int | None = None


def check(served: Served, deadline: float, temperature: float = 0.0) -> dict:
    """One bounded re-scoring of the served endpoint: {"result", "why", "tokens", "violations", ...}."""
    client = _DeadlineClient(served.host, served.port, deadline)
    out: dict = {"endpoint": base_url(served.host, served.port), "command": served.command}
    try:
        model = served.served_name or client.models()[0]
        start = client.metrics_text()

        def counted():
            from rocm_dspark.probe.live import counters_evidence

            d = counters_evidence(start, client.metrics_text(), model)["delta"]
            return {key: d[key] for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}

        rs = rescore.rescore(
            client,
            model,
            prompts=PROMPTS,
            k=served.k,
            temperature=temperature,
            counters_delta=counted,
            capture_size=served.capture_size,
            max_num_batched_tokens=served.max_num_batched_tokens,
        )
    except (ServerError, ValueError, KeyError, IndexError, TypeError) as exc:
        why = str(exc) if isinstance(exc, ServerError) else f"{type(exc).__name__}: {exc}"
        return {**out, "result": "error", "why": why}
    result = {"proven": "pass", "violations": "violation"}.get(rs["status"], "error")
    drafts = rs.get("drafts_from_counters") or {}
    al = round(1 + drafts["num_accepted_tokens"] / drafts["num_drafts"], 4) if drafts.get("num_drafts") else None
    first: list = next((r["first_violations"][:2] for r in rs["requests"] if r["violations"]), [])
    return {
        **out,
        "result": result,
        "why": rs["why"],
        "tokens": rs["tokens_checked"],
        "violations": rs["violations"],
        "near_ties": rs["near_ties"],
        "prompts": rs["prompts"],
        "reference": rs["reference"].get("route"),
        "acceptance_length": al,
        "first_violations": first,
    }


def _planted(state: UpState) -> float:
    raw = os.environ.get(PLANT_ENV)
    if not raw or ((state.output("detect") or {}).get("target")) != "local-cpu":
        return 0.0
    try:
        return float(raw)
    except ValueError:
        raise UsageError(f"{PLANT_ENV}={raw!r} is not a number: unset it") from None


def check_service(state: UpState, deadline: float, temperature: float | None = None) -> dict | None:
    svc = state.service
    if not svc:
        raise UsageError(
            f"no service recorded in {state.path}: run `rocm-dspark up` first, or check an endpoint with --endpoint URL"
        )
    if svc.get("stopped_at"):
        return None
    # the sizes are recorded under Served's own field names (up/serve.served_facts)
    served = Served(svc["host"], int(svc["port"]), svc.get("command") or "unknown", *map(svc.get, Served._fields[3:]))
    if not control.alive(svc):
        return {
            "endpoint": base_url(served.host, served.port),
            "command": served.command,
            "result": "error",
            "why": "the recorded service is not running (it stopped without `down`): see its log",
        }
    return check(served, deadline, _planted(state) if temperature is None else temperature)


def hold(state: UpState, probe_hash: str | None) -> str | None:
    """Why `up` keeps block after the canary's switch (None: no hold): until its probe step has new evidence."""
    held = state.data.get("canary_hold")
    if not isinstance(held, dict) or held.get("probe") != probe_hash:
        return None
    return (
        f"the canary switched adaptive verification off ({held.get('why')}); block serves until the probe step "
        "runs on new evidence (a new build or `--probe-levels`)"
    )


# -- the run ----------------------------------------------------------------------------------------------


def run_canary(state_dir, display, *, timeout_s: float = TIMEOUT_S, endpoint: Served | None = None) -> tuple[int, dict]:
    """Check the service `up` runs (or `endpoint`, checked only) and record it; returns (exit status, the run):
    0 pass, 1 violation or error. `display` says the lines and shows the switch's start."""
    d = up_dir(Path(state_dir))
    prepare(d)
    with up_lock(d, "rocm-dspark canary"):
        t0, at = time.monotonic(), utc_now()
        state: UpState | None = None
        found: dict | None
        if endpoint is not None:
            found = check(endpoint, t0 + timeout_s)
        else:
            state = UpState.load(d)
            if (found := check_service(state, t0 + timeout_s)) is None:
                display.say("canary: skipped: the service is stopped (`rocm-dspark down`); `up` starts it again")
                return 0, {}
        entry = {"at": at, "seconds": round(time.monotonic() - t0, 1), **found}
        display.say(
            f"canary: {entry['result'].upper()} ({entry['command']} verification at {entry['endpoint']}, "
            f"{entry['seconds']:g} s): {entry['why']}"
        )
        if state is not None and entry["result"] == "violation" and entry["command"] == "adaptive":
            entry["switch"] = _switch(state, entry, timeout_s, display)
        save(state_dir, entry)
    return (0 if entry["result"] == "pass" else 1), entry


def _switch(state: UpState, entry: dict, timeout_s: float, display) -> dict:
    """Adaptive emitted tokens the reference rejects: serve block (one restart, one model load, the mode change
    recorded), then check block the same way; ready only if it passes."""
    from rocm_dspark.runtime.actions import Failed
    from rocm_dspark.service import start

    why = f"canary violation at {entry['at']}: {entry['why']}"
    display.say("canary: switching the service to block verification (one restart)")
    state.note_run({"at": utc_now(), "argv": ["canary"], "target": "canary"})  # its load is its own run's
    probe, files = state.output("probe"), (state.output("launchers") or {}).get("files")
    state.data["canary_hold"] = {"at": entry["at"], "why": why, "probe": digest(probe) if probe is not None else None}
    facts = (state.service or {}).get("facts") or {}
    try:  # the block start `up` recorded, from the launchers as last written
        block = start.recorded((facts.get("block") or {}).get("start"), state.path.parent)
        start.load(state, display, block, why, facts=facts, launchers=digest(files) if files else None, loads=[])
    except Failed as exc:
        state.set_readiness(False, "failed", f"the canary's switch to block failed: {exc.message}")
        return {"to": "block", "started": False, "why": exc.message, "fix": exc.fix}
    again = check_service(state, time.monotonic() + timeout_s, temperature=0.0) or {"result": "error", "why": "stopped"}
    if again["result"] == "pass":
        switched = f"the canary switched from adaptive ({why}); block re-checked: {again['why']}"
        state.set_readiness(True, "serving", f"block verification serves: {switched}")
    else:
        state.set_readiness(False, "failed", f"block verification after the canary's switch: {again['why']}")
    display.say(f"canary: block verification serves; its check: {again['result'].upper()}: {again['why']}")
    return {"to": "block", "started": True, "loads": 1, "check": {k: again.get(k) for k in ("result", "why", "tokens")}}


# -- status --------------------------------------------------------------------------------------------------


def status_lines(state_dir, state_data: dict, bands: dict | None) -> list[str]:
    """`status`'s watch: the last canary and its result, acceptance against the A/B's band, the last mode change."""
    try:
        rec = load_record(state_dir)
    except UsageError as exc:
        return [f"canary: {exc}"]
    lines = []
    if last := (rec["runs"] or [None])[-1]:
        c = rec["counts"]
        lines.append(
            f"canary: last {last['at']}: {last['result'].upper()} ({last['command']}, {last.get('tokens', 0)} "
            f"tokens re-scored): {last['why']} [runs: {c['pass']} pass, {c['violation']} violation, "
            f"{c['error']} error]"
        )
        al = last.get("acceptance_length")
        band = (bands or {}).get(last["command"])
        if al is not None:
            where = " (no A/B band for this plan)"
            if band:
                inside = "inside" if band["low"] <= al <= band["high"] else "OUTSIDE"
                where = f", {inside} the A/B's band [{band['low']:g}, {band['high']:g}] ({band['record_id']})"
            lines.append(f"acceptance during the last canary: mean accepted length {al:g}{where}")
        if last.get("switch"):
            lines.append(f"canary switch: {last['switch']}")
    if change := (state_data.get("mode_changes") or [None])[-1]:
        lines.append(f"mode last changed {change['at']}: {change['from']} -> {change['to']} ({change['why']})")
    return lines
