"""Races and bounds (issue 22, item 7): the host key, concurrent `up` runs, integer options."""

from __future__ import annotations

import multiprocessing
import secrets
import threading

from rocm_dspark.probe import store


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
