"""Server checks: /health, /v1/models, /version, the recipe's deterministic answer, a chat and a completion.

Every request has a timeout (options.request_timeout_s); a transport failure is a failed check with the
reason, never a hang.
"""

from __future__ import annotations

import re
from functools import partial

from rocm_dspark.launch import launch_facts
from rocm_dspark.runtime import mono_log
from rocm_dspark.runtime.client import ServerError
from rocm_dspark.validate.result import FAIL, NOT_APPLICABLE, PASS, WARN, Outcome

CHAT_PROMPT = "Name three primary colours, comma separated."
COMPLETION_PROMPT = "The three primary colours are"


def health(ctx) -> Outcome:
    """GET /health answers 200."""
    try:
        res = ctx.client.get("/health", timeout_s=min(ctx.options.request_timeout_s, 30))
    except ServerError as exc:
        return Outcome(FAIL, f"{exc}: is the server running at {ctx.target.base_url}?")
    if res.status != 200:
        return Outcome(
            FAIL,
            f"GET /health answered HTTP {res.status}: the engine is not ready or has failed",
            value=res.status,
            threshold=200,
        )
    return Outcome(PASS, "GET /health 200", value=200, threshold=200)


def models(ctx) -> Outcome:
    """GET /v1/models lists the served model name."""
    want = ctx.target.served_name
    try:
        ids = ctx.client.models(timeout_s=min(ctx.options.request_timeout_s, 30))
    except ServerError as exc:
        return Outcome(FAIL, str(exc), threshold=want)
    if want not in ids:
        return Outcome(
            FAIL,
            f"/v1/models lists {ids}, not {want!r}: clients asking for {want!r} will get 404; "
            "fix --served-model-name (or pass the name the server uses)",
            value=ids,
            threshold=want,
        )
    return Outcome(PASS, f"/v1/models lists {want!r}", value=ids, threshold=want)


def version(ctx) -> Outcome:
    """GET /version: the vLLM the server runs."""
    try:
        res = ctx.client.get("/version", timeout_s=min(ctx.options.request_timeout_s, 30))
        served = res.json().get("version") if res.status == 200 else None
    except (ServerError, ValueError, AttributeError):
        served = None
    if not served:
        return Outcome(WARN, "the server does not report /version")
    return Outcome(PASS, f"server reports vLLM {served}", value=served, threshold=ctx.plan.vllm_version)


def _content(response: dict) -> tuple[str | None, str | None]:
    choice = (response.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    return message.get("content"), choice.get("finish_reason")


def normalise_answer(text: str) -> str:
    """'  **323**.' -> '323': models wrap a bare answer in markdown or end it with a full stop."""
    return re.sub(r"^[\s*`_\"']+|[\s*`_\"'.]+$", "", text or "")


def deterministic(ctx) -> Outcome:
    """the recipe's deterministic check (data: validation.deterministic_check; 17*19 -> 323 with thinking off).

    A greedy chat request whose whole answer must equal `expect`."""
    check = (ctx.model.validation or {}).get("deterministic_check")
    if not check:
        return Outcome(NOT_APPLICABLE, f"the recipe for {ctx.model.key} has no validation.deterministic_check")
    extra = {"chat_template_kwargs": dict(check["chat_template_kwargs"])} if check.get("chat_template_kwargs") else {}
    try:
        response = ctx.client.chat(
            check["prompt"],
            int(check.get("max_tokens", 16)),
            model=ctx.target.served_name,
            temperature=0.0,
            timeout_s=ctx.options.request_timeout_s,
            **extra,
        )
    except ServerError as exc:  # the request itself failed: a failure on any model
        return Outcome(FAIL, str(exc), threshold=check["expect"])
    content, finish = _content(response)
    evidence = {
        "prompt": check["prompt"],
        "request_extra": extra,
        "content": content,
        "finish_reason": finish,
        "usage": response.get("usage"),
    }
    out = partial(Outcome, value=content, threshold=check["expect"], evidence=evidence)
    if not ctx.target.recipe_model and content is not None:
        # A different model (e.g. a CPU test server): the recipe's expected answer does not apply to it, but the
        # request went through the same path; record what it said (no content at all fails below, on any model).
        return out(
            NOT_APPLICABLE,
            f"the server serves {ctx.target.served_name!r}, not {ctx.model.key}: the recipe's "
            f"expected answer {check['expect']!r} does not apply (it said {str(content)[:60]!r})",
        )
    if not content:
        why = (
            " (finish_reason=length: thinking may be on and used up max_tokens; see the recipe's chat_template_kwargs)"
            if finish == "length"
            else ""
        )
        return out(FAIL, f"empty answer{why}")
    answer = normalise_answer(content)
    if answer != str(check["expect"]):
        return out(FAIL, f"answered {content[:80]!r}, expected {check['expect']!r}")
    return out(PASS, f"answered {answer!r} as expected")


def chat(ctx) -> Outcome:
    """a chat completion returns generated tokens."""
    check = (ctx.model.validation or {}).get("deterministic_check") or {}
    kwargs = check.get("chat_template_kwargs") if ctx.target.recipe_model else None  # the recipe's, for its model
    extra = {"chat_template_kwargs": dict(kwargs)} if kwargs else {}
    try:
        response = ctx.client.chat(
            CHAT_PROMPT, 64, model=ctx.target.served_name, timeout_s=ctx.options.request_timeout_s, **extra
        )
    except ServerError as exc:
        return Outcome(FAIL, str(exc))
    content, finish = _content(response)
    tokens = (response.get("usage") or {}).get("completion_tokens") or 0
    evidence = {"content": content, "finish_reason": finish, "usage": response.get("usage")}
    if tokens <= 0:
        return Outcome(FAIL, "the chat response carries no generated tokens", value=tokens, evidence=evidence)
    return Outcome(PASS, f"chat answered {tokens} tokens (finish_reason {finish})", value=tokens, evidence=evidence)


def completion(ctx) -> Outcome:
    """a text completion returns generated tokens."""
    try:
        response = ctx.client.complete(
            COMPLETION_PROMPT, 16, model=ctx.target.served_name, timeout_s=ctx.options.request_timeout_s
        )
    except ServerError as exc:
        return Outcome(FAIL, str(exc))
    choice = (response.get("choices") or [{}])[0]
    tokens = (response.get("usage") or {}).get("completion_tokens") or 0
    evidence = {
        "text": choice.get("text"),
        "finish_reason": choice.get("finish_reason"),
        "usage": response.get("usage"),
    }
    if tokens <= 0:
        return Outcome(FAIL, "the completion carries no generated tokens", value=tokens, evidence=evidence)
    return Outcome(PASS, f"completion answered {tokens} tokens", value=tokens, evidence=evidence)


def mono_decode(ctx) -> Outcome:
    """--monokernel: which mono decode path the server log says runs (whole layer, FFN launch, or off, and why).

    Read from the log of the server validate started, after the chat and the completion have run decode steps
    (rocm_dspark.runtime.mono_log)."""
    asked = launch_facts.runs_mono(getattr(ctx.target, "argv", ()) or ctx.plan.argv)
    server = ctx.launched
    mono = mono_log.read_file(server.log_path) if server is not None else None
    threshold = "a decode step takes the mono decode kernels" if asked else None
    if mono is None and not asked:
        return Outcome(NOT_APPLICABLE, "the plan does not use --monokernel")
    if server is None:
        return Outcome(
            NOT_APPLICABLE,
            "the server was not started here (--endpoint): its log is not read; its "
            "'DSv4.1 mono decode' lines say which path runs",
            threshold=threshold,
        )
    evidence = {"log": str(server.log_path)}
    if mono is None:
        return Outcome(
            WARN,
            "the server log has no 'DSv4.1 mono decode' line: this vLLM build does not log the mono "
            "decode path (vLLM 0.33.0 does, while it builds the model)",
            threshold=threshold,
            evidence=evidence,
        )
    status = PASS if mono.path != mono_log.OFF and mono.active else WARN
    return Outcome(status, mono.text(), value=mono._asdict(), threshold=threshold, evidence=evidence)
