"""The plugin's decision and entry point, without vLLM (the real-vLLM tests are tests/slow/test_plugin_real.py)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.vllm_plugin import register, register_with
from rocm_dspark.vllm_plugin.capability import capability_for, decide


@pytest.mark.parametrize(
    ("version", "is_rocm", "patch", "words"),
    [
        ("0.32.0", True, True, "refuses adaptive verification"),
        ("0.32.0+rocm723", True, True, "refuses adaptive verification"),
        ("0.30.0.dev229+g124154a88", True, True, "refuses adaptive verification"),
        ("0.31.2", True, True, "refuses adaptive verification"),
        ("0.33.0", True, False, "natively"),
        ("0.33.0rc1", True, False, "natively"),
        ("0.40.1", True, False, "natively"),
        ("0.29.0", True, False, "no DeepSeek-V4.1"),
        ("0.32.0", False, False, "not ROCm"),
    ],
)
def test_decision_follows_the_capability_table(version, is_rocm, patch, words):
    cap = load_catalog().vllm_capability(version)
    decision = decide(version, cap, is_rocm=is_rocm, platform_name="rocm" if is_rocm else "cuda")
    assert decision.patch is patch
    assert words in decision.reason and version in decision.reason


def test_decision_reads_the_table_not_the_version(recipes_copy):
    # Mark 0.30-0.32 as native in a private copy: the same vLLM 0.32.0 is then left alone.
    path = recipes_copy / "vllm.yaml"
    text = path.read_text()
    block = text[text.index('versions: ">=0.32.0,<0.33.0"'):]
    edited = block.replace("refuses_adaptive_on_rocm_v41: true", "refuses_adaptive_on_rocm_v41: false", 1) \
                  .replace("native_adaptive_on_rocm_v41: false", "native_adaptive_on_rocm_v41: true", 1)
    path.write_text(text.replace(block, edited))
    cap, error = capability_for("0.32.0")
    assert error is None and cap.native_adaptive_on_rocm_v41
    assert decide("0.32.0", cap, is_rocm=True, platform_name="rocm").patch is False


def test_unreadable_table_means_do_nothing(recipes_copy):
    (recipes_copy / "vllm.yaml").write_text("capabilities: [\n")
    cap, error = capability_for("0.32.0")
    assert cap is None and "vllm.yaml" in error
    decision = decide("0.32.0", cap, error, is_rocm=True, platform_name="rocm")
    assert decision.patch is False and "cannot tell" in decision.reason


def test_register_with_a_native_capability_touches_nothing():
    native = load_catalog().vllm_capability("0.33.0")
    before = set(sys.modules)
    result = register_with(vllm_version="0.33.0", capability=native, is_rocm=True, platform_name="rocm")
    assert result.action == "skipped" and "natively" in result.message
    assert not any(m.startswith(("vllm", "torch", "triton")) for m in set(sys.modules) - before)
    assert not any(type(f).__name__ == "_PatchOnImport" for f in sys.meta_path)


def test_register_without_vllm_logs_one_line_and_does_not_raise(caplog):
    pytest.importorskip("rocm_dspark")  # always true; vLLM is absent from this venv
    if subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0:
        pytest.skip("vLLM is installed here; the real-vLLM path is covered by tests/slow/test_plugin_real.py")
    with caplog.at_level(logging.INFO, logger="rocm_dspark.vllm_plugin"):
        result = register()
    assert result.action == "failed" and "did nothing" in result.message
    assert [r.getMessage() for r in caplog.records if r.name == "rocm_dspark.vllm_plugin"] == [result.message]


def test_importing_the_plugin_is_cheap():
    # vLLM imports general plugins in every process: the module must not pull in torch/triton/vllm.
    code = ("import sys, rocm_dspark.vllm_plugin, rocm_dspark.vllm_plugin.status; "
            "print([m for m in ('torch', 'triton', 'vllm') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_entry_point_is_discoverable_as_vllm_finds_it():
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "rocm_dspark"]
    assert len(found) == 1 and found[0].value == "rocm_dspark.vllm_plugin:register"
    assert found[0].load() is register


def test_status_cli_without_vllm():
    if subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0:
        pytest.skip("vLLM is installed here; tests/slow/test_plugin_real.py covers status with vLLM")
    proc = subprocess.run([sys.executable, "-m", "rocm_dspark", "plugin", "status", "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["vllm_distributions"] == [] and "not installed" in report["error"]
    assert report["entry_point"]["registered"] is True and report["entry_point"]["loads"] is True
    table = subprocess.run([sys.executable, "-m", "rocm_dspark", "plugin", "status"], capture_output=True, text=True)
    assert table.returncode == 0 and "vLLM:         not installed" in table.stdout


def test_status_usage_errors_are_one_line(tmp_path):
    for args, words in ((["--gpu", "mi30x"], "unknown GPU 'mi30x'"),
                        (["--model", str(tmp_path)], f"--model {str(tmp_path)!r} holds no config.json")):
        proc = subprocess.run([sys.executable, "-m", "rocm_dspark", "plugin", "status", *args],
                              capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.startswith(f"rocm-dspark: error: {words}") and len(proc.stderr.splitlines()) == 1


def test_status_honours_vllm_plugins(monkeypatch):
    from rocm_dspark.vllm_plugin.entry_point import entry_point_status

    assert entry_point_status(None)["allowed_by_VLLM_PLUGINS"] is True
    assert entry_point_status("rocm_dspark,other")["allowed_by_VLLM_PLUGINS"] is True
    assert entry_point_status("")["allowed_by_VLLM_PLUGINS"] is False
    assert entry_point_status("other")["allowed_by_VLLM_PLUGINS"] is False
