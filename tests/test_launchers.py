"""Generated launcher files checked with the real tools: bash, shellcheck, systemd-analyze verify.

Quoting is checked against the real interpreters: a bash word must make bash print the exact bytes, and a
systemd ExecStart path must make `systemd-analyze verify` find the exact file. The CLI's bad-input paths
are run in a subprocess: one line on stderr, exit 2, and the output directory left as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocm_dspark.launch import quoting
from rocm_dspark.errors import UsageError
from rocm_dspark.launch.launchers import render_launcher, render_unit, write_launchers
from tests.conftest import CLI, cli_env
from tests.test_launchers_run import HOSTILE, make_plan

SHELLCHECK = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")


def shellcheck(path: Path) -> None:
    res = subprocess.run([SHELLCHECK, "-S", "style", "-s", "bash", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def verify_unit(path: Path, launcher: Path | None = None) -> str:
    """`systemd-analyze verify`, silent. A generated unit runs the launcher from INSTALL_DIR, which the install
    commands fill and a test may not write: verify a copy whose ExecStart is the written launcher instead."""
    from rocm_dspark.launch.launchers import INSTALL_DIR

    text = path.read_text()
    if f'ExecStart="{INSTALL_DIR}/' in text:
        launcher = launcher or path.with_suffix(".sh")
        start = text.index('ExecStart="') + len('ExecStart="')
        text = text[:start] + quoting.systemd_executable(str(launcher))[1:-1] + text[text.index('"', start):]
        path = path.parent / ("verify-" + path.name)
        path.write_text(text)
    env = dict(os.environ)
    if "Requires=docker.service" in text:  # no docker daemon here: a stand-in unit, so Requires= resolves
        stub = path.parent / "verify-units"
        stub.mkdir(exist_ok=True)
        (stub / "docker.service").write_text("[Unit]\nDescription=stand-in (verify only)\n[Service]\nExecStart=/bin/true\n")
        env["SYSTEMD_UNIT_PATH"] = f"{stub}:"  # the trailing ':' keeps systemd's own search path
    res = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(path)], capture_output=True, text=True, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and out.strip() == "", out
    return out


def exposure(unit: Path) -> float:
    """The overall exposure `systemd-analyze security --offline=yes` gives the unit (0 = most locked down)."""
    res = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=yes", "--no-pager", str(unit)],
                         capture_output=True, text=True, timeout=120)
    line = next(ln for ln in res.stdout.splitlines() if "Overall exposure level" in ln)
    return float(line.split(":", 1)[1].split()[0])


# ---- quoting against the real interpreters ----

def bash_words(values: list[str], locale: str = "C.UTF-8") -> list[bytes]:
    script = "printf '%s\\0' " + " ".join(quoting.bash_word(v) for v in values)
    res = subprocess.run(["bash", "-c", script], capture_output=True, check=True,
                         env={"PATH": os.environ["PATH"], "LC_ALL": locale})
    return res.stdout.split(b"\0")[:-1]


def test_bash_word_round_trips_hostile_values():
    for locale in ("C.UTF-8", "C"):
        assert bash_words(HOSTILE, locale) == [v.encode() for v in HOSTILE]
    assert quoting.bash_word("plain-word_1.2/x") == "plain-word_1.2/x"
    assert quoting.bash_word("a\nb") == "$'a\\nb'"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0")), min_size=1, max_size=8))
def test_bash_word_round_trips_any_text(values):
    assert bash_words(values) == [v.encode() for v in values]


def test_nul_is_refused_not_mangled():
    with pytest.raises(UsageError, match="NUL"):
        quoting.bash_word("a\0b")


@needs_systemd_analyze
@pytest.mark.parametrize("dirname", ["with space", "100% %n %h", "dollar $HOME ${X}", "ünïcødé ✓", "semi;colon&amp"])
def test_systemd_exec_path_is_found_by_systemd(tmp_path, dirname):
    d = tmp_path / dirname
    d.mkdir()
    exe = d / "launcher.sh"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    unit = tmp_path / "t.service"
    unit.write_text(f"[Service]\nExecStart={quoting.systemd_executable(str(exe))}\n")
    verify_unit(unit)  # fails with "No such file" if the quoted path decoded to anything else
    exe.unlink()
    res = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True)
    assert res.returncode != 0, "the check above must be able to fail"


@needs_systemd_analyze
@pytest.mark.parametrize("dirname", ["it's", 'say "x"', "back\\slash"])
def test_systemd_refused_exec_paths_are_refused_up_front(tmp_path, dirname):
    exe = tmp_path / dirname / "launcher.sh"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    with pytest.raises(UsageError, match="systemd refuses"):
        quoting.systemd_executable(str(exe))
    # Our rule is systemd's, not a guess: systemd itself refuses the path however it is quoted.
    escaped = str(exe).replace("\\", "\\\\").replace('"', '\\"')
    unit = tmp_path / "t.service"
    unit.write_text(f'[Service]\nExecStart="{escaped}"\n')
    res = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True)
    assert res.returncode != 0 and "special characters" in res.stderr


@needs_systemd_analyze
@pytest.mark.parametrize("name", ["a b", "-x", "a.b", "a:b", "r/x", "1234", "x" * 40, "tab\tx", ""])
def test_user_names_systemd_would_reject_or_warn_about_are_refused(tmp_path, name):
    with pytest.raises(UsageError, match="user name|dedicated"):
        quoting.unit_user(name)
    if name and "\t" not in name:
        unit = tmp_path / "t.service"
        unit.write_text(f"[Service]\nUser={name}\nExecStart=/bin/true\n")
        res = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True)
        # systemd refuses it, warns that it is not a strict name, or (all digits) reads it as a uid.
        assert res.returncode != 0 or "strict" in res.stderr or name.isdigit() or len(name) > 31


@needs_systemd_analyze
@pytest.mark.parametrize("name", ["vllm", "svc_vllm-1", "_x"])
def test_strict_user_names_verify_without_warnings(tmp_path, name):
    unit = tmp_path / "t.service"
    unit.write_text(f"[Service]\nUser={quoting.unit_user(name)}\nExecStart=/bin/true\n")
    verify_unit(unit)


def test_root_is_refused_as_service_user():
    with pytest.raises(UsageError, match="dedicated"):
        quoting.unit_user("root")


# ---- every profile, both forms, through the real tools ----

def _profile_plans():
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.recipe.selection import build_selection
    from rocm_dspark.recipe.resolve import Verdict, resolve

    catalog = load_catalog()
    for model in catalog.models.values():
        for gpu in model.profiles:
            sel = build_selection({"model": model.key, "gpu": gpu}, catalog)
            for verdict in (Verdict.not_proven("test"), Verdict(True, "test: adaptive proven")):
                yield f"{model.key}/{gpu}/{'adaptive' if verdict.adaptive_proven else 'block'}", resolve(catalog, sel, verdict)


PLANS = dict(_profile_plans())


@needs_systemd_analyze
@pytest.mark.parametrize("key", sorted(PLANS))
def test_every_profile_renders_both_forms_that_pass_shellcheck_and_systemd(tmp_path, key):
    plan = PLANS[key]
    assert plan.block_argv is not None and (plan.argv == plan.adaptive_argv) == plan.adaptive_verification
    for container in (False, True):  # an image without a published digest is pinned by the launcher at start
        out = tmp_path / ("container" if container else "host")
        out.mkdir()
        files = write_launchers(plan, out, "systemd", container=container)
        shellcheck(files.launcher)
        verify_unit(files.unit)
        script = files.launcher.read_text()
        assert ("FALLBACK_ARGV=(" in script) == ("ADAPTIVE_REFUSALS=(" in script) == plan.adaptive_verification
        assert (f"IMAGE={quoting.bash_word(plan.image)}" in script) == ("docker run" in script) == container
    shell = write_launchers(plan, tmp_path, "shell", name="shell-form").launcher
    shellcheck(shell)
    assert os.access(shell, os.X_OK)


@needs_systemd_analyze
def test_hostile_plan_values_still_give_valid_files(tmp_path):
    out = tmp_path / "out dir %n $X ü"
    out.mkdir()
    plan = make_plan(8000, model=HOSTILE[2], served=HOSTILE[4] + HOSTILE[5] + "\\",
                     env={f"E{i}": v for i, v in enumerate(HOSTILE)}, extra=tuple(HOSTILE))
    plan = plan._replace(profile="evil\nprofile %n", model_key="m\n$(x)")
    files = write_launchers(plan, out, "systemd", user="svc")
    shellcheck(files.launcher)
    verify_unit(files.unit)
    unit = files.unit.read_text()
    assert "%%n" in unit and "\nprofile" not in unit


# ---- issue 31: a launcher holds only the code its plan runs ----

def _launch_cli(tmp_path, *args) -> list[Path]:
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([*CLI, "launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--output", str(out), *args],
                          capture_output=True, text=True, env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return sorted(out.glob("*.sh"))


@pytest.mark.parametrize("args, most", [(("--container",), 250), ((), 250), (("--container", "--format", "systemd"), 280)])
def test_the_default_single_node_launcher_is_short_and_has_only_what_runs(tmp_path, args, most):
    (path,) = _launch_cli(tmp_path, *args)
    text = path.read_text()
    assert len(text.splitlines()) < most, len(text.splitlines())
    shellcheck(path)
    # Decided when it is written, not at run time: no test seams, one HTTP client, no JSON written by bash, no
    # fallback, group or refusal-memo code for a block plan, docker only in the container form.
    for absent in ("ROCM_DSPARK_HOST_ROOT", "ROCM_DSPARK_HTTP_CLIENT", "ROCM_DSPARK_CONTAINER", "/dev/tcp", "python3",
                   "json", "FALLBACK_ARGV", "adaptive-refused", "GROUP", "worker_main", "{{", "#@"):
        assert absent not in text, absent
    assert text.count("curl -s") == 1 and "PRIMARY_MODE=block" in text
    assert ("docker run" in text) == ("--container" in args)
    assert ("systemd-notify" in text) == ("systemd" in args) == ("WATCHDOG_USEC" in text)


def test_the_multi_node_protocol_is_only_in_group_launchers_with_a_fallback(tmp_path):
    plan = make_plan(8000)
    single = render_launcher(plan)
    head = render_launcher(plan, group_role="head", group_name="g")
    worker = render_launcher(plan, group_role="worker", group_name="g", ready_host="10.0.0.1", ready_port=8000)
    block_worker = render_launcher(make_plan(8000, adaptive=False), group_role="worker", group_name="g",
                                   ready_host="10.0.0.1", ready_port=8000)
    assert "GROUP" not in single and "group_publish" not in single and "worker_main" not in single
    assert "group_publish adaptive" in head and "worker_main" not in head
    assert "group_read" in worker and "BASE_URL=http://10.0.0.1:8000" in worker and "\nmain \"$@\"" not in worker
    assert "worker_main" in block_worker and "GROUP_FILE" not in block_worker and "ADAPTIVE_REFUSALS" not in block_worker
    for text in (single, head, worker, block_worker):
        p = tmp_path / "l.sh"
        p.write_text(text)
        shellcheck(p)


# ---- the unit and the env file ----

def test_unit_has_the_service_settings(tmp_path):
    files = write_launchers(make_plan(8000), tmp_path, "systemd", user="svc", ready_timeout_s=3600)
    unit = files.unit.read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert int(settings["TimeoutStartSec"]) >= 2 * 3600  # two starts with fallback
    assert settings["Type"] == "notify" and settings["NotifyAccess"] == "all"
    assert settings["Restart"] == "on-failure" and int(settings["RestartSec"]) > 0
    assert settings["KillMode"] == "mixed" and int(settings["TimeoutStopSec"]) >= 300
    assert settings["SupplementaryGroups"] == "video render" and settings["LimitMEMLOCK"] == "infinity"
    assert settings["User"] == "svc"
    assert settings["ExecStart"] == f'"/usr/local/libexec/rocm-dspark/{files.name}.sh"'
    # The node's root-owned copy (the install commands put it there), no '-': a missing file stops the start.
    assert settings["EnvironmentFile"] == f"/etc/rocm-dspark/{files.name}.env"
    assert settings["StateDirectory"] == f"rocm-dspark/{files.name}"
    assert settings["WorkingDirectory"] == f"%S/rocm-dspark/{files.name}"
    no_fallback = write_launchers(make_plan(8000, adaptive=False), tmp_path, "systemd", name="one")
    assert "TimeoutStartSec=3720" in no_fallback.unit.read_text()


def test_env_file_is_written_0600_and_an_existing_one_is_kept(tmp_path):
    files = write_launchers(make_plan(8000), tmp_path, "systemd")
    assert files.env_file_written and stat.S_IMODE(files.env_file.stat().st_mode) == 0o600
    assert "#HF_TOKEN=" in files.env_file.read_text()
    files.env_file.write_text("HF_TOKEN=hf_secret\n")
    again = write_launchers(make_plan(8000), tmp_path, "systemd")
    assert not again.env_file_written and files.env_file.read_text() == "HF_TOKEN=hf_secret\n"


def test_install_commands_install_reload_and_start(tmp_path):
    files = write_launchers(make_plan(8000), tmp_path, "systemd", user="svc")
    cmds = "\n".join(files.install_commands)
    # The launcher first goes to the fixed root-owned place the unit runs it from.
    assert files.install_commands[1] == (f"sudo install -D -m 0755 -o root -g root {files.launcher} "
                                         f"/usr/local/libexec/rocm-dspark/{files.name}.sh")
    assert f"install -D -m 0644 {files.unit} /etc/systemd/system/{files.unit.name}" in cmds
    assert f"install -D -m 0600 -o root -g root {files.env_file} /etc/rocm-dspark/{files.name}.env" in cmds
    assert "systemctl daemon-reload" in cmds and f"systemctl enable --now --no-block {files.unit.name}" in cmds


# ---- bad input: one line, exit 2, nothing written ----

def run_cli(*args):
    return subprocess.run([*CLI, "launch", "--model", "V4.1-Flash", "--gpu", "mi355x", *args],
                          capture_output=True, text=True, env=cli_env(), timeout=120)


def assert_one_line_error(proc, needle):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rocm-dspark: error: ") and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_writes_systemd_files_and_prints_install_commands(tmp_path):
    proc = run_cli("--format", "systemd", "--output", str(tmp_path), "--user", "svc")
    assert proc.returncode == 0, proc.stderr
    name = "rocm-dspark-deepseek-v4-1-flash-mi355x"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.env", f"{name}.service", f"{name}.sh"]
    assert "sudo systemctl daemon-reload" in proc.stdout and f"{name}.service" in proc.stdout
    proc = run_cli("--format", "shell", "--output", str(tmp_path), "--json", "--name", "x")
    data = json.loads(proc.stdout)
    assert data["launcher"] == str(tmp_path / "x.sh") and data["unit"] is None


@pytest.mark.parametrize("case", ["missing", "not_dir", "unwritable", "user", "loose_env", "env_in_unwritable",
                                  "shell_user", "name", "timeout"])
def test_cli_bad_input(tmp_path, case):
    out = tmp_path / "out"
    out.mkdir()
    args, needle = ["--format", "systemd", "--output", str(out)], ""
    if case == "missing":
        args[3], needle = str(tmp_path / "nope"), "does not exist"
    elif case == "not_dir":
        (tmp_path / "file").write_text("")
        args[3], needle = str(tmp_path / "file"), "not a directory"
    elif case == "unwritable":
        args[3], needle = "/proc/self", "writ"  # even root cannot create files there
    elif case == "user":
        args += ["--user", "a:b"]
        needle = "not one systemd accepts"
    elif case == "loose_env":
        env = tmp_path / "secrets.env"
        env.write_text("HF_TOKEN=hf_x\n")
        env.chmod(0o644)
        args += ["--env-file", str(env)]
        needle = "chmod 600"
    elif case == "env_in_unwritable":
        args += ["--env-file", "/proc/self/x.env"]
        needle = "cannot write"
    elif case == "shell_user":  # the shell launcher reads --env-file too, but runs as whoever starts it
        args = ["--format", "shell", "--output", str(out), "--user", "vllm"]
        needle = "--user belongs to --format systemd"
    elif case == "name":
        args += ["--name", "../evil"]
        needle = "--name"
    elif case == "timeout":
        args += ["--ready-timeout", "0"]
        needle = "positive number of seconds"
    proc = run_cli(*args)
    assert_one_line_error(proc, needle)
    assert list(out.iterdir()) == [], "something was written"
    if case == "loose_env":
        assert (tmp_path / "secrets.env").read_text() == "HF_TOKEN=hf_x\n"


def test_render_functions_need_no_files(tmp_path):
    plan = make_plan(8000)
    assert render_launcher(plan).startswith("#!/usr/bin/env bash\n")
    assert "ExecStart=\"/x/y.sh\"" in render_unit(plan, launcher_path="/x/y.sh", env_file_path="/x/y.env")
    with pytest.raises(UsageError, match="absolute"):
        render_unit(plan, launcher_path="/x/y.sh", env_file_path="rel.env")
    with pytest.raises(UsageError, match="has none"):
        render_launcher(plan._replace(image=""), container=True)
    assert "pin_image" in render_launcher(plan._replace(image="vllm/vllm-openai-rocm:nightly"), container=True)


# ---- issue 22: the hardened unit ----

@needs_systemd_analyze
@pytest.mark.parametrize("container", [False, True])
def test_unit_exposure_is_at_most_5_and_keeps_what_rocm_needs(tmp_path, container):
    from rocm_dspark.launch.launchers import EXPOSURE

    files = write_launchers(make_plan(8000), tmp_path, "systemd", user="svc", container=container)
    score = exposure(files.unit)
    assert score <= 5.0 and f"{score:.1f}" == EXPOSURE.split()[0], score  # the docs quote EXPOSURE
    unit = files.unit.read_text()
    for line in ("SupplementaryGroups=video render" + (" docker" if container else ""), "DeviceAllow=/dev/kfd rw",
                 "DeviceAllow=char-drm rw", "DevicePolicy=closed", "LimitMEMLOCK=infinity"):
        assert line + "\n" in unit, line
    assert "\nMemoryDenyWriteExecute=" not in unit  # Triton and torch JIT-compile kernels
    verify_unit(files.unit, files.launcher)
    # The check can fail: the unit before hardening (issue 22) rated 9.4 UNSAFE.
    bare = tmp_path / "bare.service"
    bare.write_text("[Service]\nExecStart=/bin/true\nUser=svc\n")
    assert exposure(bare) > 5.0


def test_container_mode_orders_and_requires_the_runtime(tmp_path):
    host = write_launchers(make_plan(8000), tmp_path, "systemd", name="h").unit.read_text()
    box = write_launchers(make_plan(8000), tmp_path, "systemd", name="c", container=True).unit.read_text()
    assert "After=network-online.target docker.service\nRequires=docker.service\n" in box
    assert "docker.service" not in host and "WatchdogSec=120\n" in host and "WatchdogSignal=SIGTERM\n" in host


def test_the_unit_never_runs_the_launcher_from_output(tmp_path):
    for out in (tmp_path / "a", tmp_path / "b"):
        out.mkdir()
        files = write_launchers(make_plan(8000), out, "systemd", name="svc")
        assert str(out) not in files.unit.read_text().split("[Service]")[1].split("EnvironmentFile=")[0]
