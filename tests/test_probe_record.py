"""Probe records: strict schema, content digest, the launch identity (their store: tests/test_store.py)."""

from __future__ import annotations

import json

import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.probe.record import SCHEMA, RecordError, content_hash, parse_record, parse_record_data
from tests.helpers.probe_records import fingerprint_dict, level, make


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


# --- the launch identity a record keeps ----------------------------------------------------------------


def test_launch_identity_of_a_command_made_outside_resolve_drops_only_where_it_listens():
    """up's local-cpu target hands the A/B record a plain argv (found by tests/slow/test_up_loads_real.py after
    the merge: launch_identity raised TypeError there); its --host/--port still do not count."""
    from types import SimpleNamespace

    from rocm_dspark.probe.fingerprint import launch_identity

    argv = ("vllm", "serve", "/m", "--host", "127.0.0.1", "--port=8001", "--max-model-len", "512", "--enforce-eager")
    plan = SimpleNamespace(adaptive_argv=None, argv=argv, env={"A": "1"}, secret_env={})
    assert launch_identity(plan) == {"argv": ["vllm", "serve", "/m", "--max-model-len", "512", "--enforce-eager"],
                                     "env": {"A": "1"}}
