"""The tool-call check (`tool_calls`, last): one chat request per case declares a tool and tool_choice auto, and
asks for a call whose `text` argument is a long paragraph; the answer's arguments are checked with jsonschema and
for DSML or parameter tags (field reports: vllm#52846, the comment on vllm#45877, smg-project/smg#2525).

A server that does not serve the recipe's model (a CPU test server) cannot be asked to call a tool: the
request then forces, with vLLM's structured outputs (`structured_outputs.choice`, one string), the raw text a
V4.1 model emits, so the server's own parsers have to take it apart. This needs `--structured-outputs-config
'{"enable_in_reasoning": true}'` for the thinking cases: without it vLLM constrains only after the reasoning ends.
"""

from __future__ import annotations

import json
import re
from functools import partial
from typing import NamedTuple

from rocm_dspark.inputs import parse_json
from rocm_dspark.recipe.plan import Command
from rocm_dspark.runtime.client import ServerError, one_line
from rocm_dspark.validate.result import FAIL, NOT_APPLICABLE, PASS, Outcome

PARAGRAPH = (
    "The survey of the northern ridge found three springs, two of them dry since May, and a trail washed out "
    "below the second saddle; the team recommends rerouting the path along the eastern shoulder, marking the "
    "crossing with cairns, and checking the third spring again after the autumn rains. "
) * 3
ARGS: dict = {"title": "Field report", "priority": 2, "text": PARAGRAPH.strip()}
TOOL: dict = {
    "type": "function",
    "function": {
        "name": "save_note",
        "description": "Save a note.",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["title", "priority", "text"],
            "properties": {
                "title": {"type": "string"},
                "priority": {"type": "integer", "minimum": 1},
                "text": {"type": "string"},
            },
        },
    },
}
PROMPT = (
    f"Call save_note with title {ARGS['title']!r}, priority {ARGS['priority']} and as text exactly this "
    f"paragraph:\n\n{ARGS['text']}"
)
# The raw text each parser takes apart: vllm/parser/deepseek_v41.py (V4.1, spaced tags: DSML_TOOL_START
# "<｜DSML｜ calls>", DSML_INVOKE_PREFIX, DSML_PARAM_START/CLOSE) and vllm/parser/deepseek_v4.py (V4, its
# docstring's example), the same in vLLM 0.32.0 and 0.33.0; reasoning ends with "</think>" in both.
DIALECTS = {
    "deepseek_v41": (
        "<｜DSML｜ calls>",
        '<｜DSML｜ invoke name="',
        "</｜DSML｜ invoke>",
        "</｜DSML｜ calls>",
        "<｜DSML｜ parameter",
        "</｜DSML｜ parameter>",
    ),
    "deepseek_v4": (
        "<｜DSML｜tool_calls>",
        '<｜DSML｜invoke name="',
        "</｜DSML｜invoke>",
        "</｜DSML｜tool_calls>",
        "<｜DSML｜parameter",
        "</｜DSML｜parameter>",
    ),
}
THINKING = "The user wants the note saved; I call save_note.</think>"
LEAK = re.compile(r"｜DSML｜|</?\s*(?:parameter|invoke|tool_calls)\b|</think>")
MAX_TOKENS = {"forced": 1536, "model": 8192}  # the model may think at length before it calls


class Case(NamedTuple):
    stream: bool
    thinking: bool

    @property
    def name(self) -> str:
        return f"{'streaming' if self.stream else 'non-streaming'}, thinking {'on' if self.thinking else 'off'}"


CASES = tuple(Case(stream, thinking) for stream in (False, True) for thinking in (False, True))


def raw_call(parser: str, args: dict, thinking: bool) -> str:
    """The text a model emits for one call of save_note in `parser`'s dialect (strings raw, others JSON)."""
    start, invoke, invoke_end, end, param, param_end = DIALECTS[parser]
    params = "".join(
        f'{param} name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
        f"{v if isinstance(v, str) else json.dumps(v)}{param_end}\n"
        for k, v in args.items()
    )
    return (THINKING if thinking else "") + f'{start}\n{invoke}save_note">\n{params}{invoke_end}\n{end}'


def flag(argv, dest: str) -> str | None:
    """vLLM `dest` of the served command ("" for a bare flag; None: not given), read by Command.from_words."""
    command = Command.from_words(argv)
    return None if not command.flags.has(dest) else command.value(dest) or ""


def request_body(served_name: str, case: Case, forced: str | None) -> dict:
    return {
        "model": served_name,
        "messages": [{"role": "user", "content": PROMPT}],
        "tools": [TOOL],
        "tool_choice": "auto",
        "max_tokens": MAX_TOKENS["model" if forced is None else "forced"],
        "temperature": 0.0,
        "chat_template_kwargs": {"thinking": case.thinking},
        "stream": case.stream,
        **({} if forced is None else {"structured_outputs": {"choice": [forced]}}),
    }


def _assemble_stream(raw: bytes) -> tuple[dict, list[dict]]:
    """The streamed deltas put back together as one message; and the chunks themselves."""
    chunks = [
        parse_json(line[5:], "a streamed chunk")
        for line in raw.decode(errors="replace").splitlines()
        if line.startswith("data:") and line[5:].strip() != "[DONE]"
    ]
    message: dict = {"content": "", "reasoning": "", "tool_calls": []}
    calls: dict[int, dict] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            message["content"] += delta.get("content") or ""
            message["reasoning"] += delta.get("reasoning") or delta.get("reasoning_content") or ""
            for tc in delta.get("tool_calls") or []:
                call = calls.setdefault(tc.get("index", 0), {"function": {"name": "", "arguments": ""}, "deltas": 0})
                fn = tc.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                if fn.get("arguments"):
                    call["function"]["arguments"] += fn["arguments"]
                    call["deltas"] += 1
            finish = choice.get("finish_reason") or finish
    message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {"choices": [{"message": message, "finish_reason": finish}]}, chunks


def problems_of(response: dict, expect_args: dict | None) -> list[str]:
    """What is wrong with one response (non-streamed, or streamed and assembled): [] when it is right."""
    import jsonschema

    choice = (response.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    found = []
    for field in ("content", "reasoning", "reasoning_content"):
        if message.get(field) and LEAK.search(message[field]):
            found.append(
                f"{field} carries a tag: {one_line(LEAK.search(message[field]).group(0))!r} in "  # type: ignore[union-attr]
                f"{one_line(message[field], 120)!r}"
            )
    calls = message.get("tool_calls") or []
    if not calls:
        return found + [
            f"no tool_calls (finish_reason {choice.get('finish_reason')}): the parser did not take the call apart"
        ]
    for call in calls:
        fn = call.get("function") or {}
        if fn.get("name") != "save_note":
            found.append(f"tool_calls names {fn.get('name')!r}, not 'save_note'")
        text = fn.get("arguments") or ""
        if LEAK.search(text):
            found.append(f"arguments carry a tag: {LEAK.search(text).group(0)!r}")  # type: ignore[union-attr]
        try:
            args = parse_json(text, "the arguments")
        except ValueError as exc:
            found.append(f"arguments are not JSON ({exc}): {one_line(text, 120)!r}")
            continue
        try:
            jsonschema.validate(args, TOOL["function"]["parameters"])
        except jsonschema.ValidationError as exc:
            found.append(f"arguments do not match the declared schema: {one_line(exc.message, 160)}")
        got = str(args.get("text") or "") if isinstance(args, dict) else ""
        if expect_args is not None and got.split() != expect_args["text"].split():  # whitespace aside
            found.append(f"the long text argument arrived cut: {len(got)} of {len(expect_args['text'])} characters")
    if len(calls) != 1:
        found.append(f"{len(calls)} tool calls, expected one")
    return found


def run_case(client, served_name: str, case: Case, forced: str | None, timeout_s: float) -> dict:
    """One request; {"case", "problems", "request", "response", ...}. A transport failure is a problem too."""
    body = request_body(served_name, case, forced)
    out: dict = {"case": case.name, "request": body}
    try:
        res = client.request("POST", "/v1/chat/completions", body, timeout_s=timeout_s)
    except ServerError as exc:
        return {**out, "problems": [str(exc)], "response": None}
    text = res.body.decode(errors="replace")
    if res.status != 200:
        return {**out, "problems": [f"HTTP {res.status}: {one_line(text, 300)}"], "response": text[:4000]}
    try:
        if case.stream:
            response, chunks = _assemble_stream(res.body)
            out["chunks"] = len(chunks)
            calls = response["choices"][0]["message"]["tool_calls"]
            out["argument_deltas"] = [c["deltas"] for c in calls]
        else:
            response = res.json()
    except ValueError as exc:
        return {**out, "problems": [f"the response is not JSON: {exc}"], "response": text[:4000]}
    return {**out, "problems": problems_of(response, ARGS), "response": response}


def tool_calls(ctx) -> Outcome:
    """the plan's tool and reasoning parsers: a tool call, non-streaming and streaming, thinking on and off, parses
    into tool_calls with arguments matching the schema, no DSML tag leaks, a long argument arrives whole (a server
    not serving the recipe's model is forced to emit the raw text)."""
    argv = ctx.target.argv or ctx.plan.argv
    parser, reasoning = flag(argv, "tool_call_parser"), flag(argv, "reasoning_parser")
    if not parser:
        return Outcome(NOT_APPLICABLE, "the server command sets no --tool-call-parser: no tool calls to check")
    if not Command.from_words(argv).bool_flag("enable_auto_tool_choice"):
        return Outcome(
            FAIL,
            f"--tool-call-parser {parser} without --enable-auto-tool-choice: vLLM refuses "
            "tool_choice auto; add the flag",
            threshold={"tool_call_parser": parser},
        )
    forced = not ctx.target.recipe_model
    if forced and parser not in DIALECTS:
        return Outcome(
            NOT_APPLICABLE,
            f"the server serves {ctx.target.served_name!r}, not the recipe's model, and "
            f"this check can force only the {', '.join(DIALECTS)} formats, not {parser}",
        )
    results = [
        run_case(
            ctx.client,
            ctx.target.served_name,
            case,
            raw_call(parser, ARGS, case.thinking) if forced else None,
            ctx.options.request_timeout_s,
        )
        for case in CASES
    ]
    failed = [r for r in results if r["problems"]]
    value = {r["case"]: ("fail" if r["problems"] else "pass") for r in results}
    how = (
        f"forced raw {parser} text (structured outputs) through the server's parsers"
        if forced
        else "the model's own calls"
    )
    out = partial(Outcome, value=value, threshold={"tool_call_parser": parser, "reasoning_parser": reasoning})
    if failed:
        first = failed[0]
        return out(
            FAIL,
            f"{len(failed)} of {len(results)} cases failed ({how}); {first['case']}: {first['problems'][0]}",
            evidence={"failing": failed, "passed": [r["case"] for r in results if not r["problems"]]},
        )
    deltas = [d for r in results for d in r.get("argument_deltas", [])]
    return out(
        PASS,
        f"{len(results)} cases ({how}): tool_calls parsed, arguments match the schema, no tags "
        f"leaked, the {len(ARGS['text'])}-character argument whole when streamed (in {deltas} deltas)",
        evidence={"cases": [r["case"] for r in results], "argument_deltas": deltas},
    )
