"""One record-parse preamble (record.check_preamble) and one strict JSON reader (inputs.parse_json), for every
record kind: each reader x {NaN, duplicate key, truncated, wrong kind, bad digest} is refused in one line.

The files are written and signed by the real code (store.write_record); the hostile ones are re-signed with this
host's key where that matters, so what refuses them is the parse, not a missing signature."""

from __future__ import annotations

import json

import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.inputs import JSONInputError, parse_json
from rocm_dspark.probe import ab_record, store
from rocm_dspark.probe import calibration_record as calibration
from rocm_dspark.probe import record as probe_record
from rocm_dspark.probe.record import RecordError, content_hash
from tests.helpers.ab_records import write_ab
from tests.helpers.probe_records import fingerprint_dict, make

CALIBRATION_ID = "20261201T020000Z-0000cafe"


def _probe(state):
    path = store.write_record(store.records_dir(state), make())
    return path, lambda: store.load_signed(store.records_dir(state), store.record_names(store.records_dir(state)),
                                           probe_record.parse_record_data, kind="probe record", label="record")


def _ab(state):
    _, path = write_ab(state, fingerprint_dict())
    return path, lambda: ab_record.load(state)


def _calibration(state):
    data = {"schema": calibration.SCHEMA, "id": CALIBRATION_ID, "created_at": "2026-12-01T02:00:00Z",
            "finished_at": "2026-12-01T02:00:00Z", "model": "V4.1-Flash", "gpu": "mi300x", "tp": 8,
            "source_file": "t.csv", "points": [], "params": {}, "acceptance_length": 3.2, "loo_error_pct": 1.0,
            "payoff_error_pp": 2.0, "payoff": {}, "not_identified": []}
    data["sha256"] = content_hash(data)
    path = calibration.write(state, data)
    target = calibration.directory(state)
    return path, lambda: store.load_signed(target, store.record_names(target), calibration.parse_data,
                                           kind="host calibration", label="calibration")


KINDS = {"probe record": _probe, "A/B record": _ab, "host calibration": _calibration}
OTHER_SCHEMA = {"probe record": ab_record.SCHEMA, "A/B record": calibration.SCHEMA,
                "host calibration": probe_record.SCHEMA}


def _resigned(state, data: dict) -> str:
    key = store.read_key(state)
    assert key is not None
    return json.dumps(dict(data, hmac=store.signature(data, key)))


def _hostile(name: str, kind: str, text: str, state) -> str:
    data = json.loads(text)
    if name == "NaN":  # a value Python's json writes by default but JSON has not
        return text.replace(f'"id": "{data["id"]}"', f'"id": "{data["id"]}", "spare": NaN', 1)
    if name == "duplicate key":  # the same id twice: a last-wins reader would accept it
        return text[: text.rindex("}")] + f', "id": "{data["id"]}"}}'
    if name == "truncated":
        return text[: len(text) // 2]
    body = {k: v for k, v in data.items() if k != "hmac"}
    if name == "wrong kind":
        body["schema"] = OTHER_SCHEMA[kind]
        body["sha256"] = content_hash(body)
    else:  # bad digest, under a valid signature
        body["sha256"] = "0" * 64
    return _resigned(state, body)


EXPECT = {"NaN": "not valid JSON (NaN is not a JSON number)", "duplicate key": "not valid JSON (duplicate key 'id')",
          "truncated": "not valid JSON (line ", "wrong kind": "schema is ",
          "bad digest": "content hash does not match"}


@pytest.mark.parametrize("mutation", list(EXPECT))
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_reader_refuses_hostile_records_in_one_line(tmp_path, kind, mutation):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path, load = KINDS[kind](state)
    good = load()
    assert len(good.trusted) == 1 and not good.notes, good.notes  # the file as written counts
    path.write_text(_hostile(mutation, kind, path.read_text(), state))
    loaded = load()
    assert loaded.trusted == [] and loaded.untrusted is None
    (note,) = loaded.notes
    assert EXPECT[mutation] in note and f"is not a valid {kind}" in note and "\n" not in note, note


@pytest.mark.parametrize("mutation", list(EXPECT))
@pytest.mark.parametrize("kind,parse", [("probe record", probe_record.parse_record), ("A/B record", ab_record.parse)])
def test_the_text_parsers_refuse_the_same(tmp_path, kind, parse, mutation):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path, _ = KINDS[kind](state)
    parse(path.read_text())
    with pytest.raises(RecordError) as exc:
        parse(_hostile(mutation, kind, path.read_text(), state))
    assert EXPECT[mutation] in str(exc.value) and "\n" not in str(exc.value)


def test_a_calibration_id_is_checked_like_the_other_kinds():
    data = {"schema": calibration.SCHEMA, "id": "latest", "created_at": "t", "finished_at": "t", "model": "m",
            "gpu": "g", "tp": 1, "source_file": "f", "points": [], "params": {}, "acceptance_length": 1.0,
            "loo_error_pct": 1.0, "payoff_error_pp": 1.0, "payoff": {}}
    data["sha256"] = content_hash(data)
    with pytest.raises(RecordError, match="is not <UTC time>-<8 hex>"):
        calibration.parse_data(data)


@pytest.mark.parametrize("text,detail", [
    ('{"a": NaN}', "NaN is not a JSON number"), ('{"a": Infinity}', "Infinity is not a JSON number"),
    ('[-Infinity]', "-Infinity is not a JSON number"), ('{"a": 1, "a": 1}', "duplicate key 'a'"),
    ('{"a": ', "line 1: Expecting value"), ("", "line 1: Expecting value"), ("[" * 100_000, "nested too deeply"),
    (b'{"a": "\xff"}', "not UTF-8: byte 7"), ("[" + "9" * 5000 + "]", "Exceeds the limit (4300 digits)"),
])
def test_parse_json_refuses_in_one_line_naming_what(text, detail):
    with pytest.raises(JSONInputError) as exc:
        parse_json(text, "the thing\nx")
    message = str(exc.value)
    assert isinstance(exc.value, UsageError) and detail in exc.value.detail and detail.split(":")[0] in message
    assert message.startswith("'the thing\\nx': ") and "\n" not in message


def test_parse_json_reads_strict_json():
    assert parse_json('{"a": [1, 2.5, null, true, "é"]}', "x") == {"a": [1, 2.5, None, True, "é"]}
    assert parse_json(b'{"a": 1}', "x") == {"a": 1}


def test_the_software_facts_script_runs_without_the_package_and_its_output_parses_strictly():
    import subprocess
    import sys

    from rocm_dspark.probe import software

    out = subprocess.run([sys.executable, "-I", "-c", software.script()], capture_output=True, text=True, timeout=120,
                         cwd="/")
    assert out.returncode == 0, out.stderr
    assert set(software.parse(out.stdout)) == set(software.KEYS)
    line = out.stdout.strip().splitlines()[-1]
    with pytest.raises(ValueError, match="the software facts: malformed JSON: duplicate key"):
        software.parse(line[:-1] + ', "vllm_version": null}')
