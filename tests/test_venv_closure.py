"""scripts/venv_closure.py, which fills the CPU test image's /opt/venv from the slow suite's venv: the closure
follows requirements, --drop leaves one out, and the console scripts it writes name the given interpreter and
carry the __main__ guard (vLLM's engine starts with spawn, which re-imports __main__: without the guard the image's
`vllm serve` died with "An attempt has been made to start a new process before the current process has finished
its bootstrapping phase", seen on the real image)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "venv_closure.py"


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_the_closure_follows_requirements_and_drop_leaves_one_out():
    got = _run("freeze", "click").stdout.split()
    assert any(line.startswith("click==") for line in got), got
    with_yaml = _run("freeze", "click", "pyyaml").stdout.split()
    assert any(line.startswith("pyyaml==") for line in with_yaml)
    assert not any(line.startswith("pyyaml==") for line in _run("freeze", "click", "pyyaml", "--drop", "PyYAML")
                   .stdout.split())


def test_console_scripts_name_the_given_python_and_guard_main(tmp_path):
    site, bindir = tmp_path / "site", tmp_path / "bin"
    bindir.mkdir()
    r = _run("copy", str(site), str(bindir), sys.executable, "pip")
    assert r.returncode == 0 and any(line.startswith("pip==") for line in r.stdout.split()), r.stderr
    script = (bindir / "pip").read_text()
    assert script.startswith(f"#!{sys.executable}\n") and "if __name__ == '__main__':\n" in script, script
    assert (site / "pip" / "__init__.py").is_file()
    # Imported as a module (what spawn does to __main__), it runs nothing; run as a script, it is pip.
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    imported = subprocess.run([sys.executable, "-c", f"import runpy; runpy.run_path({str(bindir / 'pip')!r})"],
                              capture_output=True, text=True, env=env, timeout=60)
    assert imported.returncode == 0 and imported.stdout == "", imported.stdout + imported.stderr
    ran = subprocess.run([str(bindir / "pip"), "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert ran.returncode == 0 and str(site / "pip") in ran.stdout, ran.stdout + ran.stderr
