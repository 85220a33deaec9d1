"""One test per validation check (see conftest.py). Marked `hardware`: the default test run deselects it."""

from __future__ import annotations

import pytest

from rocm_dspark.validate import ValidateOptions, check_names

pytestmark = pytest.mark.hardware


def pytest_generate_tests(metafunc):
    if "check_name" in metafunc.fixturenames:
        cfg = metafunc.config
        opts = ValidateOptions(report_dir=".", launch=cfg.getoption("--launch"), quick=cfg.getoption("--quick"))
        metafunc.parametrize("check_name", check_names(opts))


def test_check(validation_report, check_name):
    result = validation_report[check_name]
    line = f"{check_name}: {result['message']}"
    if result["status"] in ("skipped", "not_applicable"):
        pytest.skip(line)
    if result["status"] == "fail":
        pytest.fail(line + (" (blocking: the checks after it were skipped)" if result["blocking"] else ""), pytrace=False)
    if result["status"] == "warn":
        print("WARNING " + line)
