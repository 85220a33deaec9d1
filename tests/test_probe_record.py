"""Probe records and their store: strict schema, content digest, atomic writes, state directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.probe import store
from rocm_dspark.probe.fingerprint import FIELDS
from rocm_dspark.probe.record import (
    SCHEMA, LevelResult, RecordError, build_record, content_hash, parse_record, parse_record_data,
)


def fingerprint_dict(**changes) -> dict:
    fp = {key: None for key, _ in FIELDS}
    fp.update(toolkit_version="0.1.0", vllm_version="0.32.0", torch_version="2.13.0+cpu", gpu_count=0,
              model_id="deepseek-ai/DeepSeek-V4.1-Flash", model_revision="dba1be0", gpu="mi300x", plan_vllm="0.32.0",
              image="vllm/vllm-openai-rocm@sha256:00", tp=8, dp=1, ep=1, nodes=1, num_speculative_tokens=5,
              max_num_seqs=128, launch={"argv": ["vllm", "serve", "x"], "env": {"A": "1"}})
    fp.update(changes)
    return fp


def level(name="static", passed=True, **evidence) -> LevelResult:
    return LevelResult(name, passed, False, "why", "not valid for gating: test", "2026-11-29T10:00:00Z", 1.5, evidence)


def make(levels=(), requested=("static",), **changes) -> dict:
    args = dict(record_id="20261129T100000Z-0123abcd", created_at="2026-11-29T10:00:00Z",
                finished_at="2026-11-29T10:00:02Z", toolkit_version="0.1.0", host={"hostname": "h", "platform": "p"},
                selection={"model": "V4.1-Flash"}, fingerprint=fingerprint_dict(), levels_requested=requested,
                levels=list(levels) or [level()], live_override=None)
    args.update(changes)
    return build_record(**args)


def reseal(data: dict) -> str:
    """Re-compute the digest after an edit: what a careful forger would do (schema errors must still show)."""
    data = dict(data)
    data["sha256"] = content_hash(data)
    return json.dumps(data)


def test_round_trip_keeps_everything():
    data = make(levels=[level("static", checks=[{"name": "x", "passed": True}])])
    record = parse_record(json.dumps(data))
    assert record.id == "20261129T100000Z-0123abcd" and data["schema"] == SCHEMA
    assert record.level("static").evidence == {"checks": [{"name": "x", "passed": True}]}
    assert record.level("kernel") is None
    assert record.fingerprint == fingerprint_dict()


def test_digest_covers_every_value():
    data = make(levels=[level("static", passed=False)])
    assert data["sha256"] == content_hash(data)
    edited = json.loads(json.dumps(data))
    edited["levels"][0]["passed"] = True  # a hand-edited pass
    with pytest.raises(RecordError, match="content hash does not match"):
        parse_record(json.dumps(edited))
    edited = json.loads(json.dumps(data))
    edited["fingerprint"]["gpu_count"] = 8
    with pytest.raises(RecordError, match="content hash"):
        parse_record(json.dumps(edited))


def test_truncated_and_non_json_files_are_refused():
    text = json.dumps(make())
    for bad in (text[: len(text) // 2], "", "[1, 2", "NaN"):
        with pytest.raises(RecordError, match="not valid JSON"):
            parse_record(bad)
    with pytest.raises(RecordError, match="not a JSON object"):
        parse_record("[]")


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.pop("live_override"), "lacks live_override"),
    (lambda d: d.update(extra=1), "unexpected extra"),
    (lambda d: d.update(schema="rocm-dspark/probe-record/0"), "schema is"),
    (lambda d: d.update(id="latest"), "is not <UTC time>"),
    (lambda d: d["fingerprint"].pop("vllm_commit"), "fingerprint lacks vllm_commit"),
    (lambda d: d["fingerprint"].update(gpu_count=True), "gpu_count has the wrong type"),
    (lambda d: d["fingerprint"].update(tp="8"), "tp has the wrong type"),
    (lambda d: d["fingerprint"].update(launch={"argv": "vllm serve", "env": {}}), "fingerprint.launch"),
    (lambda d: d.update(levels_requested=["static", "warp"]), "levels_requested"),
    (lambda d: d.update(levels_requested=[]), "levels_requested"),
    (lambda d: d["levels"][0].update(passed="yes"), "passed has the wrong type"),
    (lambda d: d["levels"][0].pop("evidence"), "lacks evidence"),
    (lambda d: d["levels"][0].update(name="live"), "not requested"),
    (lambda d: d["levels"].append(dict(d["levels"][0])), "appears twice"),
    (lambda d: d.update(levels=[1]), "not an object"),
])
def test_schema_violations_are_refused_even_with_a_valid_digest(edit, message):
    data = json.loads(json.dumps(make()))
    edit(data)
    with pytest.raises(RecordError, match=message):
        parse_record(reseal(data))


def test_build_refuses_what_it_could_not_read_back():
    with pytest.raises(UsageError, match="fails its schema"):
        make(levels=[level("kernel")])  # kernel was not requested
    with pytest.raises(UsageError, match="not JSON-serialisable"):
        make(levels=[level("static", value=float("nan"))])


def test_parse_record_data_accepts_the_built_dict():
    assert parse_record_data(make()).levels[0].name == "static"


# --- store -----------------------------------------------------------------------------------------


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
    assert store.record_files(directory) == []  # missing directory: no records, no error
    for rid in ("20261129T100000Z-0000000a", "20261130T090000Z-0000000b", "20261129T120000Z-0000000c"):
        store.write_record(directory, make(record_id=rid))
    (directory / ".20261201T000000Z-0000000d.json.123.tmp").write_text("{")  # a write in progress
    (directory / "notes.txt").write_text("operator notes")
    names = [p.name for p in store.record_files(directory)]
    assert names == ["20261130T090000Z-0000000b.json", "20261129T120000Z-0000000c.json",
                     "20261129T100000Z-0000000a.json"]
    assert [p.name for p in store.record_files(directory, limit=1)] == names[:1]
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


def test_launch_identity_of_a_command_made_outside_resolve_drops_only_where_it_listens():
    """up's local-cpu target hands the A/B record a plain argv (found by tests/slow/test_up_loads_real.py after
    the merge: launch_identity raised TypeError there); its --host/--port still do not count."""
    from types import SimpleNamespace

    from rocm_dspark.probe.fingerprint import launch_identity

    argv = ("vllm", "serve", "/m", "--host", "127.0.0.1", "--port=8001", "--max-model-len", "512", "--enforce-eager")
    plan = SimpleNamespace(adaptive_argv=None, argv=argv, env={"A": "1"}, secret_env={})
    assert launch_identity(plan) == {"argv": ["vllm", "serve", "/m", "--max-model-len", "512", "--enforce-eager"],
                                     "env": {"A": "1"}}
