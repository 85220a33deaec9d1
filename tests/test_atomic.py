"""Writes never surprise (issue #14, item 3): only nothing or a regular file at the named path is replaced, with
an explicit mode; a directory, symlink, FIFO or device there is refused in one line and left as it was."""

import os
import stat
import subprocess

import pytest

from rocm_dspark.atomic import write_atomic, write_files_atomic
from rocm_dspark.errors import UsageError
from tests.conftest import CLI, cli_env
from tests.helpers import run_cli


def test_a_new_file_and_a_regular_file_are_written_with_the_mode(tmp_path):
    p = tmp_path / "f"
    write_atomic(p, "one", 0o600)
    assert p.read_text() == "one" and stat.S_IMODE(p.stat().st_mode) == 0o600
    write_atomic(p, b"two", 0o644)
    assert p.read_bytes() == b"two" and stat.S_IMODE(p.stat().st_mode) == 0o644
    assert [x.name for x in tmp_path.iterdir()] == ["f"]


def _targets(tmp_path):
    real = tmp_path / "real"
    real.write_text("keep")
    (tmp_path / "dir").mkdir()
    os.symlink(real, tmp_path / "link")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    os.mkfifo(tmp_path / "fifo")
    out = {"dir": "is a directory", "link": "is a symlink", "dangling": "is a symlink",
           "fifo": "not a regular file"}
    if os.geteuid() == 0:  # a character device like /dev/null, made inside the temp dir
        os.mknod(tmp_path / "chardev", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        out["chardev"] = "not a regular file"
    return out


def test_non_regular_targets_are_refused_and_left_alone(tmp_path):
    for name, why in _targets(tmp_path).items():
        target = tmp_path / name
        before = os.lstat(target)
        with pytest.raises(UsageError, match=why):
            write_atomic(target, "x", 0o644)
        after = os.lstat(target)
        assert (before.st_mode, before.st_ino) == (after.st_mode, after.st_ino), name
    assert (tmp_path / "real").read_text() == "keep"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a temp file was left"


def test_one_bad_target_writes_nothing_at_all(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(UsageError):
        write_files_atomic([(tmp_path / "a", "a", 0o644), (tmp_path / "dir", "b", 0o644)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]


def test_text_that_is_not_utf8_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="not UTF-8"):
        write_atomic(tmp_path / "f", "a\udcffb", 0o644)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_folder_and_a_bad_mode(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        write_atomic(tmp_path / "no" / "f", "x", 0o644)
    with pytest.raises(ValueError):
        write_atomic(tmp_path / "f", "x", 0o100644)


@pytest.mark.parametrize("name,why", [("dir", "is a directory"), ("link", "is a symlink"), ("fifo", "not a regular file"),
                                      (".", "is a directory")])
def test_plan_plot_refuses_what_it_must_not_replace(tmp_path, name, why):
    targets = _targets(tmp_path)
    assert name == "." or name in targets
    args = ["plan", "--gpu", "mi300x", "--concurrency", "1", "--plot", str(tmp_path / name)]
    if name == "fifo":  # a child, so that a write that blocks on the FIFO fails at the timeout, not hangs the suite
        proc = subprocess.run([*CLI, *args], capture_output=True, text=True, env=cli_env(), timeout=300)
    else:
        proc = run_cli(args, env=cli_env())
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and why in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "real").read_text() == "keep" and not (tmp_path / "fifo").is_file()


def test_a_path_component_over_255_bytes_is_one_line(tmp_path):
    proc = run_cli(["launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--output", str(tmp_path / ("x" * 300))],
                   env=cli_env())
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "name too long" in lines[0].lower(), proc.stderr
