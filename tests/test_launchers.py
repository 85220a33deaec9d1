"""Generated launcher files checked with the real tools: bash, shellcheck, systemd-analyze verify.

Quoting is checked against the real interpreters: a bash word must make bash print the exact bytes, and a
systemd ExecStart path must make `systemd-analyze verify` find the exact file. The CLI's bad-input paths
are run in a subprocess: one line on stderr, exit 2, and the output directory left as it was.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocm_dspark.errors import UsageError
from rocm_dspark.launch import launch_state, quoting
from rocm_dspark.launch.launch_facts import DOCKER_RUN_FLAGS
from rocm_dspark.launch.launchers import default_name, install_commands, render_launcher, render_unit, write_launchers
from tests.conftest import FIXTURES, cli_env
from tests.helpers import run_cli as run_cli_in_process
from tests.helpers.launcher_rig import (HOSTILE, MONO_REFUSAL, REFUSAL, SYSTEMD_ANALYZE, Rig, alive, free_port, http_status,
                                        make_plan, shellcheck, start_ready, stop_and_check, wait_until)

needs_systemd_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")


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
    from rocm_dspark.recipe.resolve import Verdict, resolve
    from rocm_dspark.recipe.selection import build_selection

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
    launchers = []
    for container in (False, True):  # an image without a published digest is pinned by the launcher at start
        out = tmp_path / ("container" if container else "host")
        out.mkdir()
        files = write_launchers(plan, out, "systemd", container=container)
        launchers.append(files.launcher)
        verify_unit(files.unit)
        script = files.launcher.read_text()
        assert ("FALLBACK_ARGV=(" in script) == ("ADAPTIVE_REFUSALS=(" in script) == plan.adaptive_verification
        assert (f"IMAGE={quoting.bash_word(plan.image)}" in script) == ("docker run" in script) == container
    shell = write_launchers(plan, tmp_path, "shell", name="shell-form").launcher
    assert os.access(shell, os.X_OK)
    shellcheck(*launchers, shell)


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
    proc = run_cli_in_process(["launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--output", str(out), *args],
                          capture_output=True, text=True, env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return sorted(out.glob("*.sh"))


# The compile cache's section (key, checks, stale keys, eviction) is about 50 of these lines, the warm-up before
# ready (warm_up, its batches, and ending its requests on a stop) about 58, the one-start lock 12, and in a container
# the stopped-leftover check 12 more.
@pytest.mark.parametrize("args, most", [(("--container",), 384), ((), 358), (("--container", "--format", "systemd"), 414)])
def test_the_default_single_node_launcher_is_short_and_has_only_what_runs(tmp_path, args, most):
    (path,) = _launch_cli(tmp_path, *args)
    text = path.read_text()
    assert len(text.splitlines()) < most, len(text.splitlines())
    shellcheck(path)
    # Decided when it is written, not at run time: no test seams, one HTTP client, no JSON written by bash (the
    # warm-up's request body is Python's, sent with its one Content-Type header), no
    # fallback, group or refusal-memo code for a block plan, docker only in the container form.
    for absent in ("ROCM_DSPARK_HOST_ROOT", "ROCM_DSPARK_HTTP_CLIENT", "ROCM_DSPARK_CONTAINER", "/dev/tcp", "python3",
                   "FALLBACK_ARGV", "adaptive-refused", "GROUP", "worker_main", "{{", "#@"):
        assert absent not in text, absent
    assert text.count("curl -s") == 1 and "PRIMARY_MODE=block" in text
    assert text.count("json") == 1 and "-H 'Content-Type: application/json'" in text
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
    paths = [tmp_path / f"{i}.sh" for i in range(4)]
    for p, text in zip(paths, (single, head, worker, block_worker)):
        p.write_text(text)
    shellcheck(*paths)


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
    return run_cli_in_process(["launch", "--model", "V4.1-Flash", "--gpu", "mi355x", *args],
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
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.env", f"{name}.grafana.json", f"{name}.prometheus.yml",
                                                          f"{name}.rules.yml", f"{name}.service", f"{name}.sh"]
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


# --- running the launchers (from test_launchers_run.py) -------------------------------------------

# Run generated launchers for real, with a stand-in `vllm` (and `docker`) on PATH.
#
# The stand-in is an instrument, not a fake of vLLM's behaviour we could observe: it records its exact argv
# (NUL-separated bytes) and environment, then either refuses the configuration the way vLLM 0.32 words it,
# dies, or runs a real HTTP server on the plan's host/port that answers /health and /v1/models (late, never,
# or at once). So the launcher's quoting, readiness wait, fallback, state file and process-group stop are all
# exercised against real processes and a real socket. Nothing here needs an AMD GPU.


def test_hostile_argv_and_env_reach_vllm_literally(rig):
    port = free_port()
    env = {f"HOSTILE_{i}": v for i, v in enumerate(HOSTILE)}
    env["VLLM_ROCM_USE_AITER"] = "1"
    plan = make_plan(port, adaptive=False, model=HOSTILE[2] + " " + HOSTILE[6],
                     served="served " + HOSTILE[4] + HOSTILE[5], env=env, extra=tuple(HOSTILE))
    proc = start_ready(rig, rig.write(plan), port)
    assert stop_and_check(proc, rig) == 128 + signal.SIGTERM
    (rec,) = rig.records()
    assert rec["argv"][1:] == [os.fsencode(a) for a in plan.argv[1:]]
    for k, v in plan.env.items():
        assert rec["env"][k.encode()] == v.encode(), k
    assert not Path("/tmp/pwned-by-launcher-test").exists()
    # The provenance file, sourced by bash, gives back the same argv and env (printf %q round trip).
    cmd_file = rig.root / "state" / "vllm_command.txt"
    dump = subprocess.run(
        ["bash", "-c", 'source "$1" >/dev/null 2>&1 || true; eval "a=($(tail -n 1 "$1"))"; printf "%s\\0" "${a[@]}"; '
                       'printf "%s\\0" "$HOSTILE_4" "$HOSTILE_7"', "_", str(cmd_file)],
        capture_output=True, check=True, env={"PATH": os.environ["PATH"]},
    ).stdout.split(b"\0")[:-1]
    n = len(plan.argv)
    assert dump[:n] == [os.fsencode(a) for a in plan.argv]
    assert dump[n:] == [HOSTILE[4].encode(), HOSTILE[7].encode()]


def test_container_mode_runs_docker_with_amd_flags_and_pinned_image(rig):
    port = free_port()
    plan = make_plan(port, adaptive=False, env={"VLLM_ROCM_USE_AITER": "1", "WEIRD": "a b $(x) %n\n"})
    script = rig.write(plan, container=True)
    proc = start_ready(rig, script, port, HF_TOKEN="hf_secret")
    assert stop_and_check(proc, rig, who="docker") == 143
    runs = [r for r in rig.records("docker") if r["argv"][1] == b"run"]
    assert len(runs) == 1
    argv = [a.decode() for a in runs[0]["argv"]]
    # The flags are rocm_dspark.launch.launch_facts' (tests/test_launch_facts.py: the same argv as `recipe --format docker`).
    assert argv[1:2 + len(DOCKER_RUN_FLAGS)] == ["run", *DOCKER_RUN_FLAGS]
    assert {"--device=/dev/kfd", "--device=/dev/dri", "--group-add=video", "--ipc=host"} <= set(DOCKER_RUN_FLAGS)
    # Each value is one argv word, byte for byte; the secret is passed by name only.
    for word in ("VLLM_ROCM_USE_AITER=1", "WEIRD=a b $(x) %n\n", "HF_TOKEN"):
        assert argv[argv.index(word) - 1] == "-e", word
    i = argv.index(plan.image)
    assert argv[i - 2:i] == ["--entrypoint", "vllm"] and argv[i + 1:] == list(plan.argv[1:])
    assert "@sha256:" in plan.image
    assert runs[0]["env"][b"HF_TOKEN"] == b"hf_secret"
    assert any(r["argv"][1] == b"stop" for r in rig.records("docker")), "docker stop was not called on SIGTERM"


def test_container_mode_pins_the_local_copy_at_first_start_never_pulls_and_records_it(rig):
    """A launcher written with a tag: its first start pins the digest this host holds (`image inspect`, no pull),
    records it in image-pinned and vllm_command.txt; a later start runs the recorded digest even when the local
    tag now points elsewhere (the stand-in docker answers `image inspect` as docker does)."""
    port = free_port()
    tag = "vllm/vllm-openai-rocm:v0.33.0"
    plan = make_plan(port, adaptive=False)._replace(image=tag)
    script = rig.write(plan, container=True)
    proc = start_ready(rig, script, port, STANDIN_DIGEST="c" * 64)
    assert stop_and_check(proc, rig, who="docker") == 143
    calls = [r["argv"][1:3] for r in rig.records("docker")]
    assert [b"image", b"inspect"] in calls and not any(c[0] == b"pull" for c in calls)
    runs = [[a.decode() for a in r["argv"]] for r in rig.records("docker") if r["argv"][1] == b"run"]
    pinned = "vllm/vllm-openai-rocm@sha256:" + "c" * 64
    assert len(runs) == 1 and pinned in runs[0] and tag not in runs[0]
    provenance = (rig.root / "state" / "vllm_command.txt").read_text()
    assert f"# image: {tag}, run as {pinned}" in provenance and pinned in provenance.splitlines()[-1]
    assert (rig.root / "state" / "image-pinned").read_text() == f"{tag}\n{pinned}\n"
    port2 = free_port()  # the same launcher again, the tag re-pulled to another digest meanwhile
    script = rig.write(make_plan(port2, adaptive=False)._replace(image=tag), container=True)
    proc = start_ready(rig, script, port2, STANDIN_DIGEST="d" * 64)
    assert stop_and_check(proc, rig, who="docker") == 143
    runs = [[a.decode() for a in r["argv"]] for r in rig.records("docker") if r["argv"][1] == b"run"]
    assert pinned in runs[-1] and not any(b"pull" == r["argv"][1] for r in rig.records("docker"))


@pytest.mark.parametrize("knobs", [{"STANDIN_NO_DIGEST": "1"}, {"STANDIN_DIGEST_REPO": "127.0.0.1:5000/other/name"}],
                         ids=["built-here", "pushed-under-another-name"])
def test_an_image_with_no_digest_of_its_repository_runs_as_its_image_id(rig, knobs):
    """The first-start pin never names `repo@<another repository's digest>` (an image no registry holds): with no
    digest of the tag's own repository it pins the image ID, which docker runs locally and never pulls."""
    port = free_port()
    tag = "rocm-dspark/vllm-cpu-test:t1"
    script = rig.write(make_plan(port, adaptive=False)._replace(image=tag), container=True)
    proc = start_ready(rig, script, port, **knobs)
    assert stop_and_check(proc, rig, who="docker") == 143
    runs = [[a.decode() for a in r["argv"]] for r in rig.records("docker") if r["argv"][1] == b"run"]
    ident = "sha256:" + "a" * 64
    assert len(runs) == 1 and ident in runs[0] and not any("@sha256:" in a for a in runs[0]), runs
    assert (rig.root / "state" / "image-pinned").read_text() == f"{tag}\n{ident}\n"
    assert not any(r["argv"][1] == b"pull" for r in rig.records("docker"))


def test_refused_adaptive_start_falls_back_to_block_and_records_why(rig):
    port = free_port()
    plan = make_plan(port, adaptive=True)
    script = rig.write(plan)
    proc = start_ready(rig, script, port, STANDIN_REFUSE_ADAPTIVE="1")
    st = rig.state()
    assert st["phase"] == "serving" and st["mode"] == "block" and st["fell_back"] is True
    first, second = st["attempts"]
    assert first["mode"] == "adaptive" and first["outcome"] == "exited_before_ready" and first["exit_status"] == 1
    assert REFUSAL in first["refusal"] and "\x1b" not in first["refusal"]
    assert "EngineCore" in first["log_tail"] and REFUSAL in first["log_tail"]
    assert second == {**second, "mode": "block", "outcome": "ready"}
    argvs = [r["argv"] for r in rig.records()]
    assert [a[1:] for a in argvs] == [[os.fsencode(x) for x in plan.argv[1:]],
                                      [os.fsencode(x) for x in plan.block_argv[1:]]]
    provenance = (rig.root / "state" / "vllm_command.txt").read_text()
    assert "block verification" in provenance and "enable_adaptive_verification\\\":false" in provenance
    assert stop_and_check(proc, rig) == 143
    assert rig.state()["phase"] == "stopped"

    # A restart does not pay for the refused start again ...
    proc = start_ready(rig, script, port, STANDIN_REFUSE_ADAPTIVE="1")
    assert len(rig.records()) == 3 and b'"enable_adaptive_verification":false' in rig.records()[-1]["argv"][-1]
    skipped = rig.state()["attempts"][0]
    assert skipped["outcome"] == "skipped_refused_before" and REFUSAL in skipped["refusal"]
    stop_and_check(proc, rig)
    # ... unless asked to.
    proc = start_ready(rig, script, port, STANDIN_REFUSE_ADAPTIVE="1", ROCM_DSPARK_RETRY_ADAPTIVE="1")
    assert [r["argv"][-1].endswith(b"true}") for r in rig.records()][-2:] == [True, False]
    stop_and_check(proc, rig)


def test_adaptive_start_that_misses_the_deadline_falls_back(rig):
    port = free_port()
    script = rig.write(make_plan(port))
    proc = start_ready(rig, script, port, ROCM_DSPARK_READY_TIMEOUT_S="2", STANDIN_HEALTH_ADAPTIVE="never",
                       STANDIN_WORKER="1")
    first = rig.state()["attempts"][0]
    assert first["outcome"] == "not_ready_by_deadline" and first["exit_status"] is None
    adaptive_pids = rig.records()[0]["pids"]
    assert len(adaptive_pids) == 2 and not any(alive(p) for p in adaptive_pids), "the timed-out start was not stopped"
    assert not (rig.root / "state" / "adaptive-refused").exists(), "a timeout must not be remembered as a refusal"
    stop_and_check(proc, rig)


def test_both_starts_failing_exits_with_vllms_status(rig):
    port = free_port()
    script = rig.write(make_plan(port))
    res = rig.run(script, STANDIN_REFUSE_ADAPTIVE="1", STANDIN_DIE_AFTER_BLOCK="0.3", STANDIN_DIE_STATUS="7")
    assert res.returncode == 7, res.stderr.decode()
    st = rig.state()
    assert st["phase"] == "failed" and [a["outcome"] for a in st["attempts"]] == ["exited_before_ready"] * 2
    assert st["attempts"][1]["exit_status"] == 7 and "dying before ready" in st["attempts"][1]["log_tail"]


MONO = ("--monokernel",)


def _without_mono(argv) -> list[bytes]:
    return [os.fsencode(a) for a in argv if a != "--monokernel"]


@pytest.mark.parametrize("adaptive", [False, True])
def test_a_monokernel_launcher_passes_shellcheck_and_a_plain_one_has_no_mono_code(tmp_path, adaptive):
    monos = []
    for fmt in ("shell", "systemd"):
        out = tmp_path / f"{fmt}-{adaptive}"
        out.mkdir()
        mono = write_launchers(make_plan(8000, adaptive=adaptive, extra=MONO), out, fmt).launcher
        monos.append(mono)
        assert "drop_monokernel" in mono.read_text() and ("ADAPTIVE_REFUSALS=(" in mono.read_text()) == adaptive
    shellcheck(*monos)
    plain = render_launcher(make_plan(8000, adaptive=adaptive))
    assert "monokernel" not in plain.lower()


def test_vllms_monokernel_refusal_starts_the_same_plan_without_it_and_says_why(rig):
    """The stand-in vllm prints vLLM 0.33.0's refusal (mono_decode.py:384) when its argv has --monokernel."""
    port = free_port()
    plan = make_plan(port, adaptive=False, extra=MONO)
    proc = start_ready(rig, rig.write(plan), port, STANDIN_REFUSE_MONO="1")
    argvs = [r["argv"][1:] for r in rig.records()]
    assert argvs == [[os.fsencode(a) for a in plan.argv[1:]], _without_mono(plan.argv[1:])]
    st = rig.state()
    assert st["phase"] == "serving" and st["mode"] == "block" and st["fell_back"] is False
    refused, ready = st["attempts"]
    assert refused["mode"] == "block" and refused["outcome"] == "refused_monokernel" and refused["exit_status"] == 1
    assert refused["refusal"] == MONO_REFUSAL and "raise ValueError" in refused["log_tail"]
    assert ready["outcome"] == "ready" and st["monokernel"] == f"off: vLLM refused it ({MONO_REFUSAL})"
    assert stop_and_check(proc, rig) == 143
    said = [ln for ln in proc.stderr.read().decode().splitlines() if "without --monokernel" in ln]
    assert said == [f"rocm-dspark[{default_name(plan)}]: starting the same plan without --monokernel: "
                    f"vLLM refused it ({MONO_REFUSAL})"]
    assert MONO_REFUSAL in (rig.root / "state" / "block-monokernel.log").read_text()
    assert MONO_REFUSAL not in (rig.root / "state" / "block.log").read_text()
    # Remembered for this command: a refused --monokernel costs one weight load, not one per restart.
    memo = (rig.root / "state" / "monokernel-refused").read_text().splitlines()
    assert len(memo) == 3 and memo[2] == MONO_REFUSAL
    before = len(rig.records())
    proc = start_ready(rig, rig.write(plan), port, STANDIN_REFUSE_MONO="1")
    assert [r["argv"][1:] for r in rig.records()[before:]] == [_without_mono(plan.argv[1:])]  # one start, no flag
    assert rig.state()["monokernel"].startswith(f"off: vLLM refused it for this exact command before ({MONO_REFUSAL}; ")
    assert [a["outcome"] for a in rig.state()["attempts"]] == ["ready"]
    stop_and_check(proc, rig)
    assert b"ROCM_DSPARK_RETRY_MONOKERNEL=1 to try it again" in proc.stderr.read()
    before = len(rig.records())
    stop_and_check(start_ready(rig, rig.write(plan), port, ROCM_DSPARK_RETRY_MONOKERNEL="1"), rig)  # the knob
    assert rig.records()[before]["argv"][1:] == [os.fsencode(a) for a in plan.argv[1:]]
    other = make_plan(port, adaptive=False, extra=(*MONO, "--max-num-seqs", "4"))  # another command: tried again
    before = len(rig.records())
    stop_and_check(start_ready(rig, rig.write(other), port), rig)
    assert b"--monokernel" in rig.records()[before]["argv"] and rig.state()["monokernel"] == "on"


@pytest.mark.parametrize("fixture, split", [("amd-smi_static_partition_text__mi300x_x8-cpx-nps4__amdgpu-docs.txt", True),
                                            ("amd-smi_static_partition_text__mi300x-vf_x2-spx__rocm7.2.4__fleet-amd-task.txt", False)])
def test_a_gpu_in_a_compute_partition_starts_without_monokernel(rig, fixture, split):
    """A stand-in amd-smi prints recorded `amd-smi static --partition` output (tests/fixtures/host/SOURCES.md)."""
    amd_smi = rig.root / "bin" / "amd-smi"
    amd_smi.write_text(f"#!/bin/sh\nexec cat {shlex.quote(str(FIXTURES / 'host' / fixture))}\n")
    amd_smi.chmod(0o755)
    port = free_port()
    plan = make_plan(port, adaptive=False, extra=MONO)
    proc = start_ready(rig, rig.write(plan), port)
    (rec,) = rig.records()
    assert rec["argv"][1:] == (_without_mono(plan.argv[1:]) if split else [os.fsencode(a) for a in plan.argv[1:]])
    assert rig.state()["monokernel"] == ("off: amd-smi static --partition reports compute partition CPX, whose GPUs "
                                         "have fewer compute units than the mono decode kernels need" if split else "on")
    stop_and_check(proc, rig)
    assert (b"without --monokernel: amd-smi static --partition reports compute partition CPX" in proc.stderr.read()) == split


def test_a_monokernel_start_that_fails_otherwise_is_not_retried(rig):
    res = rig.run(rig.write(make_plan(free_port(), adaptive=False, extra=MONO)), STANDIN_DIE_AFTER="0.2",
                  STANDIN_DIE_STATUS="5")
    assert res.returncode == 5 and len(rig.records()) == 1 and b"without --monokernel" not in res.stderr
    st = rig.state()
    assert [a["outcome"] for a in st["attempts"]] == ["exited_before_ready"] and st["monokernel"] == "on"


@pytest.mark.parametrize("order", ["mono-first", "adaptive-first"])
def test_both_refusals_end_in_block_verification_without_monokernel(rig, order):
    """vLLM may refuse --monokernel and adaptive verification in either order; each refusal is handled once."""
    port = free_port()
    plan = make_plan(port, adaptive=True, extra=MONO)
    proc = start_ready(rig, rig.write(plan), port, STANDIN_REFUSE_MONO="1", STANDIN_REFUSE_ADAPTIVE="1",
                       STANDIN_REFUSE_ORDER=order)
    primary, block = [os.fsencode(a) for a in plan.argv[1:]], [os.fsencode(a) for a in plan.block_argv[1:]]
    argvs = [r["argv"][1:] for r in rig.records()]
    st = rig.state()
    got = [(a["mode"], a["outcome"]) for a in st["attempts"]]
    if order == "mono-first":
        assert argvs == [primary, _without_mono(plan.argv[1:]), _without_mono(plan.block_argv[1:])]
        assert got == [("adaptive", "refused_monokernel"), ("adaptive", "exited_before_ready"), ("block", "ready")]
    else:
        assert argvs == [primary, block, _without_mono(plan.block_argv[1:])]
        assert got == [("adaptive", "exited_before_ready"), ("block", "refused_monokernel"), ("block", "ready")]
    assert REFUSAL in next(a["refusal"] for a in st["attempts"] if a["outcome"] == "exited_before_ready")
    assert st["fell_back"] is True and st["monokernel"].startswith("off: vLLM refused it")
    assert (rig.root / "state" / "adaptive-refused").exists()
    stop_and_check(proc, rig)


def test_plan_without_adaptive_has_one_argv_and_no_fallback(rig):
    port = free_port()
    plan = make_plan(port, adaptive=False)
    script = rig.write(plan)
    assert "FALLBACK_ARGV" not in script.read_text() and "adaptive-refused" not in script.read_text()
    res = rig.run(script, STANDIN_DIE_AFTER="0.2", STANDIN_DIE_STATUS="5")
    assert res.returncode == 5
    assert len(rig.records()) == 1
    st = rig.state()
    assert st["fell_back"] is False and [a["mode"] for a in st["attempts"]] == ["block"]


def test_ready_late_is_waited_for(rig):
    port = free_port()
    script = rig.write(make_plan(port, adaptive=False))
    t0 = time.monotonic()
    proc = start_ready(rig, script, port, STANDIN_READY_AFTER="1")
    assert time.monotonic() - t0 >= 1
    assert rig.state()["attempts"][0]["outcome"] == "ready"
    assert stop_and_check(proc, rig) == 143


@pytest.mark.parametrize("knob", ["STANDIN_HEALTH", "STANDIN_MODELS"])
def test_never_ready_misses_the_deadline_and_is_stopped(rig, knob):
    port = free_port()
    script = rig.write(make_plan(port, adaptive=False))
    t0 = time.monotonic()
    res = rig.run(script, **{knob: "never", "ROCM_DSPARK_READY_TIMEOUT_S": "2", "STANDIN_WORKER": "1"})
    assert res.returncode == 124, res.stderr.decode()
    assert 2 <= time.monotonic() - t0 < 20
    assert b"not ready within 2s" in res.stderr
    pids = rig.records()[0]["pids"]
    assert len(pids) == 2 and not any(alive(p) for p in pids)
    assert rig.state()["attempts"][0]["outcome"] == "not_ready_by_deadline"


def test_server_dying_after_ready_propagates_its_status(rig):
    port = free_port()
    script = rig.write(make_plan(port, adaptive=False))
    res = rig.run(script, STANDIN_EXIT_AFTER_READY="1.5", STANDIN_EXIT_STATUS="9")
    assert res.returncode == 9
    st = rig.state()
    assert st["phase"] == "exited" and st["ready_at"] is not None


def test_port_already_served_is_refused(rig):
    port = free_port()
    other = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: http_status(port, "/") == 200, 10)
        res = rig.run(rig.write(make_plan(port, adaptive=False)))
        assert res.returncode == 1 and b"already answers" in res.stderr
        assert rig.records() == []
    finally:
        other.terminate()
        other.wait()


# ---- one start at a time (launcher.lock), and the unit's windows ----

@pytest.mark.parametrize("container", [False, True])
def test_a_second_start_refuses_at_once_while_the_first_still_loads(rig, container):
    """Real bash and real flock: the second start exits 1 within seconds, in one line naming the first's pid (and
    container); the first keeps loading untouched. Killed with -9, the launcher's vLLM still holds the lock."""
    who = "docker" if container else "vllm"
    port = free_port()
    script = rig.write(make_plan(port, adaptive=False), container=container)
    first = rig.start(script, STANDIN_READY_AFTER="120")  # a slow weight load: nothing answers yet
    try:
        assert wait_until(lambda: any(r["pids"] for r in rig.records(who)) and rig.state().get("phase") == "starting", 20)
        before = rig.state()
        t0 = time.monotonic()
        second = rig.run(script, timeout=30)
        took = time.monotonic() - t0
        lines = second.stderr.decode().splitlines()
        assert second.returncode == 1 and took < 5, (took, lines)
        assert lines == [f"rocm-dspark[{script.stem}]: error: another start of {script.stem} is running: launcher pid "
                         f"{first.pid} holds {rig.root / 'state' / 'launcher.lock'}"
                         + (f" (its container: {script.stem})" if container else "") + "; stop it first; nothing was started"]
        assert first.poll() is None and rig.state() == before  # its state untouched, still loading
        runs = [r for r in rig.records(who) if r["pids"]]
        assert len(runs) == 1 and all(alive(p) for p in runs[0]["pids"])
        if container:  # the second start never reached docker (no rm -f of the first's container)
            assert not [r for r in rig.records("docker") if r["argv"][1] in (b"rm", b"run")][1:]
        # The launcher killed outright: its vLLM (own session) still holds the inherited lock.
        first.kill()
        first.wait(timeout=10)
        again = rig.run(script, timeout=30)
        assert again.returncode == 1 and f"a process that launcher pid {first.pid} started (it has exited)" in \
            again.stderr.decode()
    finally:
        for r in rig.records(who):
            for pid in r["pids"]:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not any(alive(p) for r in rig.records(who) for p in r["pids"]), 10)
    # Every process of that start gone, the lock is free: the next start runs.
    res = rig.run(script, STANDIN_DIE_AFTER="0")
    assert res.returncode == 3 and len([r for r in rig.records(who) if r["pids"]]) == 2, res.stderr


def test_a_running_container_of_the_name_is_refused_and_a_stopped_one_removed(rig):
    script = rig.write(make_plan(free_port(), adaptive=False), container=True)
    leftover = rig.root / "container-state"  # the stand-in docker's container of that name (launcher_rig.py)
    leftover.write_text("running")
    res = rig.run(script)
    assert res.returncode == 1 and res.stderr.decode().splitlines()[-1].endswith(
        f"error: container {script.stem} is running: another start runs it; stop it first (docker stop {script.stem}); "
        "nothing was started")
    assert [r["argv"][1:3] for r in rig.records("docker") if r["argv"][1] != b"image"] == [[b"container", b"inspect"]]
    assert leftover.read_text() == "running"
    leftover.write_text("exited")  # left by a crash: removed (docker rm, never -f), then the start goes on
    res = rig.run(script, STANDIN_DIE_AFTER="0")
    calls = [r["argv"][1:] for r in rig.records("docker") if r["argv"][1] in (b"rm", b"run")]
    assert calls[0] == [b"rm", script.stem.encode()] and calls[1][0] == b"run" and not leftover.exists(), res.stderr


def test_the_units_launcher_refuses_a_timeout_its_window_does_not_cover(rig):
    """The env file may set ROCM_DSPARK_READY_TIMEOUT_S/_STOP_TIMEOUT_S, but the unit's TimeoutStartSec/StopSec
    were written for the generation's values: above them the launcher refuses in one line (systemd would kill it)."""
    plan = make_plan(free_port())  # adaptive with a block fallback: two starts
    files = write_launchers(plan, rig.root / "out", "systemd")
    unit = files.unit.read_text()
    assert "\nTimeoutStartSec=7320\n" in unit and "\nTimeoutStopSec=330\n" in unit  # 2 x 3600 + 120; 300 + 30
    for var, value, line in (
            ("ROCM_DSPARK_READY_TIMEOUT_S", "5400", "ROCM_DSPARK_READY_TIMEOUT_S=5400 is above the 3600 s per start "
             "that the unit's TimeoutStartSec=7320 was written for, so systemd would kill the start: regenerate the "
             "unit with --ready-timeout 5400, or set at most 3600"),
            ("ROCM_DSPARK_STOP_TIMEOUT_S", "600", "ROCM_DSPARK_STOP_TIMEOUT_S=600 is above the 300 s that the unit's "
             "TimeoutStopSec=330 was written for, so systemd would kill the drain: regenerate the unit with "
             "--stop-timeout 600, or set at most 300"),
            ("ROCM_DSPARK_READY_TIMEOUT_S", "9" * 25, "is above the 3600 s per start")):  # no arithmetic overflow
        res = rig.run(files.launcher, **{var: value})
        (err,) = res.stderr.decode().splitlines()
        assert res.returncode == 1 and line in err and not rig.records(), err
    # At the window it starts; a unit regenerated with the larger timeout takes it.
    assert rig.run(files.launcher, ROCM_DSPARK_READY_TIMEOUT_S="3600", STANDIN_DIE_AFTER="0").returncode != 1
    assert len(rig.records()) == 2  # the adaptive start and its block fallback
    bigger = write_launchers(plan, rig.root / "out", "systemd", ready_timeout_s=5400, stop_timeout_s=600)
    assert "\nTimeoutStartSec=10920\n" in bigger.unit.read_text() and "\nTimeoutStopSec=630\n" in bigger.unit.read_text()
    res = rig.run(bigger.launcher, ROCM_DSPARK_READY_TIMEOUT_S="5400", ROCM_DSPARK_STOP_TIMEOUT_S="600",
                  STANDIN_DIE_AFTER="0")
    assert b"is above" not in res.stderr and len(rig.records()) == 4
    # The shell form has no unit to outlive: any timeout goes.
    shell = rig.write(make_plan(free_port(), adaptive=False))
    assert b"is above" not in rig.run(shell, ROCM_DSPARK_READY_TIMEOUT_S="9000", STANDIN_DIE_AFTER="0").stderr


@pytest.mark.parametrize("adaptive", [True, False])
def test_a_fallback_is_promised_only_where_the_launcher_has_one(tmp_path, adaptive):
    files = write_launchers(make_plan(8000, adaptive=adaptive), tmp_path, "systemd")
    launcher, unit, env = (f.read_text() for f in (files.launcher, files.unit, files.env_file))
    assert ("fallback to block verification" in unit) == adaptive == ("FALLBACK_ARGV" in launcher)
    assert ("ROCM_DSPARK_RETRY_ADAPTIVE" in env) == adaptive == ("ROCM_DSPARK_RETRY_ADAPTIVE" in launcher)
    assert ("up to 2 starts of at most 3600 s" if adaptive else "one start of at most 3600 s") in unit
    assert "#ROCM_DSPARK_READY_TIMEOUT_S=3600\n#ROCM_DSPARK_STOP_TIMEOUT_S=300\n" in env
    # A shell launcher's env file is docker --env-file syntax and holds no launcher settings (docker reads it).
    (tmp_path / "sh").mkdir()
    shell = write_launchers(make_plan(8000, adaptive=adaptive)._replace(secret_env={"K": "v"}), tmp_path / "sh",
                            container=True)
    text = shell.env_file.read_text()
    assert text.endswith("\nK=v\n") and "ROCM_DSPARK_" not in text and "docker run --env-file" in text


def test_sigint_stops_the_group_and_exits_130(rig):
    port = free_port()
    proc = start_ready(rig, rig.write(make_plan(port, adaptive=False)), port, STANDIN_WORKER="1")
    assert len(rig.records()[0]["pids"]) == 2
    assert stop_and_check(proc, rig, signal.SIGINT) == 130


def test_term_ignoring_server_is_killed_after_the_stop_timeout(rig):
    port = free_port()
    proc = start_ready(rig, rig.write(make_plan(port, adaptive=False)), port, STANDIN_IGNORE_TERM="1",
                       STANDIN_WORKER="1", ROCM_DSPARK_STOP_TIMEOUT_S="1")
    t0 = time.monotonic()
    assert stop_and_check(proc, rig) == 143
    assert time.monotonic() - t0 >= 1
    assert b"killing its process group" in proc.stderr.read()


def notify_recorder(rig: Rig) -> Path:
    """A stand-in systemd-notify on the rig's PATH: it appends `$NOTIFY_SOCKET|args` to the returned file."""
    log = rig.root / "notify.log"
    notify = rig.root / "bin" / "systemd-notify"
    notify.write_text(f'#!/bin/sh\nprintf "%s|%s\\n" "$NOTIFY_SOCKET" "$*" >> {shlex.quote(str(log))}\n')
    notify.chmod(0o755)
    return log


def test_systemd_notify_is_called_when_ready(rig):
    port = free_port()
    log = notify_recorder(rig)
    proc = start_ready(rig, rig.write(make_plan(port, adaptive=False), "systemd"), port, NOTIFY_SOCKET="/run/test.sock")
    stop_and_check(proc, rig)
    lines = log.read_text().splitlines()
    assert lines[-1] == "/run/test.sock|--ready --status=serving (block verification)"
    # vLLM itself must not inherit the socket (only the launcher reports readiness).
    assert b"NOTIFY_SOCKET" not in rig.records()[0]["env"]


# ---- issue 38: ready only once warmed (rocm_dspark/launch/warmup.py) ----

SEQS4 = ("--max-num-seqs", "4", "--max-cudagraph-capture-size", "32")


def test_ready_comes_only_after_warm_up_requests_at_the_plans_batch_sizes(rig):
    port = free_port()
    log = notify_recorder(rig)
    plan = make_plan(port, adaptive=False, extra=SEQS4)
    # Each of the 3 batches answered 0.5 s late: the warming phase lasts 1.5 s, seen by a check every 0.1 s.
    proc = rig.start(rig.write(plan, "systemd"), NOTIFY_SOCKET="/run/test.sock", STANDIN_COMPLETE_DELAY="0.5")
    try:
        # /health and /v1/models answer, the warm-up is under way: not ready yet, for the launcher and for systemd
        assert wait_until(lambda: rig.state().get("phase") == "warming", 20), proc.communicate(timeout=5)
        assert http_status(port, "/v1/models") == 200 and "--ready" not in log.read_text()
        assert wait_until(lambda: rig.state().get("phase") == "serving", 20), proc.communicate(timeout=5)
        posts = rig.posts()
        assert [p for p, _ in posts] == ["/v1/completions"] * 7  # batches of 1, 2 and 4 (max_num_seqs 4)
        assert all(b == {"model": plan.served_name, "prompt": posts[0][1]["prompt"], "max_tokens": 12, "temperature": 0,
                         "ignore_eos": True} for _, b in posts), posts[0]
        st = rig.state()
        assert "7 requests in batches of 1, 2, 4: capture sizes exercised 6, 12, 24 (a decode step of batch x (1+K=6) "\
            "tokens); max_num_seqs 4, the plan's capture size 32" in st["warmup"], st
        notes = log.read_text().splitlines()
        assert notes.index("/run/test.sock|--status=warming up (block verification)") < \
            notes.index("/run/test.sock|--ready --status=serving (block verification)")
    finally:
        code = stop_and_check(proc, rig)
    assert code == 143
    err = proc.stderr.read().decode()
    assert err.index("warmed up in ") < err.index("ready: serving"), err
    mode_log = (rig.root / "state" / "block.log").read_text()  # the same lines in the start's own log
    assert "]: warmed up in " in mode_log and "]: ready: serving " in mode_log


def test_a_failed_warm_up_request_is_one_line_and_the_start_is_not_ready(rig):
    port = free_port()
    res = rig.run(rig.write(make_plan(port, adaptive=False, extra=SEQS4)), STANDIN_COMPLETE="500", STANDIN_WORKER="1")
    err = res.stderr.decode()
    assert res.returncode == 1, err
    (line,) = [ln for ln in err.splitlines() if "warm-up request" in ln]
    assert "is not ready: warm-up request 1 (in a batch of 1) to http://127.0.0.1:" in line
    assert "/v1/completions got HTTP 500: " in line and "stand-in: warm-up refused" in line
    assert "ready: serving" not in err and len(rig.posts()) == 1  # the first failure ends it
    st = rig.state()
    assert st["phase"] == "failed" and [a["outcome"] for a in st["attempts"]] == ["warm_up_failed"]
    pids = rig.records()[0]["pids"]
    assert len(pids) == 2 and not any(alive(p) for p in pids), "vLLM was left running after a failed warm-up"


def test_an_adaptive_start_whose_warm_up_fails_falls_back_to_block(rig):
    port = free_port()
    proc = start_ready(rig, rig.write(make_plan(port, extra=SEQS4)), port, STANDIN_COMPLETE_ADAPTIVE="503")
    st = rig.state()
    assert [(a["mode"], a["outcome"]) for a in st["attempts"]] == [("adaptive", "warm_up_failed"), ("block", "ready")]
    assert not (rig.root / "state" / "adaptive-refused").exists(), "a failed warm-up is not vLLM's refusal"
    assert len(rig.posts()) == 1 + 7
    stop_and_check(proc, rig)


def test_a_warm_up_past_the_deadline_is_stopped_and_exits_124(rig):
    port = free_port()
    script = rig.write(make_plan(port, adaptive=False))
    t0 = time.monotonic()
    res = rig.run(script, ROCM_DSPARK_READY_TIMEOUT_S="3", STANDIN_COMPLETE_DELAY="30")
    err = res.stderr.decode()
    assert res.returncode == 124 and 3 <= time.monotonic() - t0 < 20, err
    assert "got no answer by the 3s deadline" in err and "ready: serving" not in err
    assert rig.state()["attempts"][0]["outcome"] == "not_ready_by_deadline"


def _curls_of(pid: int) -> list[int]:
    """The curl processes among `pid`'s descendants."""
    from rocm_dspark.runtime.process import descendants

    return [d for d in descendants(pid) if Path(f"/proc/{d}/comm").exists()
            and Path(f"/proc/{d}/comm").read_text().strip() == "curl"]


def test_a_stop_during_the_warm_up_ends_its_requests_first(rig):
    # A request in flight keeps vLLM's HTTP server waiting for its connection after the engine stopped (uvicorn's
    # "Waiting for connections to close", seen in a real container until docker's SIGKILL): a stop ends them first.
    port = free_port()
    proc = rig.start(rig.write(make_plan(port, adaptive=False, extra=SEQS4)), STANDIN_COMPLETE_DELAY="60",
                     STANDIN_DRAIN="1")
    try:
        assert wait_until(lambda: rig.state().get("phase") == "warming" and _curls_of(proc.pid), 20), \
            proc.communicate(timeout=5)
        curls = _curls_of(proc.pid)
        t0 = time.monotonic()
        code = stop_and_check(proc, rig)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 143 and time.monotonic() - t0 < 10
    assert wait_until(lambda: not any(alive(c) for c in curls), 5), "a warm-up request outlived the stop"


def test_host_checks_warn_about_numa_balancing_and_missing_kfd(rig):
    # This host's real /proc and /dev (no test seam in the launcher): the warnings follow what is there.
    res = rig.run(rig.write(make_plan(free_port(), adaptive=False)), STANDIN_DIE_AFTER="0")
    err = res.stderr.decode()
    numa = Path("/proc/sys/kernel/numa_balancing")
    on = numa.exists() and numa.read_text().strip() != "0"
    assert ("NUMA balancing is on" in err) == on and ("sysctl -w kernel.numa_balancing=0" in err) == on
    assert ("/dev/kfd does not exist" in err) == (not os.path.exists("/dev/kfd"))
    assert len(rig.records()) == 1, "a host check stopped the launch"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the launcher as another user (setpriv)")
def test_host_checks_warn_when_user_lacks_video_and_render_groups():
    # Run as nobody, with no supplementary groups, from a world-readable directory.
    root = Path(tempfile.mkdtemp(prefix="launcher-groups-"))
    try:
        os.chmod(root, 0o755)
        (root / "bin").mkdir()
        vllm = root / "bin" / "vllm"
        vllm.write_text("#!/bin/sh\necho refusing to start >&2\nexit 3\n")
        vllm.chmod(0o755)
        (root / "state").mkdir(mode=0o777)
        os.chmod(root / "state", 0o777)
        (root / "out").mkdir()
        script = write_launchers(make_plan(free_port(), adaptive=False), root / "out", "shell").launcher
        res = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(script)],
            env={"PATH": f"{root / 'bin'}:/usr/bin:/bin", "ROCM_DSPARK_LAUNCH_STATE_DIR": str(root / "state"),
                 "HOME": str(root)},
            capture_output=True, timeout=60,
        )
        err = res.stderr.decode()
        assert res.returncode == 3, err
        assert "not in the video group" in err and "not in the render group" in err
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def test_state_dir_follows_systemd_state_directory(rig):
    port = free_port()
    sd = rig.root / "systemd-state"
    sd.mkdir()
    env_extra = {"STATE_DIRECTORY": str(sd), "STANDIN_DIE_AFTER": "0"}
    env = rig.env(**env_extra)
    env.pop("ROCM_DSPARK_LAUNCH_STATE_DIR")
    subprocess.run([str(rig.write(make_plan(port, adaptive=False)))], env=env, capture_output=True, timeout=60)
    assert launch_state.read(sd)["phase"] == "failed"
    assert (sd / "vllm_command.txt").exists() and stat.S_ISREG((sd / "block.log").stat().st_mode)


def test_state_dir_defaults_under_the_project_state_root(rig):
    root = rig.root / "state-root"
    env = rig.env(ROCM_DSPARK_STATE_DIR=str(root), STANDIN_DIE_AFTER="0")
    env.pop("ROCM_DSPARK_LAUNCH_STATE_DIR")
    script = rig.write(make_plan(free_port(), adaptive=False), name="svc")
    subprocess.run([str(script)], env=env, capture_output=True, timeout=60)
    # Beside the probe records (<root>/probe), never mixed with them.
    assert launch_state.read(root / "launch" / "svc")["phase"] == "failed"


def test_host_mode_without_vllm_on_path_says_so_in_one_line(rig):
    # Issue 22: it died with `setsid: failed to execute vllm`, exit 127.
    port = free_port()
    script = rig.write(make_plan(port, adaptive=False))
    r = rig.run(script, PATH="/usr/bin:/bin")
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert ("error: vllm is not on PATH (/usr/bin:/bin): install vLLM for this user, or write the launcher with "
            "'rocm-dspark launch --container' to run the image") in err
    assert "setsid" not in err and not rig.records()


def test_watchdog_is_fed_while_vllm_answers_health_and_starves_when_it_hangs(rig):
    # Issue 22: nothing noticed a hung vLLM after ready. WatchdogSec=3 -> WATCHDOG_USEC=3000000: a poll a second.
    port = free_port()
    log = notify_recorder(rig)
    proc = start_ready(rig, rig.write(make_plan(port, adaptive=False), "systemd"), port, NOTIFY_SOCKET="/run/test.sock",
                       WATCHDOG_USEC="3000000")
    fed = lambda: log.read_text().splitlines().count("/run/test.sock|WATCHDOG=1")  # noqa: E731
    assert wait_until(lambda: fed() >= 2, 20)
    lines = log.read_text().splitlines()
    assert lines.index("/run/test.sock|--ready --status=serving (block verification)") < \
        lines.index("/run/test.sock|WATCHDOG=1")
    (server,) = rig.records()[0]["pids"][:1]
    os.kill(server, signal.SIGSTOP)  # a hung vLLM: the socket accepts, nothing answers
    try:
        # A poll whose answer was already sent lands at once; one still waiting fails at curl's 5 s and feeds
        # nothing, so 2 s settle it. A launcher that fed anyway would feed as a hung poll ends: curl's 5 s after a
        # poll that began about a second after the stop (a tick each second), so some 6 s after it; the window ends
        # at 8 s.
        time.sleep(2)
        before = fed()
        time.sleep(6)
        assert fed() == before, "the watchdog was fed while vLLM did not answer"
    finally:
        os.kill(server, signal.SIGCONT)
    assert wait_until(lambda: fed() > before, 20)  # answering again: fed again
    assert b"WATCHDOG_USEC" not in rig.records()[0]["env"]
    stop_and_check(proc, rig)


# --- per-node install (from test_multinode_install.py) --------------------------------------------

# The install commands `launch --format systemd` prints, run for real in a throwaway root, and the one rule for
# --head-address on every path.
#
# The throwaway root is a directory with a minimal /etc (root, and the video and render groups a ROCm node has)
# and a copy of this host's systemd units (sysinit.target and the others a service needs). The printed commands
# take the root as a parameter (rocm_dspark.launch.launchers.install_commands `root`); the test checks that they
# are the printed ones with the root put in front of each installed path, runs them (as root, `sudo` dropped as
# `up` drops it), and then checks what a node would have: the unit's EnvironmentFile= and ExecStart= exist,
# root-owned, and `systemd-analyze verify --root` passes on the installed unit.


needs_root_tools = pytest.mark.skipif(
    os.geteuid() != 0 or SYSTEMD_ANALYZE is None or shutil.which("useradd") is None,
    reason="needs root, useradd and systemd-analyze (install -o root and useradd --prefix)")


def throwaway_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\nvideo:x:44:\nrender:x:105:\n")
    (root / "etc/shadow").write_text("root:*:19000:0:99999:7:::\n")
    (root / "etc/gshadow").write_text("root:*::\nvideo:*::\nrender:*::\n")
    for p in ("etc/shadow", "etc/gshadow"):
        (root / p).chmod(0o600)
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    return root


def run_as_root(commands, cwd: Path) -> None:
    for c in commands:
        assert c.startswith("sudo "), c
        r = subprocess.run(["bash", "-c", c[len("sudo "):]], cwd=cwd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{c}\n{r.stdout}{r.stderr}"


def unit_value(text: str, key: str) -> str:
    return re.search(rf"^{key}=(.*)$", text, re.M).group(1).strip('"')


def check_installed(root: Path, unit_name: str, user: str) -> None:
    unit = root / "etc/systemd/system" / unit_name
    text = unit.read_text()
    env_file = unit_value(text, "EnvironmentFile")
    assert not env_file.startswith("-") and env_file.startswith("/etc/rocm-dspark/"), env_file
    for path, mode in ((env_file, 0o600), (unit_value(text, "ExecStart"), 0o755)):
        st = (root / path.lstrip("/")).stat()
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == mode, (path, oct(st.st_mode))
    assert (root / "etc/systemd/system/multi-user.target.wants" / unit_name).is_symlink()
    assert re.search(rf"^{user}:x:\d+:", (root / "etc/passwd").read_text(), re.M)
    assert re.search(rf"^render:x:105:.*\b{user}\b", (root / "etc/group").read_text(), re.M)
    r = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", f"--root={root}", f"/etc/systemd/system/{unit_name}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def rooted(printed, root: Path):
    """The printed commands with `root` in front of every installed path (what install_commands(root=) gives)."""
    out = []
    for c in printed:
        for d in ("/usr/local/libexec/", "/etc/rocm-dspark/", "/etc/systemd/system/"):
            c = c.replace(f" {d}", f" {root}{d}")
        out.append(c)
    return out


@needs_root_tools
def test_single_node_install_commands_make_a_unit_that_verifies(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    files = write_launchers(make_plan(8000), out, "systemd", user="svc", name="demo")
    root = throwaway_root(tmp_path)
    cmds = install_commands(files, "svc", root=str(root))
    printed = files.install_commands
    assert rooted(printed[1:4], root) == list(cmds[1:4])  # the copies: the printed ones, rooted
    assert printed[4:] == ("sudo systemctl daemon-reload", "sudo systemctl enable --now --no-block demo.service",
                           "journalctl -fu demo.service")
    run_as_root(cmds, tmp_path)
    check_installed(root, "demo.service", "svc")
    # A token put in the node's file survives a second install.
    node_env = root / "etc/rocm-dspark/demo.env"
    node_env.write_text("HF_TOKEN=hf_on_the_node\n")
    run_as_root(cmds, tmp_path)
    assert node_env.read_text() == "HF_TOKEN=hf_on_the_node\n"


@needs_root_tools
def test_each_node_installs_from_its_own_copied_files(tmp_path):
    gen = tmp_path / "generated"
    gen.mkdir()
    proc = run_cli_in_process(["launch", "--model", "V4.1-Flash", "--gpu", "mi355x", "--format", "systemd",
                           "--strategy", "multi_node_tp_dp", "--nodes", "2", "--head-address", "10.0.0.1",
                           "--node-addresses", "10.0.0.1,10.0.0.2", "--iface", "eth1", "--output", str(gen),
                           "--name", "grp"], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "node 1 (10.0.0.2), worker: in the directory holding its files, run:" in proc.stdout
    install = proc.stdout[proc.stdout.index("node 0 (10.0.0.1), head:"):]  # past the wrapped "wrote" lines
    printed = [ln.strip() for ln in install.splitlines() if ln.startswith("  ")]
    for node, role in ((0, "head"), (1, "worker")):
        stem = f"grp-node{node}-{role}"
        # "the node": its own directory with only its three files, and its own root.
        here = tmp_path / f"node{node}"
        here.mkdir()
        for ext in ("sh", "service", "env"):
            shutil.copy2(gen / f"{stem}.{ext}", here / f"{stem}.{ext}")
        mine = [c for c in printed if stem in c and "systemctl" not in c and "journalctl" not in c]
        assert len(mine) == 3, mine
        root = throwaway_root(here)
        cmds = [printed[0].replace("id -u vllm >/dev/null 2>&1 || useradd",
                                   f"grep -q '^vllm:' {root}/etc/passwd || useradd --prefix {root}"),
                *rooted(mine, root), f"sudo systemctl --root={root} enable {stem}.service"]
        run_as_root(cmds, here)
        check_installed(root, f"{stem}.service", "vllm")
        text = (root / f"etc/systemd/system/{stem}.service").read_text()
        assert str(gen) not in text and str(gen) not in (root / f"usr/local/libexec/rocm-dspark/{stem}.sh").read_text()


@pytest.mark.parametrize("address", ["head node", "fe80::1%$(touch x)", "http://10.0.0.1:8000"])
def test_head_address_has_one_rule_on_every_path(tmp_path, address):
    common = ["--model", "V4.1-Flash", "--gpu", "mi355x", "--nodes", "2", "--head-address", address]
    paths = {
        "legacy recipe": ["recipe", *common, "--dp", "4", "--tp", "4"],
        "legacy launch": ["launch", *common, "--dp", "4", "--tp", "4", "--output", str(tmp_path)],
        "strategy recipe": ["recipe", *common, "--strategy", "multi_node_dep"],
        "strategy launch": ["launch", *common, "--strategy", "multi_node_tp_dp", "--output", str(tmp_path)],
    }
    lines = set()
    for argv in paths.values():
        proc = run_cli_in_process(argv, capture_output=True, text=True, env=cli_env(), timeout=120, cwd=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        err = proc.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"rocm-dspark: error: --head-address {address!r}"), err
        lines.add(err[0])
    assert len(lines) == 1, lines
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, not even ./x
