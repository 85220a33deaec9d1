"""rocm_dspark.probe.store: the state directory, atomic record writes and listing, the host key, and the trust
model the README states (owner and mode checks, bounded safe reads, this host's HMAC, sane times) for the probe
and A/B record directories alike.

Gate attacks (issue #14, item 1): records the trust model must not trust, and the proofs junk must not hide.
Records are built and signed by the real code (tests/test_probe_gate.py explains the host)."""

from __future__ import annotations

import json
import multiprocessing
import os
import secrets
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.probe import gate, payoff, store
from rocm_dspark.probe.record import parse_record
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.resolve import resolve_plan
from tests.conftest import CLI, cli_env
from tests.helpers import run_cli
from tests.helpers.ab_records import decide, write_ab
from tests.helpers.probe_records import LIVE_REFUSED, SELECTION, here, make, write

CAT = load_catalog()
OTHER_UID = 65534  # nobody


def verdict(state):
    return gate.gate_verdict(CAT, resolve_plan(CAT, SELECTION), state_dir=state)


@pytest.fixture
def proven(mi300x_host):
    rid, path = write(mi300x_host, here(CAT))
    assert verdict(mi300x_host).adaptive_proven  # the baseline each attack starts from
    return mi300x_host, rid, path


@pytest.mark.parametrize("which", ["state", "probe"])
def test_world_or_group_writable_directories_are_not_trusted(proven, which):
    state, _, _ = proven
    target = state if which == "state" else state / "probe"
    for mode in (0o777, 0o757, 0o1777):
        target.chmod(mode)
        v = verdict(state)
        assert not v.adaptive_proven and "are not trusted" in v.reason and "writable by other users" in v.reason
    target.chmod(0o700)
    assert verdict(state).adaptive_proven


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory another group")
def test_group_write_is_accepted_only_for_the_owners_own_one_member_group(proven, monkeypatch):
    """OpenSSH's StrictModes rule (rocm_dspark/probe/store.py): a group write bit is fine for the owner's private
    group, and means "writable by other users" for any other group."""
    import grp
    import pwd

    state, _, _ = proven
    me = pwd.getpwuid(os.geteuid()).pw_name
    own = next((g for g in grp.getgrall() if g.gr_name == me and all(m == me for m in g.gr_mem)), None)
    other = next((g for g in grp.getgrall() if g.gr_name != me), None)
    if own is None or other is None:
        pytest.skip("this host has no private group for the user, or no other group")
    os.chown(state, -1, own.gr_gid)
    state.chmod(0o770)
    assert verdict(state).adaptive_proven
    os.chown(state, -1, other.gr_gid)
    v = verdict(state)
    assert not v.adaptive_proven and "writable by other users (mode 0770)" in v.reason
    # The owner's name, but another member in it (grp as an instrument: /etc/group is not ours to edit).
    os.chown(state, -1, own.gr_gid)
    shared = grp.struct_group((own.gr_name, own.gr_passwd, own.gr_gid, [me, "mallory"]))
    real = grp.getgrgid
    monkeypatch.setattr(grp, "getgrgid", lambda gid: shared if gid == own.gr_gid else real(gid))
    assert "writable by other users" in verdict(state).reason


def test_a_writable_non_sticky_ancestor_is_not_trusted(mi300x_host, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    write(shared / "state", here(CAT))
    assert verdict(shared / "state").adaptive_proven
    shared.chmod(0o777)
    assert "writable by other users" in verdict(shared / "state").reason
    shared.chmod(0o1777)  # sticky, like /tmp: others cannot replace what we own
    assert verdict(shared / "state").adaptive_proven


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another user")
@pytest.mark.parametrize("which", ["state", "probe", "file"])
def test_another_users_directory_or_file_is_not_trusted(proven, which):
    state, _, path = proven
    target = {"state": state, "probe": state / "probe", "file": path}[which]
    os.chown(target, OTHER_UID, -1)
    v = verdict(state)
    assert not v.adaptive_proven and f"uid {OTHER_UID}" in v.reason


def test_a_symlinked_probe_directory_is_not_trusted(proven, tmp_path):
    state, _, _ = proven
    elsewhere = tmp_path / "elsewhere"
    (state / "probe").rename(elsewhere)
    (state / "probe").symlink_to(elsewhere)
    v = verdict(state)
    assert not v.adaptive_proven and "is a symlink" in v.reason


def test_a_symlinked_record_file_is_not_trusted(proven, tmp_path):
    state, rid, path = proven
    moved = tmp_path / "real.json"
    os.rename(path, moved)
    os.symlink(moved, path)
    v = verdict(state)
    assert not v.adaptive_proven and f"{rid}.json is not trusted (a symlink)" in v.reason


def test_a_fifo_does_not_hang_recipe_or_show(proven):
    state, _, _ = proven
    os.mkfifo(state / "probe" / "x.json")
    env = cli_env(PATH=os.environ["PATH"], ROCM_PATH=os.environ["ROCM_PATH"])
    for args in (["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--vllm-version", "0.32.0"],
                 ["probe", "--show"]):
        proc = subprocess.run([*CLI, *args, "--state-dir", str(state)], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
    assert "x.json: not a valid probe record (not a regular file)" in proc.stdout
    assert verdict(state).adaptive_proven


def test_a_symlink_to_dev_zero_and_an_oversized_file_are_not_read(proven, monkeypatch):
    state, _, _ = proven
    os.symlink("/dev/zero", state / "probe" / "zero.json")
    big = state / "probe" / "big.json"
    big.write_bytes(b" " * (store.MAX_RECORD_BYTES + 1))
    big.chmod(0o644)
    reads = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    v = verdict(state)
    assert v.adaptive_proven  # the proof is still found
    assert sum(reads) <= 2 * store.MAX_RECORD_BYTES  # the record and the key, bounded; never /dev/zero


def test_newest_is_the_signed_finish_time_not_the_file_name(mi300x_host, monkeypatch):
    fp = here(CAT)
    # A proof with the largest possible id but an older finish, then a refutation that finished later.
    write(mi300x_host, fp, record_id="99991231T235959Z-ffffffff")
    import tests.helpers.probe_records as tg

    real_build = tg.build_record
    monkeypatch.setattr(tg, "build_record", lambda **kw: real_build(**{**kw, "finished_at": "2026-11-29T11:00:00Z"}))
    rid, path = write(mi300x_host, fp, levels=(tg.STATIC_OK, tg.KERNEL_OK, LIVE_REFUSED))
    v = verdict(mi300x_host)
    assert not v.adaptive_proven and v.record == path and f"record {rid}" in v.reason


def test_a_planted_record_without_this_hosts_key_is_not_trusted(proven, tmp_path):
    state, rid, path = proven
    # Someone builds a complete record with a valid digest and a far-future id, but cannot read host.key.
    data = json.loads(open(path).read())
    forged_id = "99991231T235959Z-ffffffff"
    data.update(id=forged_id, finished_at="2026-11-29T12:00:00Z", hmac="0" * 64)
    from rocm_dspark.probe.record import content_hash

    data["sha256"] = content_hash(data)
    forged = state / "probe" / f"{forged_id}.json"
    forged.write_text(json.dumps(data))
    v = verdict(state)
    assert f"record {forged_id} is not signed with this host's key" in v.reason or v.adaptive_proven
    # ... and it cannot displace a genuine newer refutation either: signed records are the only ones read.
    os.unlink(path)
    v = verdict(state)
    assert not v.adaptive_proven and f"record {forged_id} is not signed with this host's key (host.key): ignored" in v.reason


def test_a_record_from_another_host_key_is_not_trusted(proven, tmp_path):
    state, rid, _ = proven
    (state / "host.key").unlink()
    store.ensure_key(state)  # a fresh key: as if the record had been copied from another host
    v = verdict(state)
    assert not v.adaptive_proven and f"record {rid} is not signed with this host's key" in v.reason


def test_no_key_no_trust(proven):
    state, _, _ = proven
    (state / "host.key").unlink()
    v = verdict(state)
    assert not v.adaptive_proven and "no usable host key" in v.reason
    store.ensure_key(state)
    (state / "host.key").chmod(0o644)  # a key others can read is no key
    assert "no usable host key" in verdict(state).reason


def test_the_key_is_created_0600_exclusively(tmp_path):
    key = store.ensure_key(tmp_path)
    assert len(key) == 32 and stat.S_IMODE((tmp_path / "host.key").stat().st_mode) == 0o600
    assert store.ensure_key(tmp_path) == key
    (tmp_path / "host.key").chmod(0o640)
    with pytest.raises(UsageError, match="not a usable host key"):
        store.ensure_key(tmp_path)


def test_a_finish_time_the_file_contradicts_is_not_trusted(proven):
    state, rid, path = proven
    old = time.mktime((2026, 11, 1, 0, 0, 0, 0, 0, -1))
    os.utime(path, (old, old))  # written (mtime) a month before it claims to have finished
    v = verdict(state)
    assert not v.adaptive_proven and f"record {rid} is not trusted: it claims to finish at 2026-11-29T10:30:00Z, after its file" in v.reason
    assert store.time_problem("2999-01-01T00:00:00Z", time.time()).endswith("in the future")


def test_junk_cannot_push_a_proof_out(proven):
    state, _, _ = proven
    for n in range(300):
        junk = state / "probe" / f"99999999T{n:06d}Z-junk.json"
        junk.write_text("{" * 50)
    v = verdict(state)
    assert v.adaptive_proven


def test_records_over_the_byte_budget_prove_nothing(proven, monkeypatch):
    state, _, _ = proven
    monkeypatch.setattr(store, "MAX_TOTAL_BYTES", 10)
    v = verdict(state)
    assert not v.adaptive_proven and "move old ones away" in v.reason


def test_writing_refuses_a_directory_where_records_would_not_count(tmp_path):
    state = tmp_path / "state"
    (state / "probe").mkdir(parents=True)
    state.chmod(0o777)
    with pytest.raises(UsageError, match="refusing to write records where they would not be trusted"):
        store.write_record(state / "probe", {"id": "x"})
    assert not (state / "probe" / "x.json").exists() and not (state / "host.key").exists()


def test_new_state_directories_are_private(tmp_path):
    store.prepare_dir(tmp_path / "new" / "probe")
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "new" / "probe").stat().st_mode) == 0o700


def test_a_state_dir_of_an_unknown_user_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="no such user"):
        store.state_dir("~nosuchuser-i14/x")
    proc = run_cli(["probe", "--show", "--state-dir", "~nosuchuser-i14/x"], capture_output=True,
                          text=True, env=cli_env())
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_a_name_over_255_bytes_is_one_line(tmp_path):
    proc = run_cli(["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--state-dir",
                           str(tmp_path / ("x" * 300))], capture_output=True, text=True, env=cli_env())
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "name too long" in proc.stderr.lower()


def test_the_fast_path_is_one_listing(tmp_path, monkeypatch):
    calls = []
    for name in ("stat", "lstat", "open"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k))
    (tmp_path / "probe").mkdir()
    v = verdict(tmp_path)
    assert v[:3] == (False, f"no probe record in {tmp_path / 'probe'}", None) and calls == []


def test_ab_records_are_read_by_the_same_rules(tmp_path):
    """A FIFO or a /dev/zero link among the A/B records (validate --ab) neither hangs nor floods the gate."""
    from rocm_dspark.probe import payoff

    ab = tmp_path / "ab"
    ab.mkdir(parents=True)
    store.ensure_key(tmp_path)  # with no key nothing is read at all (tests/test_gate_payoff.py)
    os.mkfifo(ab / "x.json")
    os.symlink("/dev/zero", ab / "zero.json")
    decided, notes = payoff.from_ab_records(CAT, resolve_plan(CAT, SELECTION), 16, tmp_path, current={})
    assert decided is None
    assert any("x.json is not trusted (not a regular file)" in n for n in notes)
    assert any("zero.json is not trusted (a symlink)" in n for n in notes)
    tmp_path.chmod(0o777)
    decided, notes = payoff.from_ab_records(CAT, resolve_plan(CAT, SELECTION), 16, tmp_path, current={})
    assert decided is None and "are not trusted" in notes[0]


# --- the store: state directory, atomic writes, listing, ids (from test_probe_record.py) ----------


def test_state_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(store.ENV_VAR, raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert store.state_dir() == tmp_path / "home" / ".local" / "state" / "rocm-dspark"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")  # the XDG spec: relative paths are invalid
    assert store.state_dir() == tmp_path / "home" / ".local" / "state" / "rocm-dspark"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert store.state_dir() == tmp_path / "xdg" / "rocm-dspark"
    monkeypatch.setenv(store.ENV_VAR, str(tmp_path / "env"))
    assert store.state_dir() == tmp_path / "env"
    assert store.state_dir(tmp_path / "flag") == tmp_path / "flag"
    assert store.records_dir(tmp_path / "flag") == tmp_path / "flag" / "probe"


def test_write_is_atomic_and_listing_is_newest_first(tmp_path):
    directory = tmp_path / "probe"
    assert store.record_names(directory) == []  # missing directory: no records, no error
    for rid in ("20261129T100000Z-0000000a", "20261130T090000Z-0000000b", "20261129T120000Z-0000000c"):
        store.write_record(directory, make(record_id=rid))
    (directory / ".20261201T000000Z-0000000d.json.123.tmp").write_text("{")  # a write in progress
    (directory / "notes.txt").write_text("operator notes")
    names = store.record_names(directory)
    assert names == ["20261130T090000Z-0000000b.json", "20261129T120000Z-0000000c.json",
                     "20261129T100000Z-0000000a.json"]
    assert parse_record((directory / names[0]).read_text()).id == "20261130T090000Z-0000000b"


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    directory = tmp_path / "probe"
    old = store.write_record(directory, make())
    before = old.read_text()

    def broken_fsync(*args, **kwargs):  # the disk fills up after the temp file was created
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("rocm_dspark.atomic.os.fsync", broken_fsync)
    with pytest.raises(UsageError, match="cannot write the record to .* No space left on device"):
        store.write_record(directory, make())  # same id: would replace the old file
    assert old.read_text() == before
    assert sorted(os.listdir(directory)) == [old.name]


def test_unwritable_state_dir_is_a_one_line_usage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(UsageError) as info:
        store.write_record(blocker / "probe", make())
    assert "pass --state-dir" in str(info.value) and "\n" not in str(info.value)


def test_record_ids_sort_by_time():
    from datetime import datetime, timezone

    a = store.new_record_id(datetime(2026, 11, 29, 10, 0, 0, tzinfo=timezone.utc))
    b = store.new_record_id(datetime(2026, 11, 29, 10, 0, 1, tzinfo=timezone.utc))
    assert a.startswith("20261129T100000Z-") and a < b
    assert Path(f"{a}.json").stem == a


# --- the host key under races (from test_races_bounds.py) -----------------------------------------


def test_host_key_two_first_probes_race_to_one_complete_key(tmp_path, monkeypatch):
    """The first probe is held between creating its key and writing it; a second first probe must not see a
    half-written key ("exists but is not a usable host key") and both must end with the same key."""
    tmp_path.chmod(0o700)
    real = secrets.token_hex
    first_in, release = threading.Event(), threading.Event()
    calls = []

    def slow_token(n):
        calls.append(n)
        if len(calls) == 1:
            first_in.set()
            release.wait(10)
        return real(n)

    monkeypatch.setattr(secrets, "token_hex", slow_token)
    got, errors = {}, []

    def first():
        try:
            got["a"] = store.ensure_key(tmp_path)
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    t = threading.Thread(target=first)
    t.start()
    assert first_in.wait(10)
    try:
        got["b"] = store.ensure_key(tmp_path)
    except Exception as exc:  # noqa: BLE001
        errors.append(exc)
    finally:
        release.set()
        t.join(10)
    assert not errors, errors
    assert got["a"] == got["b"] == store.read_key(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [store.KEY_FILE]  # no temp file left


def _make_key(path, barrier, queue):
    barrier.wait(10)
    try:
        queue.put(store.ensure_key(path).hex())
    except Exception as exc:  # noqa: BLE001
        queue.put(f"error: {exc}")


def test_host_key_many_processes_at_once(tmp_path):
    tmp_path.chmod(0o700)
    ctx = multiprocessing.get_context("fork")
    n = 6
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_make_key, args=(tmp_path, barrier, queue)) for _ in range(n)]
    for p in procs:
        p.start()
    keys = [queue.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
    assert len(set(keys)) == 1 and not keys[0].startswith("error"), keys


# --- the A/B record directory by the same rules (from test_state_trust.py) ------------------------


def test_a_signed_ab_record_in_a_world_writable_ab_dir_does_not_count(tmp_path, fp):
    tmp_path.chmod(0o700)
    write_ab(tmp_path, fp, block=1000, adaptive=1100)
    assert decide(tmp_path, fp).state == payoff.PAYS
    (tmp_path / "ab").chmod(0o777)
    d = decide(tmp_path, fp)
    assert d.state != payoff.PAYS and d.evidence == "prediction"
    assert "are not trusted" in d.text and "mode 0777" in d.text and "chmod go-w" in d.text


def test_a_symlinked_ab_dir_is_ignored_with_a_note_not_an_error(tmp_path, fp):
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    write_ab(real, fp, block=1000, adaptive=1100)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "ab").symlink_to(real / "ab")
    d = decide(state, fp)  # was: UsageError "cannot read the probe record directory ... symlink"
    assert d.evidence == "prediction" and "is a symlink" in d.text


def test_a_record_from_another_host_sharing_the_state_dir_does_not_count(tmp_path, fp):
    """NFS/PVC: one state dir (one host.key) seen by two hosts; host B's A/B record must not decide on host A."""
    write_ab(tmp_path, dict(fp, host_id="machine-otherhost0000000"), block=1000, adaptive=1100)
    d = decide(tmp_path, fp)
    assert d.evidence == "prediction" and "host machine-otherhost0000000" in d.text


@pytest.mark.parametrize("sub", ["probe", "ab"])
def test_both_record_dirs_follow_the_same_directory_rules(tmp_path, sub):
    from rocm_dspark.probe import store

    tmp_path.chmod(0o700)
    (tmp_path / sub).mkdir(mode=0o777)
    (tmp_path / sub).chmod(0o777)
    assert "mode 0777" in store.untrusted_reason(tmp_path, sub)
    with pytest.raises(Exception, match="would not be trusted"):
        store.prepare_dir(tmp_path / sub)
