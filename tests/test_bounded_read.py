"""One bounded read (rocm_dspark.inputs.read_regular) under every file reader: a symlink (where the reader does not
follow), a FIFO (opened without blocking, so it cannot hang the command) and an oversized file are refused by
each caller in its own terms, and never read past the bound."""

import os

import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.inputs import GREW, NOT_REGULAR, SYMLINK, TOO_LARGE, NotRead, read_regular, read_text
from rocm_dspark.launch import launch_state
from rocm_dspark.probe import store
from rocm_dspark.service import trust


@pytest.fixture
def files(tmp_path):
    """ok (a small regular file), link (a symlink to it), fifo, big (over every limit used below)."""
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    (d / "ok").write_bytes(b"a" * 64)
    os.symlink(d / "ok", d / "link")
    os.mkfifo(d / "fifo")
    (d / "big").write_bytes(b"b" * 4096 + b"END")
    for name in ("ok", "big"):
        os.chmod(d / name, 0o600)
    return d


def test_the_primitive_refuses_by_kind(files):
    assert read_regular(files / "ok", 64)[0] == b"a" * 64
    assert read_regular(files / "link", 64)[0] == b"a" * 64  # follow=True: a user's path may be a symlink
    for name, kw, kind in (("link", {"follow": False}, SYMLINK), ("fifo", {}, NOT_REGULAR), ("big", {}, TOO_LARGE)):
        with pytest.raises(NotRead) as exc:
            read_regular(files / name, 1024, **kw)
        assert exc.value.kind == kind, name
    with pytest.raises(NotRead) as exc:
        read_regular(files / "ok", 64, check=lambda st: "refused by the caller")
    assert str(exc.value) == "refused by the caller" and exc.value.st is not None
    assert read_regular(files / "big", 3, tail=True)[0] == b"END"
    with pytest.raises(FileNotFoundError):
        read_regular(files / "absent", 64)
    assert GREW != TOO_LARGE


def test_the_grow_check_bounds_a_file_that_grows_while_read(files, monkeypatch):
    real = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result((*real(fd)[:6], 10, *real(fd)[7:])))  # says 10 bytes
    with pytest.raises(NotRead) as exc:
        read_regular(files / "big", 1024)
    assert exc.value.kind == GREW


def test_read_text_names_the_file_and_why(files):
    assert read_text(files / "link", "cost table") == "a" * 64
    with pytest.raises(UsageError, match="cost table .*fifo: not a regular file"):
        read_text(files / "fifo", "cost table")
    with pytest.raises(UsageError, match="big: larger than 0 MiB"):
        read_text(files / "big", "cost table", max_bytes=1024)
    with pytest.raises(UsageError, match="absent: no such file"):
        read_text(files / "absent", "cost table")


def test_the_up_state_reader_refuses_each(files):
    assert trust.read_bounded(files / "ok") == b"a" * 64 and trust.read_bounded(files / "absent") is None
    for name, why in (("link", "is a symlink"), ("fifo", "is not a regular file"), ("big", "is larger than 1024 bytes")):
        with pytest.raises(UsageError, match=f"state file .*{name} {why}"):
            trust.read_bounded(files / name, limit=1024)
    os.chmod(files / "ok", 0o666)
    with pytest.raises(UsageError, match="is writable by other users"):
        trust.read_bounded(files / "ok")


def test_the_probe_store_refuses_each_candidate(files, monkeypatch):
    monkeypatch.setattr(store, "MAX_RECORD_BYTES", 1024)
    got, over = store.read_candidates(files, ["ok", "link", "fifo", "big", "absent"])
    assert over is None
    assert [(c.name, c.error) for c in got] == [("ok", None), ("link", "a symlink"), ("fifo", "not a regular file"),
                                                ("big", "larger than 1024 bytes"),
                                                ("absent", "No such file or directory")]
    assert got[0].data == b"a" * 64 and got[3].mtime > 0 and got[1].mtime == got[2].mtime == 0.0
    monkeypatch.setattr(store, "MAX_TOTAL_BYTES", 100)
    got, over = store.read_candidates(files, ["ok", "ok"])
    assert len(got) == 1 and "hold more than" in over


def test_the_host_key_reader_answers_none_for_each(files):
    key = files / store.KEY_FILE
    key.write_text("ab" * 32)
    key.chmod(0o600)
    assert store.read_key(files) == bytes.fromhex("ab" * 32)
    for make in (lambda: os.symlink(files / "ok", key), lambda: os.mkfifo(key),
                 lambda: (key.write_text("ab" * 33), key.chmod(0o600))):
        key.unlink()
        make()
        assert store.read_key(files) is None


def test_the_launch_state_tail_answers_none_or_the_tail(files):
    assert launch_state._tail(files / "ok") == "a" * 64
    assert launch_state._tail(files / "link") is None and launch_state._tail(files / "fifo") is None
    assert launch_state._tail(files / "big", 3) == "END"  # oversized: its last bytes, never more
