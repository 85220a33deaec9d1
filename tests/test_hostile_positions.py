"""Hostile strings through every position a user controls, end to end (issue #14, item 5).

The real CLI resolves the plan (`recipe --format json`) and writes the launcher and the unit (`launch`); the
launcher then runs for real with the stand-in `vllm` of tests/helpers/launcher_rig.py (an instrument that records
its exact argv bytes and environment). Every value must arrive byte for byte, nothing may run, the script must
pass shellcheck, and the systemd unit, as systemd itself reads it (`systemd-analyze security --offline`), must
still run as the service user. A value a position cannot carry must be refused in one line, exit 2.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from rocm_dspark.cli import cli as cli_group
from tests.conftest import CLI, cli_env
from tests.fuzz_cli import make_runner
from tests.helpers.launcher_rig import Rig, free_port, start_ready, stop_and_check

SHELLCHECK = shutil.which("shellcheck") or str(Path(os.sys.executable).with_name("shellcheck"))
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
RUNNER = make_runner()
CANARY = "/tmp/pwned-by-rocm-dspark-hostile-test"
HOSTILE = ["with space", "it's \"q\"", f"$(touch {CANARY})", f"`touch {CANARY}`", "a\nb", "100% %n %h", "ünï ✓ 模型",
           "back\\slash\\", "tab\there", "$HOME ${PATH} $'x' \\x41", "*glob*?[a]", "=", "a,b", "x=-y", "'", "\\",
           "; rm -rf /tmp/x #", "\x1b[31mred", "--speculative-config={}", "-x", "#comment", "!!", "~root"]


def text_flags(n: int) -> list[str]:
    """n `vllm serve` flags that take any text in the plan's build (recipes/vllm_parsers.yaml) and that the plan
    neither owns nor sets: positions a hostile --vllm-arg value can take."""
    from rocm_dspark.errors import UsageError
    from rocm_dspark.recipe.catalog import load_catalog, parser_facts
    from rocm_dspark.recipe.resolve import Selection, resolve
    from rocm_dspark.recipe.secret_env import SECRET_FLAGS
    from rocm_dspark.recipe.vllm_args import normalise

    planned = set(resolve(load_catalog(), Selection(model="V4.1-Flash", gpu="mi300x")).argv)
    out = []
    for flag in parser_facts("0.33.0")["kinds"]["text"]:
        try:
            ok = flag.startswith("--") and flag not in SECRET_FLAGS and flag not in planned and normalise(flag).flag == flag
        except UsageError:  # plan-owned
            ok = False
        out += [flag] if ok and not flag.endswith("config") else []
    return out[:n]


FLAGS = text_flags(len(HOSTILE))


def bundles():
    """Each run carries every hostile string somewhere: four runs cover all of them in every position."""
    n = len(HOSTILE)
    return [[HOSTILE[(i + k) % n] for k in range(n)] for i in range(0, n, 6)]


def cli(*args, env=None):
    """The real CLI in a child process (its stderr, exit status and encoding as a user sees them)."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env or cli_env(), timeout=120)


def cli_in_process(*args):
    """The same command, in process (the same LazyGroup.main), to keep the suite fast."""
    result = RUNNER.invoke(cli_group, list(args))
    assert isinstance(result.exception, (SystemExit, type(None))), result.exception
    return result


@pytest.mark.parametrize("values", bundles(), ids=lambda v: f"from-{HOSTILE.index(v[0])}")
def test_hostile_values_in_every_position_reach_vllm_literally(tmp_path, values):
    rig = Rig(tmp_path / "rig")
    port = free_port()
    model_path = "./" + values[0]                     # a path never starts with '-' (refused, tested below)
    served = values[1] if values[1].strip() and values[1].isprintable() else "x"  # a control character: refused
    # --max-num-seqs 2: a warm-up of 3 requests, not the profile's 255 (one curl each; tests/test_launchers.py
    # checks the warm-up), so the launcher reaches ready in a second.
    flags = ["--model", "V4.1-Flash", "--gpu", "mi300x", "--state-dir", str(tmp_path / "no-records"),
             "--host", "127.0.0.1", "--port", str(port), "--model-path", model_path, "--served-model-name", served,
             "--max-num-seqs", "2"]
    for i, v in enumerate(values):
        flags += ["--vllm-arg", f"{FLAGS[i]}={v}"]
        if "\n" not in v:  # an env file line cannot carry a newline: refused (test below)
            flags += ["--env", f"HOSTILE_{i}={v}"]
    recipe = cli_in_process("recipe", "--format", "json", *flags)
    assert recipe.exit_code == 0, recipe.output
    plan = json.loads(recipe.stdout)
    out = tmp_path / ("out " + values[2].replace("/", "_").replace("\n", "_")[:40])
    out.mkdir()
    launched = cli_in_process("launch", "--output", str(out), "--name", "svc", *flags)
    assert launched.exit_code == 0, launched.output
    script = out / "svc.sh"
    sc = subprocess.run([SHELLCHECK, "-S", "style", "-s", "bash", str(script)], capture_output=True, text=True)
    assert sc.returncode == 0, sc.stdout
    proc = start_ready(rig, script, port)
    assert stop_and_check(proc, rig) == 128 + signal.SIGTERM
    (rec,) = rig.records()
    assert rec["argv"][1:] == [os.fsencode(a) for a in plan["argv"][1:]]
    assert rec["argv"][2] == os.fsencode(model_path)
    for i, v in enumerate(values):
        assert os.fsencode(f"{FLAGS[i]}={v}") in rec["argv"] or (
            os.fsencode(FLAGS[i]) in rec["argv"] and os.fsencode(v) in rec["argv"]), v
        if "\n" not in v:  # through the 0600 env file, which the launcher read
            assert rec["env"][f"HOSTILE_{i}".encode()] == v.encode()
    assert not Path(CANARY).exists()


def test_an_env_value_with_a_newline_is_refused_in_one_line(tmp_path):
    r = cli_in_process("launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--output", str(tmp_path),
                       "--env", "X=a\nb")
    err = (r.stderr or "").strip().splitlines()
    assert r.exit_code == 2 and len(err) == 1 and "cannot carry" in err[0] and not list(tmp_path.iterdir())


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("value", HOSTILE)
def test_systemd_positions_keep_user_as_systemd_reads_the_unit(tmp_path, value):
    """Served name (Description=), env file path (EnvironmentFile=), output dir (ExecStart=): either refused in
    one line, or the unit, read by systemd after line continuation, still runs as the service user."""
    out = tmp_path / "out"
    out.mkdir()
    safe_dir = tmp_path / ("d " + value.replace("/", "_").replace("\n", "_").replace("\x1b", "_"))
    try:
        safe_dir.mkdir()
    except OSError:
        safe_dir = tmp_path / "d"
        safe_dir.mkdir()
    served = value if value.strip() else "x" + value
    cases = {
        "served": ["--served-model-name", served],
        "env_file": ["--env-file", str(tmp_path / "e") + value.replace("/", "_")],
        "output": ["--output", str(safe_dir)],
    }
    for where, extra in cases.items():
        args = ["launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--format", "systemd", "--name", "svc",
                "--state-dir", str(tmp_path / "none"), "--output", str(out), *extra]
        result = RUNNER.invoke(cli_group, args)  # in process: the same LazyGroup.main as the installed command
        if result.exit_code != 0:
            err = (result.stderr or "").strip().splitlines()
            assert result.exit_code == 2 and len(err) == 1 and not isinstance(result.exception, Exception) or \
                isinstance(result.exception, SystemExit), (where, result.output, result.exception)
            continue
        written = (safe_dir if where == "output" else out) / "svc.service"
        res = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=yes", "--json=short", str(written)],
                             capture_output=True, text=True, timeout=120)
        items = {i["json_field"]: i for i in json.loads(res.stdout)}
        assert items["UserOrDynamicUser"]["set"] is True, (where, value, items["UserOrDynamicUser"])


def test_the_env_file_backslash_of_issue_14_is_refused(tmp_path):
    proc = cli("launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--format", "systemd", "--output", str(tmp_path),
               "--env-file", str(tmp_path / "e" / "x\\"))
    # Since issue 28 the unit names the installed env file (/etc/rocm-dspark/<name>.env), so the path given here
    # never reaches EnvironmentFile=; what is left to refuse is its missing directory, in one line.
    assert proc.returncode == 2 and "does not exist; create it first" in proc.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag,value", [("--model-path", ""), ("--model-path", "-x"), ("--served-model-name", ""),
                                        ("--model-path", "a\udcffb")])
def test_values_a_position_cannot_carry_are_one_line_errors(tmp_path, flag, value):
    env = cli_env()
    proc = subprocess.run([*CLI, "launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--output", str(tmp_path),
                           flag, value], capture_output=True, env=env, timeout=120)
    err = proc.stderr.decode(errors="replace").strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith("rocm-dspark: error: "), err
    assert list(tmp_path.iterdir()) == []


def _exec_start_words(line: str) -> list[str]:
    """ExecStart='s words as systemd.service(5) "Command lines" reads them: split on whitespace, double quotes
    group and take C escapes, "$$" and "%%" are a literal "$" and "%" (a bare "$X" or "%n" would be expanded)."""
    words, i = [], 0
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        word = ""
        while i < len(line) and line[i] != " ":
            if line[i] == '"':
                i += 1
                while line[i] != '"':
                    if line[i] == "\\":
                        i += 1
                    word += line[i]
                    i += 1
                i += 1
            else:
                word += line[i]
                i += 1
        for pair, lit in (("$$", "$"), ("%%", "%")):
            parts = word.split(pair)
            assert all(lit not in p for p in parts), f"{word!r} would be expanded by systemd"
            word = lit.join(parts)
        words.append(word)
    return words


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("value", [v for v in HOSTILE if "\\" not in v and not any(ord(c) < 32 for c in v)])
def test_a_hostile_state_dir_reaches_the_readiness_and_canary_units_as_one_argument(tmp_path, value):
    """`up --state-dir` names the readiness server's and the canary's ExecStart= argument: systemd must read it back
    as one word, unexpanded (it was passed bare, so a space split it and a "$" was expanded), and the units must load
    without a warning. Paths a unit line cannot carry (control characters, a backslash) are refused elsewhere."""
    from rocm_dspark.launch import aux_units

    state = str(tmp_path / ("st " + value.replace("/", "_")))
    argv = ["/usr/bin/python3", "-m", "rocm_dspark", "canary", "--timeout", "300", "--state-dir", state]
    units = {**aux_units.canary_units("svc", Path(state), "nobody", argv, 900, 5),
             "svc-ready.service": aux_units.ready_unit("svc", Path(state), "nobody", argv, 8001, "/ready")}
    for file, text in units.items():
        (tmp_path / file).write_text(text)
        if file.endswith(".service"):
            line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
            assert _exec_start_words(line.removeprefix("ExecStart=")) == argv, (file, line)
    res = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", *(str(tmp_path / f) for f in units)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "quot" not in res.stderr and "escape" not in res.stderr, res.stderr
