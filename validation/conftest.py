"""The hardware validation suite: one pytest test per `rocm-dspark validate` check, run on a real node.

    pytest validation -m hardware --model V4.1-Flash --endpoint http://127.0.0.1:8000 --report /var/tmp/val
    pytest validation -m hardware --model V4.1-Flash --launch --report /var/tmp/val

It runs the same checks, in the same order, as `rocm-dspark validate` (rocm_dspark.validate), once per
session, writes the same report, and turns each check into a test: pass/warn pass, fail fails, skipped and
not_applicable skip with the check's reason. Without an AMD GPU every test is skipped, with that reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("rocm-dspark validation")
    group.addoption("--model", default="V4.1-Flash", help="model name or alias (default V4.1-Flash)")
    group.addoption("--gpu", default=None, help="GPU profile (default: detected)")
    group.addoption("--endpoint", default=None, help="base URL of the running server")
    group.addoption("--launch", action="store_true", help="start the server from the generated launcher")
    group.addoption("--server-json", default=None, help="the server actually run, if not the recipe's plan")
    group.addoption("--report", default=None, help="report directory (default: a pytest temp dir)")
    group.addoption("--quick", action="store_true", help="small sweep")
    group.addoption("--gsm8k", action="store_true", help="also run GSM8K through lm-eval")
    group.addoption("--service-user", default=None, help="user vLLM runs as")


def _options(config):
    from rocm_dspark.validate import ValidateOptions

    report = config.getoption("--report")
    return ValidateOptions(
        report_dir=Path(report) if report else Path(config._tmp_path_factory.mktemp("validation")),  # noqa: SLF001
        force=True, endpoint=config.getoption("--endpoint"), launch=config.getoption("--launch"),
        server_json=Path(config.getoption("--server-json")) if config.getoption("--server-json") else None,
        quick=config.getoption("--quick"), gsm8k=config.getoption("--gsm8k"),
        service_user=config.getoption("--service-user"), require_gpu=True,
    )


def _no_amd_gpu() -> str | None:
    from rocm_dspark.runtime.inventory import inventory

    inv = inventory()
    return None if inv.amd_host else inv.no_gpu_reason()


def pytest_collection_modifyitems(config, items):
    reason = _no_amd_gpu()
    if reason:
        for item in items:
            if "hardware" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=f"{reason}: the validation suite runs on an AMD MI300-class node"))


@pytest.fixture(scope="session")
def validation_report(request):
    """Run every check once (they depend on each other's order) and hand the report to the tests."""
    from rocm_dspark.validate import run_validation

    opts = _options(request.config)
    selection = {"model": request.config.getoption("--model"), "gpu": request.config.getoption("--gpu"),
                 "adaptive": "auto", "nodes": 1}
    rep = run_validation(opts, selection, command=["pytest", "validation"], say=print)
    print(f"\nreport written to {opts.report_dir}")
    return {c["name"]: c for c in rep["checks"]}
