import os
import shutil
import sys

import pytest

from tests.helpers import CLI, FIXTURES, REPO, cli_env  # noqa: F401 (the tests import them from here)

# Bytecode caching, Python's default, for this run and every interpreter it starts (the CLI, the probe's child, the
# stand-ins): where PYTHONDONTWRITEBYTECODE is set (this project's sandbox sets it), each of them compiled
# rocm_dspark from source again, about a third of the CPU of the files that start the CLI. __pycache__ is ignored.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def private_state_dir(tmp_path_factory, monkeypatch):
    """Probe records of the developer's own machine must not change what the tests see."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("ROCM_DSPARK_STATE_DIR", str(state))
    monkeypatch.delenv("COLUMNS", raising=False)  # output widths as in a pipe (rocm_dspark/textwidth.py), not this shell's
    return state


@pytest.fixture
def recipes_copy(tmp_path, monkeypatch):
    """A private copy of recipes/ that a test may break; ROCM_DSPARK_RECIPES points at it."""
    dst = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", dst)
    monkeypatch.setenv("ROCM_DSPARK_RECIPES", str(dst))
    return dst


@pytest.fixture
def rig(tmp_path):
    """The launcher rig (tests/helpers/launcher_rig.py) in this test's temp dir."""
    from tests.helpers.launcher_rig import Rig

    return Rig(tmp_path)


@pytest.fixture
def mi300x_host(tmp_path, monkeypatch):
    """This process sees an MI300X x8 host with ROCm 6.2.3 and amdgpu 6.8.5: instruments fed the recorded real
    rocminfo output (tests/helpers/probe_records.py), as no AMD GPU is here."""
    from rocm_dspark.probe import fingerprint
    from tests.helpers.probe_records import ROCMINFO_MI300X_X8

    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "rocminfo"
    tool.write_text(f"#!/bin/sh\ncat {ROCMINFO_MI300X_X8}\n")
    tool.chmod(0o755)
    rocm = tmp_path / "rocm"
    (rocm / ".info").mkdir(parents=True)
    (rocm / ".info" / "version").write_text("6.2.3\n")
    driver = tmp_path / "amdgpu-version"
    driver.write_text("6.8.5\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ROCM_PATH", str(rocm))
    monkeypatch.setattr(fingerprint, "AMDGPU_VERSION_FILE", driver)
    return tmp_path / "state"


@pytest.fixture(scope="module")
def fp():
    """This host's fingerprint for the payoff tests' plan (tests/helpers/ab_records.py)."""
    from rocm_dspark.probe import fingerprint
    from rocm_dspark.recipe.catalog import load_catalog
    from tests.helpers.ab_records import plan_of

    return fingerprint.current_fingerprint(load_catalog(), plan_of())
