"""`rocm-dspark canary`: a bounded check, every few minutes, that the service still emits the tokens its own model
gives, and the readiness server's /metrics that report it.

One run sends PROMPTS (fixed, greedy, all at once) to the served endpoint and re-scores every emitted token on the
same server through the reference the gate trusts: the independent route of rocm_dspark.probe.rescore (each
context padded past the largest capture size, so its prefill runs without graphs and never reads the drafter's
buffers, vllm#53488; with rescore's self-check). Results: pass (zero violations), violation (an emitted token the
reference rejects), error (nothing judged: no answer in time, a reference that is not independent, the service
down). Bounded: a fixed request count, every request's timeout clamped to what is left of --timeout, and the `up`
lock (up/trust.py) held for the run, so a second canary (or an `up`) refuses at once.

A violation on an adaptive service switches it to block verification: one restart through up/serve.load (counted
as a model load; the mode change recorded), then the same check on block decides whether it is ready. Records:
<state>/up/canary.json (counts and the last RUNS_KEPT runs; docs/trust.md's rules) and up-state.json's loads and
mode changes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import NamedTuple

from rocm_dspark.errors import UsageError
from rocm_dspark.launch.launch_facts import CANARY_EVERY_MIN, CANARY_TIMEOUT_S
from rocm_dspark.probe import rescore
from rocm_dspark.runtime.client import ServerError, VllmClient, base_url
from rocm_dspark.up.state import UpState, up_dir, utc_now

FILE = "canary.json"
SCHEMA = 1
RESULTS = ("pass", "violation", "error")
PROMPTS = rescore.RESCORE_PROMPTS[:rescore.MIN_PROMPTS]  # 4 x GEN_TOKENS 64 = rescore.MIN_TOKENS: the smallest proof
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
    if not isinstance(counts, dict) or any(not isinstance(counts.get(r, 0), int) or isinstance(counts.get(r, 0), bool)
                                           or counts.get(r, 0) < 0 for r in RESULTS):
        return "counts is not a count per result"
    runs = data.get("runs")
    if not isinstance(runs, list) or any(not isinstance(r, dict) or r.get("result") not in RESULTS for r in runs):
        return "runs is not a list of runs"
    return None


def load_record(state_dir) -> dict:
    """The canary record (empty when there is none yet); one UsageError line when it may not be believed."""
    from rocm_dspark.up.trust import load_state

    data = load_state(up_dir(Path(state_dir)), FILE, SCHEMA, shape=_shape)
    return data or {"schema": SCHEMA, "counts": dict.fromkeys(RESULTS, 0), "runs": []}


def _save(state_dir, entry: dict) -> dict:
    from rocm_dspark.atomic import write_atomic

    rec = load_record(state_dir)
    rec["counts"] = {r: int(rec["counts"].get(r, 0)) + (r == entry["result"]) for r in RESULTS}
    rec["runs"] = (rec["runs"] + [entry])[-RUNS_KEPT:]
    write_atomic(up_dir(Path(state_dir)) / FILE, json.dumps(rec, indent=1) + "\n", mode=0o600)
    return rec


# -- one check ---------------------------------------------------------------------------------------------


class Served(NamedTuple):
    host: str
    port: int
    command: str          # adaptive | block | unknown (--endpoint)
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

        rs = rescore.rescore(client, model, prompts=PROMPTS, k=served.k, temperature=temperature,
                             counters_delta=counted, capture_size=served.capture_size,
                             max_num_batched_tokens=served.max_num_batched_tokens)
    except (ServerError, ValueError, KeyError, IndexError, TypeError) as exc:
        return {**out, "result": "error", "why": f"{type(exc).__name__}: {exc}" if not isinstance(exc, ServerError)
                else str(exc)}
    result = {"proven": "pass", "violations": "violation"}.get(rs["status"], "error")
    drafts = rs.get("drafts_from_counters") or {}
    al = round(1 + drafts["num_accepted_tokens"] / drafts["num_drafts"], 4) if drafts.get("num_drafts") else None
    first: list = next((r["first_violations"][:2] for r in rs["requests"] if r["violations"]), [])
    return {**out, "result": result, "why": rs["why"], "tokens": rs["tokens_checked"], "violations": rs["violations"],
            "near_ties": rs["near_ties"], "prompts": rs["prompts"], "reference": rs["reference"].get("route"),
            "acceptance_length": al, "first_violations": first}


def _planted(state: UpState) -> float:
    raw = os.environ.get(PLANT_ENV)
    if not raw or ((state.output("detect") or {}).get("target")) != "local-cpu":
        return 0.0
    try:
        return float(raw)
    except ValueError:
        raise UsageError(f"{PLANT_ENV}={raw!r} is not a number: unset it") from None


def run_canary(state_dir, *, timeout_s: float = TIMEOUT_S, endpoint: tuple[str, int] | None = None,
               sizes: dict | None = None, say=print, display=None) -> tuple[int, dict]:
    """Check the service `up` runs (or `endpoint`, checked only) and record it; returns (exit status, the run):
    0 pass, 1 violation or error."""
    from rocm_dspark.up.trust import prepare, up_lock

    d = up_dir(Path(state_dir))
    prepare(d)
    with up_lock(d, "rocm-dspark canary"):
        t0, at = time.monotonic(), utc_now()
        state: UpState | None = None
        found: dict | None
        if endpoint is not None:
            found = check(Served(*endpoint, "unknown", **(sizes or {})), t0 + timeout_s)
        else:
            state = UpState.load(d)
            found = _check_service(state, t0 + timeout_s)
            if found is None:
                say("canary: skipped: the service is stopped (`rocm-dspark down`); `up` starts it again")
                return 0, {}
        entry = {"at": at, "seconds": round(time.monotonic() - t0, 1), **found}
        say(f"canary: {entry['result'].upper()} ({entry['command']} verification at {entry['endpoint']}, "
            f"{entry['seconds']:g} s): {entry['why']}")
        if state is not None and entry["result"] == "violation" and entry["command"] == "adaptive":
            entry["switch"] = _switch(state, entry, timeout_s, say, display)
        _save(state_dir, entry)
    return (0 if entry["result"] == "pass" else 1), entry


def served_of(svc: dict) -> Served:
    return Served(svc["host"], int(svc["port"]), svc.get("command") or "unknown", svc.get("served_name"), svc.get("k"),
                  svc.get("capture_size"), svc.get("max_num_batched_tokens"))


def _check_service(state: UpState, deadline: float, temperature: float | None = None) -> dict | None:
    from rocm_dspark.up import service

    svc = state.service
    if not svc:
        raise UsageError(f"no service recorded in {state.path}: run `rocm-dspark up` first, or check an endpoint "
                         "with --endpoint URL")
    if svc.get("stopped_at"):
        return None
    served = served_of(svc)
    if not service.alive(svc):
        return {"endpoint": base_url(served.host, served.port), "command": served.command, "result": "error",
                "why": "the recorded service is not running (it stopped without `down`): see its log"}
    return check(served, deadline, _planted(state) if temperature is None else temperature)


def _switch(state: UpState, entry: dict, timeout_s: float, say, display) -> dict:
    """Adaptive emitted tokens the reference rejects: serve block (one restart, one model load, the mode change
    recorded), then check block the same way; ready only if it passes."""
    from rocm_dspark.runtime.progress import Display
    from rocm_dspark.up import serve
    from rocm_dspark.up.state import digest
    from rocm_dspark.up.steps_common import StepFailed

    why = f"canary violation at {entry['at']}: {entry['why']}"
    say("canary: switching the service to block verification (one restart)")
    run = _Restart(state, display or Display.plain(say))
    state.note_run({"at": utc_now(), "argv": ["canary"], "target": "canary"})  # its load is its own run's
    probe = state.output("probe")
    state.data["canary_hold"] = {"at": entry["at"], "why": why, "probe": digest(probe) if probe is not None else None}
    try:
        serve.load(run, "block", why)
    except StepFailed as exc:
        state.set_readiness(False, "failed", f"the canary's switch to block failed: {exc.message}")
        return {"to": "block", "started": False, "why": exc.message, "fix": exc.fix}
    again = _check_service(state, time.monotonic() + timeout_s, temperature=0.0) or {"result": "error",
                                                                                   "why": "stopped"}
    if again["result"] == "pass":
        state.set_readiness(True, "serving", f"block verification serves: the canary switched from adaptive ({why}); "
                            f"block re-checked: {again['why']}")
    else:
        state.set_readiness(False, "failed", f"block verification after the canary's switch: {again['why']}")
    say(f"canary: block verification serves; its check: {again['result'].upper()}: {again['why']}")
    return {"to": "block", "started": True, "loads": 1, "check": {k: again.get(k) for k in ("result", "why", "tokens")}}


def hold(state: UpState, probe_hash: str | None) -> str | None:
    """Why `up` keeps block after the canary's switch (None: no hold): until its probe step has new evidence."""
    held = state.data.get("canary_hold")
    if not isinstance(held, dict) or held.get("probe") != probe_hash:
        return None
    return (f"the canary switched adaptive verification off ({held.get('why')}); block serves until the probe step "
            "runs on new evidence (a new build or `--probe-levels`)")


class _Restart:
    """What up/serve.load reads of an `up` run, rebuilt from the state `up` left (the canary has no `up` options):
    the launchers step's files, the mode and name the choose step recorded, the service's host and port."""

    class _Plan(NamedTuple):
        host: str
        port: int
        adaptive_verification: bool = False
        block_argv: tuple | None = None
        argv: tuple = ()  # only what launch_facts.starts reads: the block command's --monokernel

    class _Options(NamedTuple):
        ready_timeout_s: float
        yes: bool = True

    def __init__(self, state: UpState, display):
        from rocm_dspark.launch.launch_facts import READY_TIMEOUT_S

        self.state, self.display, self.dir = state, display, state.path.parent
        svc = state.service or {}
        self.loads: list = []
        self.started = None
        mono = ((svc.get("facts") or {}).get("block") or {}).get("monokernel") is True
        self.plan = self._Plan(svc.get("host", "127.0.0.1"), int(svc.get("port", 8000)),
                               argv=("--monokernel",) if mono else ())
        self.outputs = {"launchers": state.output("launchers") or {}}
        self.options = self._Options(float(svc.get("ready_timeout_s") or READY_TIMEOUT_S))
        self._choose = state.output("choose") or {}

    def mode(self) -> str:
        return self._choose.get("mode") or "foreground"

    def name(self, _plan=None) -> str:
        return self._choose.get("name") or "rocm-dspark"

    def launch_plan(self, _which=None):
        return self.plan

    def say(self, line: str) -> None:
        self.display.say(line)

    def confirm(self, _what: str) -> None:
        pass  # a timer has no terminal; `up` installed these units already

    def stop_service(self) -> dict:
        from rocm_dspark.up.service import stop_recorded

        return stop_recorded(self.state)


# -- status --------------------------------------------------------------------------------------------------


def status_lines(state_dir, state_data: dict, bands: dict | None) -> list[str]:
    """`status`'s watch: the last canary and its result, acceptance against the A/B's band, the last mode change."""
    try:
        rec = load_record(state_dir)
    except UsageError as exc:
        return [f"canary: {exc}"]
    lines = []
    last = rec["runs"][-1] if rec["runs"] else None
    if last:
        c = rec["counts"]
        lines.append(f"canary: last {last['at']}: {last['result'].upper()} ({last['command']}, {last.get('tokens', 0)} "
                     f"tokens re-scored): {last['why']} [runs: {c['pass']} pass, {c['violation']} violation, "
                     f"{c['error']} error]")
        al = last.get("acceptance_length")
        band = (bands or {}).get(last["command"])
        if al is not None:
            where = (f", {'inside' if band['low'] <= al <= band['high'] else 'OUTSIDE'} the A/B's band [{band['low']:g}, "
                     f"{band['high']:g}] ({band['record_id']})") if band else " (no A/B band for this plan)"
            lines.append(f"acceptance during the last canary: mean accepted length {al:g}{where}")
        if last.get("switch"):
            lines.append(f"canary switch: {last['switch']}")
    change = (state_data.get("mode_changes") or [None])[-1]
    if change:
        lines.append(f"mode last changed {change['at']}: {change['from']} -> {change['to']} ({change['why']})")
    return lines


# -- the systemd form: a timer and its oneshot service, installed by `up` ------------------------------------

SERVICE_UNIT = """\
# {unit}: one canary run on {service}, started by {timer}
# Generated by `rocm-dspark up`; it reads and writes the `up` state in {state}, so it runs as the user that ran `up`.
# A violation on adaptive verification restarts the service with block (`sudo systemctl`, as `up` installs units).
[Unit]
Description=rocm-dspark canary of {service}
After=network-online.target {service}

[Service]
Type=oneshot
User={user}
ExecStart={exec_start}
TimeoutStartSec={timeout}
PrivateTmp=yes
"""

TIMER_UNIT = """\
# {unit}: the canary of {service} every {every} minutes (`rocm-dspark canary`); a run still going delays the next.
[Unit]
Description=rocm-dspark canary of {service} every {every} minutes

[Timer]
OnActiveSec={every}min
OnUnitInactiveSec={every}min
AccuracySec=30s

[Install]
WantedBy=timers.target
"""


def unit_files(run) -> dict[str, str]:
    """{file name: text} of the canary's service and timer for `up`'s systemd mode."""
    import getpass
    import shlex
    import sys

    from rocm_dspark.launch.launch_facts import start_window_s
    from rocm_dspark.launch.quoting import systemd_executable, systemd_path, systemd_specifiers

    name = run.name(run.plan)
    service, unit, timer = f"{name}.service", f"{name}-canary.service", f"{name}-canary.timer"
    words = [sys.executable, "-m", "rocm_dspark", "canary", "--timeout", str(int(TIMEOUT_S)), "--state-dir",
             str(run.options.state_dir)]  # as the readiness unit quotes its words (up/ready_server.py)
    exec_start = " ".join([systemd_executable(words[0], "python")]
                          + [systemd_specifiers(shlex.quote(w)) for w in words[1:-1]]
                          + [systemd_path(words[-1], "--state-dir")])
    # Two checks and, between them, a block start (the switch): all bounded.
    timeout = int(2 * TIMEOUT_S + start_window_s(run.plan._replace(adaptive_verification=False),
                                                 run.options.ready_timeout_s))
    fill = {"service": service, "timer": timer, "state": run.dir, "every": CANARY_EVERY_MIN}
    return {unit: SERVICE_UNIT.format(unit=unit, user=getpass.getuser(), exec_start=exec_start, timeout=timeout,
                                      **fill),
            timer: TIMER_UNIT.format(unit=timer, **fill)}


def actions(run) -> list:
    """systemd mode: the canary's units and the timer's start (what `up`'s summary step runs); else a note."""
    from rocm_dspark.up.actions import Run, Say, Write
    from rocm_dspark.up.service import UNIT_DIR

    if run.mode() != "systemd":
        return [Say("the canary (`rocm-dspark canary`, which re-scores the served tokens) is yours to schedule "
                    "(cron); the systemd mode installs a timer")]
    d, units = run.dir / "launch" / "canary", list(unit_files(run))
    return [Say(f"the canary every {CANARY_EVERY_MIN} minutes: its timer and service, enabled"),
            *[Write(str(d / u), 0o644, "canary unit") for u in units],
            *[Run(("install", "-D", "-m", "0644", str(d / u), f"{UNIT_DIR}/{u}"), root=True) for u in units],
            Run(("systemctl", "daemon-reload"), root=True), Run(("systemctl", "enable", "--now", units[1]), root=True)]


def ensure_timer(run) -> list[str]:
    """systemd mode: write the units and enable the timer (what `up`'s summary step runs); the lines it says."""
    from rocm_dspark.up.actions import Run
    from rocm_dspark.up.serve import run_all

    if run.mode() != "systemd":
        return []
    d = run.dir / "launch" / "canary"
    d.mkdir(parents=True, exist_ok=True)
    for file, text in unit_files(run).items():
        (d / file).write_text(text)
    run_all(run, [a for a in actions(run) if isinstance(a, Run)], "canary timer",
            "fix what it says and run `rocm-dspark up` again")
    return [f"canary: every {CANARY_EVERY_MIN} minutes ({list(unit_files(run))[1]}); `rocm-dspark status` names the last"]
