"""The canary (rocm_dspark.up.canary, `rocm-dspark canary`): its lock, its record, the readiness server's /metrics
and the switch's bookkeeping. The re-scoring itself on a real vLLM is tests/slow/test_canary_real.py's; here the
lock is the real flock(2), the record a real file under docs/trust.md's rules, and /metrics is the real readiness
server process, parsed with prometheus_client's own text parser. The one stand-in is vLLM's /health (a stdlib
server) and, for the switch, the start of the block launcher (recorded, not run, as tests/test_up_loads.py does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.errors import UsageError
from rocm_dspark.runtime.process import free_port
from rocm_dspark.up import canary
from rocm_dspark.up.trust import up_lock

parser = pytest.importorskip("prometheus_client.parser")
REPO = Path(__file__).resolve().parents[1]


def test_a_second_canary_while_one_runs_refuses_in_one_line(tmp_path):
    d = tmp_path / "s" / "up"
    d.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "s", 0o700)
    with up_lock(d, "rocm-dspark canary"):  # the lock a running canary holds (the same flock(2) on up/up.lock)
        r = CliRunner().invoke(cli, ["canary", "--state-dir", str(tmp_path / "s")])
        up = CliRunner().invoke(cli, ["up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--mode", "foreground",
                                      "--yes", "--state-dir", str(tmp_path / "s")])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert f"refusing to start: another `rocm-dspark canary` (pid {os.getpid()}) is running on the state dir" in r.output
    assert up.exit_code == 2 and f"a `rocm-dspark canary` (pid {os.getpid()}) is running" in up.output
    assert not (d / canary.FILE).exists()  # refused before anything was written
    # Released: the next one runs (no service recorded here: its own one line, exit 2).
    r = CliRunner().invoke(cli, ["canary", "--state-dir", str(tmp_path / "s")])
    assert r.exit_code == 2 and "no service recorded" in r.output and "Traceback" not in r.output


def test_the_record_counts_each_result_keeps_the_last_runs_and_is_read_by_the_trust_rules(tmp_path):
    s = tmp_path / "s"
    (s / "up").mkdir(parents=True, mode=0o700)
    os.chmod(s, 0o700)
    assert canary.load_record(s) == {"schema": 1, "counts": {"pass": 0, "violation": 0, "error": 0}, "runs": []}
    results = ["pass"] * 19 + ["violation", "error", "pass"]
    for i, result in enumerate(results):
        canary._save(s, {"at": f"2026-12-02T10:{i:02d}:00Z", "result": result, "command": "block", "why": "x"})
    rec = canary.load_record(s)
    assert rec["counts"] == {"pass": 20, "violation": 1, "error": 1}  # counted over all runs
    assert len(rec["runs"]) == canary.RUNS_KEPT and rec["runs"][-1]["at"] == "2026-12-02T10:21:00Z"
    path = s / "up" / canary.FILE
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    path.chmod(0o620)  # writable by the group: not believed
    with pytest.raises(UsageError, match="writable by other users"):
        canary.load_record(s)
    path.chmod(0o600)
    path.write_text(json.dumps({"schema": 1, "counts": {"pass": -1}, "runs": []}))
    with pytest.raises(UsageError, match=r"is not a canary record file \(counts is not a count per result\)"):
        canary.load_record(s)
    path.write_text('{"schema": 1, "counts": {}, "runs": [{"result": "maybe"}]}')
    with pytest.raises(UsageError, match="runs is not a list of runs"):
        canary.load_record(s)
