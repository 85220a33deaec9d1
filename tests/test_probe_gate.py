"""The gate: which probe records turn `enable_adaptive_verification` on, and what the plan says about it.

This machine has no AMD GPU, so a record that proves adaptive verification cannot be produced here.
The "complete" records below are built with the real record code from level results in the formats
the levels write on a GPU host (the kernel evidence is rocm_dspark.attention.selfcheck's dict with
interpreted=False and graph_replay=True; its numbers are placeholders, not measurements). The host
is an MI300X x8 as far as the fingerprint can see: `rocminfo` on PATH is an instrument printing a
real recorded MI300X rocminfo output (tests/fixtures/host), ROCM_PATH points at a version file, and
the amdgpu version file is redirected. Everything the gate computes, it computes for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rocm_dspark.probe import fingerprint, gate
from rocm_dspark.probe.fingerprint import FIELDS
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.resolve import resolve, resolve_plan
from tests.conftest import cli_env
from tests.helpers import run_cli
from tests.helpers.probe_records import KERNEL_OK, LIVE_OK, LIVE_REFUSED, SELECTION, STATIC_OK, here, write


def test_no_record_is_cheap_and_says_where_it_looked(tmp_path, monkeypatch):
    def must_not_run(*a, **k):
        raise AssertionError("the fingerprint was computed although there is no record")

    monkeypatch.setattr(fingerprint, "current_fingerprint", must_not_run)
    verdict = gate.gate_verdict(load_catalog(), resolve_plan(load_catalog(), SELECTION), state_dir=tmp_path / "empty")
    assert verdict[:3] == (False, f"no probe record in {tmp_path / 'empty' / 'probe'}", None)
    assert verdict.outcome == "not proven"


def test_the_fingerprint_sees_the_host_it_is_given(mi300x_host):
    fp = here(load_catalog())
    assert (fp["gpu_arch"], fp["gpu_name"], fp["gpu_count"]) == ("gfx942", "AMD Instinct MI300X", 8)
    assert (fp["rocm_version"], fp["driver_version"]) == ("6.2.3", "6.8.5")
    assert fp["gpu"] == "mi300x" and fp["tp"] == 8 and fp["num_speculative_tokens"] == 5 and fp["max_num_seqs"] == 128
    assert fp["plan_vllm"] == "0.32.0"
    assert '"enable_adaptive_verification":true' in " ".join(fp["launch"]["argv"])
    assert "--port" not in fp["launch"]["argv"] and "--host" not in fp["launch"]["argv"]


def test_matching_complete_record_turns_the_flag_on_and_the_plan_says_which(mi300x_host):
    catalog = load_catalog()
    rid, path = write(mi300x_host, here(catalog))
    verdict = gate.gate_verdict(catalog, resolve_plan(catalog, SELECTION), state_dir=mi300x_host)
    assert verdict.adaptive_proven and verdict.record == path
    assert f"record {rid}" in verdict.reason and "static, GPU kernel" in verdict.reason
    plan = resolve(catalog, SELECTION, verdict)
    assert plan.adaptive_verification and plan.speculative_config["enable_adaptive_verification"] is True
    assert plan.block_argv is not None  # the launcher's fallback to block verification
    assert any(n.topic == "adaptive verification" and rid in n.text and n.text.startswith("ON") for n in plan.notes)


def _other(key, value):
    if key == "launch":
        return {"argv": value["argv"] + ["--max-model-len", "65536"], "env": value["env"]}
    if isinstance(value, int):
        return value + 1
    return "other-" + (value or "none")


@pytest.mark.parametrize("key,words", [(key, words) for key, words, _ in FIELDS])
def test_each_mismatching_field_keeps_it_off_with_a_named_note(mi300x_host, key, words):
    catalog = load_catalog()
    fp = here(catalog)
    recorded = {**fp, key: _other(key, fp[key])}
    rid, _ = write(mi300x_host, recorded)
    verdict = gate.gate_verdict(catalog, resolve_plan(catalog, SELECTION), state_dir=mi300x_host)
    assert not verdict.adaptive_proven and verdict.record is None
    assert f"record {rid} is for " in verdict.reason and verdict.reason.endswith(": ignored")
    if key == "launch":
        assert "another launch command (--max-model-len 65536 in the record, 1048576 in the plan)" in verdict.reason
    else:
        where = "host" if key in {k for k, _, _ in fingerprint.HOST_FIELDS} else "plan"
        shown = fp[key] if fp[key] is not None else "none"
        assert f"{words} {recorded[key]} (this {where} has {shown})" in verdict.reason
    plan = resolve(catalog, SELECTION, verdict)
    assert not plan.adaptive_verification
    assert any(rid in n.text and n.text.startswith("OFF") for n in plan.notes)


def test_another_vllm_is_named_with_both_versions(mi300x_host, tmp_path, monkeypatch):
    # An installed vLLM is read from its generated vllm/_version.py (this file has the real format).
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "_version.py").write_text(
        "__version__ = version = '0.33.0'\n__version_tuple__ = version_tuple = (0, 33, 0)\n"
        "__commit_id__ = commit_id = None\n")
    monkeypatch.syspath_prepend(str(site))
    catalog = load_catalog()
    fp = here(catalog)
    assert fp["vllm_version"] == "0.33.0"
    rid, _ = write(mi300x_host, {**fp, "vllm_version": "0.32.0"})
    verdict = gate.gate_verdict(catalog, resolve_plan(catalog, SELECTION), state_dir=mi300x_host)
    assert f"record {rid} is for vLLM 0.32.0 (this host has 0.33.0): ignored" in verdict.reason


def test_other_gpu_model_and_layout_are_all_named(mi300x_host):
    catalog = load_catalog()
    fp = here(catalog)
    rid, _ = write(mi300x_host, {**fp, "gpu_name": "AMD Instinct MI325X", "model_id": "deepseek-ai/DeepSeek-V4-Flash", "tp": 4})
    reason = gate.gate_verdict(catalog, resolve_plan(catalog, SELECTION), state_dir=mi300x_host).reason
    assert "GPU AMD Instinct MI325X (this host has AMD Instinct MI300X)" in reason
    assert "model deepseek-ai/DeepSeek-V4-Flash (this plan has deepseek-ai/DeepSeek-V4.1-Flash)" in reason
    assert "tensor parallel size 4 (this plan has 8)" in reason


def test_a_selection_change_is_a_plan_change(mi300x_host):
    catalog = load_catalog()
    write(mi300x_host, here(catalog))
    other = SELECTION._replace(num_speculative_tokens=3)
    verdict = gate.gate_verdict(catalog, resolve_plan(catalog, other), state_dir=mi300x_host)
    assert not verdict.adaptive_proven and "K 5 (this plan has 3)" in verdict.reason
    assert gate.gate_verdict(catalog, resolve_plan(catalog, SELECTION), state_dir=mi300x_host).adaptive_proven


def test_tampered_record_is_ignored(mi300x_host):
    catalog = load_catalog()
    rid, path = write(mi300x_host, here(catalog), levels=(STATIC_OK, KERNEL_OK, LIVE_REFUSED))
    data = json.loads(open(path).read())
    data["levels"][2]["passed"] = True  # someone "fixes" the failed live level by hand
    open(path, "w").write(json.dumps(data))
    verdict = gate.gate_verdict(catalog, resolve_plan(catalog, SELECTION), state_dir=mi300x_host)
    assert not verdict.adaptive_proven
    assert f"{rid}.json is not a valid probe record (content hash does not match (edited or corrupted)): ignored" in verdict.reason


def test_truncated_record_is_ignored(mi300x_host):
    catalog = load_catalog()
    rid, path = write(mi300x_host, here(catalog))
    text = open(path).read()
    open(path, "w").write(text[: len(text) // 3])
    verdict = gate.gate_verdict(catalog, resolve_plan(catalog, SELECTION), state_dir=mi300x_host)
    assert not verdict.adaptive_proven and f"{rid}.json is not a valid probe record (not valid JSON" in verdict.reason


def test_renamed_record_is_ignored(mi300x_host):
    catalog = load_catalog()
    rid, path = write(mi300x_host, here(catalog))
    renamed = os.path.join(os.path.dirname(path), "20991231T000000Z-ffffffff.json")
    os.rename(path, renamed)
    verdict = gate.gate_verdict(catalog, resolve_plan(catalog, SELECTION), state_dir=mi300x_host)
    assert not verdict.adaptive_proven and f"holds record {rid} (renamed file): ignored" in verdict.reason


@pytest.mark.parametrize("levels,override,why", [
    ((STATIC_OK, KERNEL_OK), None, "no live level"),
    ((STATIC_OK, LIVE_OK), None, "no kernel level"),
    ((KERNEL_OK, LIVE_OK), None, "no static level"),
    ((STATIC_OK, KERNEL_OK._replace(valid_for_gating=False, gating_note="not valid for gating: ran in the Triton interpreter on CPU, not on an AMD GPU",
                                    evidence={**KERNEL_OK.evidence, "interpreted": True, "graph_replay": False}), LIVE_OK),
     None, "its kernel level does not count (ran in the Triton interpreter on CPU"),
    ((STATIC_OK, KERNEL_OK._replace(evidence={**KERNEL_OK.evidence, "interpreted": True}), LIVE_OK),
     None, "its kernel level ran in the Triton interpreter"),
    ((STATIC_OK, KERNEL_OK._replace(evidence={**KERNEL_OK.evidence, "graph_replay": False}), LIVE_OK),
     None, "its kernel level has no graph replay"),
    ((STATIC_OK, KERNEL_OK._replace(evidence={**KERNEL_OK.evidence, "negative_control_caught": False}), LIVE_OK),
     None, "did not show the negative control caught"),
    ((STATIC_OK._replace(evidence={"forced_platform": True}), KERNEL_OK, LIVE_OK), None, "ROCm platform forced"),
    ((STATIC_OK, KERNEL_OK, LIVE_OK), {"kind": "command-file", "path": "/tmp/tiny.json", "argv": ["vllm"]},
     "its live level ran another command than the plan's"),
    ((STATIC_OK, KERNEL_OK, LIVE_OK._replace(evidence={**LIVE_OK.evidence, "attached": True})), None,
     "its live level attached to a server not shown to run the plan's command"),
    ((STATIC_OK, KERNEL_OK, LIVE_OK._replace(evidence={**LIVE_OK.evidence, "attached": True,
                                                       "command_verified": "true"})), None,
     "its live level attached to a server not shown to run the plan's command"),
    ((STATIC_OK, KERNEL_OK, LIVE_OK._replace(evidence={**LIVE_OK.evidence, "attached": True, "command_verified": False})),
     None, "its live level attached to a server not shown to run the plan's command"),
    ((STATIC_OK, KERNEL_OK, LIVE_OK._replace(evidence={**LIVE_OK.evidence, "adaptive_verification": False})), None,
     "did not run with enable_adaptive_verification on"),
    # Only a JSON boolean counts (rocm_dspark/probe/evidence.py): look-alikes prove nothing.
    ((STATIC_OK, KERNEL_OK._replace(evidence={**KERNEL_OK.evidence, "graph_replay": "yes"}), LIVE_OK),
     None, "its kernel level has no graph replay"),
    ((STATIC_OK._replace(evidence={"forced_platform": 0}), KERNEL_OK, LIVE_OK), None, "ROCm platform forced"),
    ((STATIC_OK, KERNEL_OK, LIVE_OK._replace(evidence={**LIVE_OK.evidence, "ready": 1})), None,
     "never saw the server ready"),
    # A live level that started and answered but whose tokens were not proven by re-scoring (probe.rescore).
    ((STATIC_OK, KERNEL_OK, LIVE_OK._replace(evidence={k: v for k, v in LIVE_OK.evidence.items()
                                                       if k != "token_correct"})), None,
     "did not prove the emitted tokens by re-scoring"),
    ((STATIC_OK, KERNEL_OK, LIVE_OK._replace(evidence={**LIVE_OK.evidence, "token_correct": "true"})), None,
     "did not prove the emitted tokens by re-scoring"),
    # vllm#53488: a record from before the reference route was recorded (no field) proves nothing, nor does a
    # reference whose self-check failed, even where the level says it passed.
    ((STATIC_OK, KERNEL_OK, LIVE_OK._replace(evidence={k: v for k, v in LIVE_OK.evidence.items()
                                                       if k != "reference_independent"})), None,
     "re-scoring reference is not shown to be out of the drafter's reach (vllm#53488): re-probe"),
    ((STATIC_OK, KERNEL_OK, LIVE_OK._replace(evidence={**LIVE_OK.evidence, "reference_independent": False})), None,
     "re-scoring reference is not shown to be out of the drafter's reach"),
    ((STATIC_OK, KERNEL_OK, LIVE_OK._replace(evidence={**LIVE_OK.evidence, "reference_unreliable": True})), None,
     "its live level's re-scoring reference was unreliable (vllm#53488)"),
    # A failed live level that does not count (its reference was unreliable) is not a refutation.
    ((STATIC_OK, KERNEL_OK, LIVE_OK._replace(passed=False, valid_for_gating=False, reason="token re-scoring: ...",
                                             gating_note="not valid for gating: reference unreliable (vllm#53488)",
                                             evidence={**LIVE_OK.evidence, "token_correct": False,
                                                       "reference_unreliable": True})), None,
     "does not count (reference unreliable (vllm#53488))"),
])
def test_incomplete_evidence_is_not_enough(mi300x_host, levels, override, why):
    catalog = load_catalog()
    rid, _ = write(mi300x_host, here(catalog), levels, override=override)
    verdict = gate.gate_verdict(catalog, resolve_plan(catalog, SELECTION), state_dir=mi300x_host)
    assert not verdict.adaptive_proven
    assert f"record {rid} matches but is not enough: " in verdict.reason and why in verdict.reason


def test_an_attached_live_run_shown_to_be_the_plans_command_counts(mi300x_host):
    """`up` probes the server it started: /proc showed the plan's command serving (tests/test_probe_serving.py)."""
    catalog = load_catalog()
    live = LIVE_OK._replace(evidence={**LIVE_OK.evidence, "attached": True, "command_verified": True})
    rid, path = write(mi300x_host, here(catalog), (STATIC_OK, KERNEL_OK, live))
    verdict = gate.gate_verdict(catalog, resolve_plan(catalog, SELECTION), state_dir=mi300x_host)
    assert verdict.adaptive_proven and verdict.record == path and f"record {rid}" in verdict.reason


def test_newest_failure_beats_an_older_pass(mi300x_host):
    catalog = load_catalog()
    fp = here(catalog)
    write(mi300x_host, fp)
    rid, path = write(mi300x_host, fp, levels=(STATIC_OK, KERNEL_OK, LIVE_REFUSED))
    verdict = gate.gate_verdict(catalog, resolve_plan(catalog, SELECTION), state_dir=mi300x_host)
    assert not verdict.adaptive_proven and verdict.record == path
    assert f"record {rid}" in verdict.reason and "but its live level failed: vLLM refused to start" in verdict.reason


def test_a_newer_partial_run_does_not_hide_an_older_complete_one(mi300x_host):
    catalog = load_catalog()
    fp = here(catalog)
    old, _ = write(mi300x_host, fp)
    write(mi300x_host, fp, levels=(STATIC_OK,))
    write(mi300x_host, {**fp, "gpu_count": 4})
    verdict = gate.gate_verdict(catalog, resolve_plan(catalog, SELECTION), state_dir=mi300x_host)
    assert verdict.adaptive_proven and f"record {old}" in verdict.reason


def test_many_unmatched_records_are_counted_not_listed(mi300x_host):
    catalog = load_catalog()
    fp = here(catalog)
    for n in range(5):
        write(mi300x_host, {**fp, "max_num_seqs": 10 + n})
    reason = gate.gate_verdict(catalog, resolve_plan(catalog, SELECTION), state_dir=mi300x_host).reason
    assert reason.startswith("5 probe record(s) in ") and reason.endswith("; and 2 more record(s) not matching")


# --- through the CLI, as `rocm-dspark recipe` runs it: in a child where the imports are counted, else in process ---

HEAVY = ("torch", "triton", "vllm", "numpy", "httpx")


def _recipe(args, env):
    code = ("import sys; from rocm_dspark.cli import main\n"
            f"try:\n    main({args!r})\nexcept SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
            f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
            "sys.stderr.write('HEAVY=' + repr(heavy) + '\\n'); sys.exit(code)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


@pytest.fixture
def cli_host(mi300x_host, monkeypatch):
    # A child process cannot see the redirected amdgpu file: give both sides "no driver file".
    monkeypatch.setattr(fingerprint, "AMDGPU_VERSION_FILE", mi300x_host / "absent")
    return mi300x_host, cli_env(PATH=os.environ["PATH"], ROCM_PATH=os.environ["ROCM_PATH"])


def test_recipe_turns_it_on_from_a_record_without_heavy_imports(cli_host, tmp_path):
    """Proof (the probe record) and payoff for the declared workload turn it on. The public prediction
    cannot decide at c=128 (its stated error covers both capture readings of vllm#52362, issue 24), so the
    same recipe stays off until this host's own calibration (`plan --calibrate`, whose table shows
    adaptive paying there) is stored; the payoff half reads data, so the recipe path imports nothing heavy."""
    from rocm_dspark.probe.calibration_record import run_calibrate
    from tests.helpers.host_fit_tables import synthetic_table

    state, env = cli_host
    rid, _ = write(state, here(load_catalog(), SELECTION._replace(concurrency=128)))
    args = ["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--vllm-version", "0.32.0",
            "--concurrency", "128", "--format", "json", "--state-dir", str(state)]
    before = json.loads(_recipe(args, env).stdout)
    assert before["adaptive_verification"] is False
    assert any("payoff decided by prediction" in n["text"] and "cannot be told apart" in n["text"]
               for n in before["notes"])
    catalog = load_catalog()
    run_calibrate(catalog, catalog.find_model("V4.1-Flash"), "mi300x", synthetic_table(tmp_path, "mi300x"), state)
    proc = _recipe(args, env)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["adaptive_verification"] is True and plan["block_argv"]
    assert any(rid in n["text"] and "payoff decided by this host's calibration" in n["text"] for n in plan["notes"])
    assert "HEAVY=[]" in proc.stderr


def test_recipe_proof_without_a_declared_workload_stays_off(cli_host):
    state, env = cli_host
    write(state, here(load_catalog()))
    proc = _recipe(["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--vllm-version", "0.32.0",
                    "--format", "json", "--state-dir", str(state)], env)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["adaptive_verification"] is False
    assert any(n["text"].startswith("OFF") and "--concurrency" in n["text"] for n in plan["notes"])
    assert "HEAVY=[]" in proc.stderr


def test_recipe_adaptive_on_without_a_record_is_a_usage_error(cli_host):
    state, env = cli_host
    proc = run_cli(["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--adaptive", "on", "--state-dir", str(state)],
                   env=env)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no probe record in {state / 'probe'}" in lines[0]


def test_recipe_adaptive_on_names_the_missing_evidence(cli_host):
    state, env = cli_host
    rid, _ = write(state, here(load_catalog()), levels=(STATIC_OK, KERNEL_OK))
    proc = run_cli(["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--vllm-version", "0.32.0", "--adaptive", "on",
                    "--state-dir", str(state)], env=env)
    assert proc.returncode == 2 and f"record {rid} matches but is not enough: no live level" in proc.stderr
    auto = run_cli(["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--vllm-version", "0.32.0", "--format", "json",
                    "--state-dir", str(state)], env=env)
    plan = json.loads(auto.stdout)
    assert plan["adaptive_verification"] is False
    assert any(n["text"].startswith("OFF") and "no live level" in n["text"] for n in plan["notes"])


def test_one_resolution_per_command_even_when_a_record_is_consulted(mi300x_host, monkeypatch, tmp_path):
    """The gate reads the plan it is given (its adaptive command); it never resolves a second time."""
    from rocm_dspark.probe.calibration_record import run_calibrate
    from rocm_dspark.recipe import resolve as resolver
    from rocm_dspark.usecase import launch_plan as selection
    from tests.helpers.host_fit_tables import synthetic_table

    catalog = load_catalog()
    rid, _ = write(mi300x_host, here(catalog, SELECTION._replace(concurrency=128)))
    # the payoff half pays at c=128 by this host's calibration (the public prediction cannot decide there)
    run_calibrate(catalog, catalog.find_model("V4.1-Flash"), "mi300x", synthetic_table(tmp_path, "mi300x"), mi300x_host)
    calls = []
    real = resolver.resolve_plan
    monkeypatch.setattr(resolver, "resolve_plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    _, _, plan = selection.plan_for({"model": "V4.1-Flash", "gpu": "mi300x", "vllm_version": "0.32.0",
                                     "concurrency": 128, "state_dir": str(mi300x_host)}, catalog)
    assert calls == [1] and plan.adaptive_verification and plan.argv == plan.adaptive_argv
    assert any(rid in n.text for n in plan.notes)


def test_recipe_ab_record_decides_and_on_warns_when_it_loses(cli_host):
    """A measured A/B at the declared concurrency beats the prediction: at c=128 the prediction says
    pays, a record that measured a loss there keeps auto off, and --adaptive on warns."""
    from rocm_dspark.probe import ab_record
    from rocm_dspark.probe import store as ab_store

    state, env = cli_host
    fp = here(load_catalog(), SELECTION._replace(concurrency=128))
    write(state, fp)
    from tests.helpers.ab_records import arm as ab_arm
    from tests.helpers.ab_records import workload

    arm = lambda tok_s: ab_arm(tok_s, al=3.0, concurrency=128, requests=512)  # noqa: E731
    now = ab_store.utc_now()
    data = ab_record.build(record_id=ab_store.new_record_id(now), created_at=ab_store.iso(now), finished_at=ab_store.iso(now),
                           toolkit_version=fp["toolkit_version"], host={}, selection={}, fingerprint=fp,
                           concurrency=128, workload=workload(512), arms={"block": arm(4000.0), "adaptive": arm(3600.0)},
                           override=None)
    ab_record.write(state, data)
    args = ["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--vllm-version", "0.32.0", "--concurrency", "128",
            "--format", "json", "--state-dir", str(state)]
    auto = _recipe(args, env)
    plan = json.loads(auto.stdout)
    assert plan["adaptive_verification"] is False
    assert any(f"payoff decided by A/B record {data['id']}" in n["text"] and "-10.0%" in n["text"] for n in plan["notes"])
    on = _recipe(args + ["--adaptive", "on"], env)
    assert json.loads(on.stdout)["adaptive_verification"] is True
    assert "warning: --adaptive on: adaptive verification is proven here but does not pay" in on.stderr
