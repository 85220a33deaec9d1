"""Every traceback and silent acceptance listed in issue #14 is now one line on stderr and exit status 2.

Run in process through the same entry point as the installed command (LazyGroup.main); one case per kind also
runs as a real child process with raw bytes in argv."""

import subprocess

import pytest

from rocm_dspark.cli import cli
from tests.conftest import CLI, cli_env
from tests.fuzz_cli import make_runner

RUNNER = make_runner()


def files(tmp_path):
    (tmp_path / "bin.dat").write_bytes(b"\x00\x01\xff\xfe")
    (tmp_path / "u16.json").write_bytes('{"verify": [[1, 2]]}'.encode("utf-16"))
    (tmp_path / "deep.json").write_text("[" * 100000)
    (tmp_path / "bigint.json").write_text('{"verify": [[' + "9" * 5000 + ", 1]]}")
    (tmp_path / "dup.json").write_text('{"verify": [[1, 2]], "verify": [[1, 3]]}')
    (tmp_path / "nan.json").write_text('{"verify": [[1, NaN]]}')
    return tmp_path


CASES = [
    (["plan", "--seed", "-1"], "-1 is not in the range"),
    (["plan", "--gpu", ","], "names no GPU profile"),
    (["plan", "--gpu", "mi300x", "--cost-table", "{t}/bin.dat"], "not UTF-8 text"),
    (["plan", "--gpu", "mi300x", "--cost-table", "{t}/u16.json"], "not UTF-8 text (it looks like UTF-16)"),
    (["plan", "--gpu", "mi300x", "--cost-table", "{t}/deep.json"], "nested too deeply"),
    (["plan", "--gpu", "mi300x", "--cost-table", "{t}/bigint.json"], "Exceeds the limit (4300 digits)"),
    (["plan", "--gpu", "mi300x", "--cost-table", "{t}/dup.json"], "duplicate key 'verify'"),
    (["plan", "--gpu", "mi300x", "--cost-table", "{t}/nan.json"], "NaN is not a JSON number"),
    (["plan", "--gpu", "mi300x", "--cost-table", "{t}"], "not a regular file"),
    (["probe", "--model", "V4.1-Flash", "--levels", "live", "--server-json", "{t}/bin.dat", "--state-dir", "{t}/s"], "not UTF-8"),
    (["probe", "--model", "V4.1-Flash", "--levels", "live", "--server-json", "{t}/deep.json", "--state-dir", "{t}/s"], "nested too deeply"),
    (["probe", "--model", "V4.1-Flash", "--levels", "live", "--server-json", "{t}/bigint.json", "--state-dir", "{t}/s"], "digits"),
    (["validate", "--model", "V4.1-Flash", "--report", "{t}/r", "--server-json", "{t}/u16.json"], "UTF-16"),
    (["recipe", "--model", "V4.1-Flash", "--state-dir", "~nosuchuser-i14/x"], "no such user"),
    (["recipe", "--model", "V4.1-Flash", "--model-path", ""], "--model-path is empty"),
    (["recipe", "--model", "V4.1-Flash", "--served-model-name", ""], "--served-model-name is empty"),
    (["recipe", "--model", "V4.1-Flash", "--vllm-arg", "--speculative_config={}"], "conflicts with what the plan decides"),
    (["recipe", "--model", "V4.1-Flash", "--vllm-arg", "--speculative-config.enable_adaptive_verification=true"], "conflicts"),
    (["recipe", "--model", "V4.1-Flash", "--gpu", "nope"], "unknown GPU 'nope'"),
    (["recipe", "--model", "V4.1-Flash", "--output-dir", "x"], "No such option"),
    (["launch", "--model", "V4.1-Flash", "--output", "{t}/" + "x" * 300], "name too long"),
    # The unit names /etc/rocm-dspark/<name>.env, not --env-file, so a backslash there no longer reaches systemd;
    # the missing directory is what is wrong here.
    (["launch", "--model", "V4.1-Flash", "--format", "systemd", "--output", "{t}", "--env-file", "{t}/e/x\\"], "does not exist"),
]


@pytest.mark.parametrize("args,needle", CASES, ids=[" ".join(a[:3]) + f" #{i}" for i, (a, _) in enumerate(CASES)])
def test_issue_14_inputs_are_one_line_exit_2(tmp_path, args, needle):
    t = files(tmp_path)
    result = RUNNER.invoke(cli, [a.replace("{t}", str(t)) for a in args])
    assert isinstance(result.exception, (SystemExit, type(None))), repr(result.exception)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("rocm-dspark: error: "), result.stderr
    assert needle.lower() in lines[0].lower(), lines[0]


@pytest.mark.parametrize("argv", [
    [b"recipe", b"--model", b"V4.1-Flash", b"--served-model-name", b"a\xffb"],
    [b"launch", b"--model", b"V4.1-Flash", b"--output", b"\xff\xfe"],
])
def test_non_utf8_bytes_in_argv_are_one_line_exit_2(tmp_path, argv):
    proc = subprocess.run([*map(str.encode, CLI), *argv], capture_output=True, env=cli_env(), cwd=tmp_path, timeout=120)
    lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "is not valid UTF-8" in lines[0], lines
    assert list(tmp_path.iterdir()) == []
