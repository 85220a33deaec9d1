"""Token re-scoring: are a speculating server's greedy outputs the tokens its own model would emit?

Adaptive verification (AV) with kernels that read the wrong query boundaries still starts and answers, with
wrong tokens, so the live level checks every emitted token against a reference (docs/adaptive-verification.md,
"Token re-scoring", says why each step is as it is):
1. Generate `RESCORE_PROMPTS` greedy, `GEN_TOKENS` each, all at once (`return_token_ids`).
2. Re-score each prompt + output by prefill with `prompt_logprobs` (no prefix cache is read for it:
   vllm/sampling_params.py skip_reading_prefix_cache) on a reference out of the drafter's reach (vllm#53488, fix
   in PR #53520): `nospec-server`, or `eager-padded`: padded past the largest capture size, so the step runs
   without graphs (vllm/v1/cudagraph_dispatcher.py `dispatch`, `num_tokens > max_size`), and sent alone.
3. Self-check (eager-padded): the first `SELF_CHECK_PROMPTS` are also scored unpadded; a disagreement makes the
   reference "unreliable (vllm#53488)": neither proven nor violations.
4. Judge: each token the reference argmax or within `NEAR_TIE_NATS` of it, over the minimums below.
Drafts verified per request: vLLM's per-request spec-decode metrics (`--per-request-spec-decode-metrics summary`)
where exported, else the `vllm:spec_decode_*` counters' difference (`trimmed`: some request had fewer than K
drafts verified in a step).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

NEAR_TIE_NATS = 0.02  # |top logprob - emitted token's logprob| allowed for a rank > 1 token
MIN_TOKENS = 256  # emitted tokens re-scored, over all prompts
MIN_PROMPTS = 4
MIN_CONCURRENCY = 4
GEN_TOKENS = 64
SELF_CHECK_PROMPTS = 4  # requests scored through both routes
PAD_TOKENS = 16  # an eager-padded prompt is this many tokens over max(capture size, its own length)
# vLLM's default largest capture size is min(max_num_seqs x (1+K) x 2, 512), 1024 on capability family 100
# (vllm/config/vllm.py `_set_cudagraph_sizes`): a server whose size is not known is assumed at this ceiling.
DEFAULT_CAPTURE_CEILING = 1024
ISSUE = "vllm#53488"
RESCORE_PROMPTS = (
    "def fibonacci(n):",
    "The three primary colours are",
    "Once upon a time, in a small village,",
    "import numpy as np\n\ndef softmax(x):",
    "Question: what is 17 times 19? Answer:",
    "The capital of France is",
    "SELECT name, age FROM users WHERE",
    "1, 2, 3, 5, 8, 13,",
)


def _at(prompt_logprobs: list, pos: int, token: int) -> tuple[str, int, float, int]:
    """("ok" | "near" | "violation", reference top id, gap in nats, the emitted token's rank) at one position."""
    entry = prompt_logprobs[pos] if pos < len(prompt_logprobs) else None
    if not isinstance(entry, dict) or not entry:
        raise ValueError(f"no prompt logprobs at position {pos} of {len(prompt_logprobs)}")
    scored = {int(k): v for k, v in entry.items()}
    mine = scored.get(int(token))
    if mine is None:
        raise ValueError(f"the emitted token {token} at position {pos} has no prompt logprob")
    top_id, top = min(scored.items(), key=lambda kv: (kv[1]["rank"], -kv[1]["logprob"]))
    if mine["rank"] == 1 or int(token) == top_id:
        return "ok", int(token), 0.0, 1
    gap = float(top["logprob"]) - float(mine["logprob"])
    return ("near" if math.isfinite(gap) and gap <= NEAR_TIE_NATS else "violation"), top_id, gap, mine["rank"]


def judge_tokens(output_ids: list[int], prompt_len: int, prompt_logprobs: list) -> dict:
    """Judge one request: `prompt_logprobs` is vLLM's list for prompt + output (entry i: {token id (str or
    int): {logprob, rank, ...}} or None at position 0). Returns tokens, near_ties, violations (first few
    detailed)."""
    near = count = 0
    violations = []
    for j, token in enumerate(output_ids):
        state, top_id, gap, rank = _at(prompt_logprobs, prompt_len + j, token)
        if state == "near":
            near += 1
        elif state == "violation":
            count += 1
            if len(violations) < 5:
                violations.append(
                    {"index": j, "emitted": int(token), "rank": rank, "reference": top_id, "gap_nats": round(gap, 6)}
                )
    return {"tokens": len(output_ids), "near_ties": near, "violations": count, "first_violations": violations}


def compare_routes(output_ids: list[int], prompt_len: int, first: list, second: list) -> dict:
    """Positions two references judge differently: one accepts the emitted token and the other does not, or
    both reject it in favour of different tokens (a near-tie in either route is agreement)."""
    differ = []
    for j, token in enumerate(output_ids):
        a, b = _at(first, prompt_len + j, token), _at(second, prompt_len + j, token)
        accept_a, accept_b = a[0] != "violation", b[0] != "violation"
        if accept_a != accept_b or (not accept_a and a[1] != b[1]):
            differ.append(
                {
                    "index": j,
                    "emitted": int(token),
                    "first": {"top": a[1], "gap_nats": round(a[2], 6)},
                    "second": {"top": b[1], "gap_nats": round(b[2], 6)},
                }
            )
    return {"positions": len(output_ids), "disagreements": len(differ), "first_disagreements": differ[:5]}


def eager_reference(
    capture_size: int | None, max_num_batched_tokens: int | None, max_model_len: int | None, longest: int
) -> dict:
    """The same-server reference: padded past the largest capture size in one chunk, or why it cannot be.
    `capture_size` None: not known (assumed at vLLM's default ceiling); 0: the server captures no graphs."""
    ceiling = DEFAULT_CAPTURE_CEILING if capture_size is None else capture_size
    pad_to = max(ceiling, longest) + PAD_TOKENS
    ref = {
        "route": "eager-padded",
        "independent": True,
        "capture_size": capture_size,
        "padded_to": pad_to,
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_model_len": max_model_len,
    }
    size = (
        f"an unknown capture size (assumed vLLM's default ceiling, {ceiling})"
        if capture_size is None
        else f"the capture size {capture_size}"
    )
    # the first server limit the padded prompt is over, and the flag that raises it
    over = [
        (limit, flag)
        for limit, flag, value in (
            ("max_model_len", f"--max-model-len >= {pad_to}", max_model_len),
            ("max_num_batched_tokens", f"--max-num-batched-tokens >= {pad_to} (one chunk)", max_num_batched_tokens),
        )
        if value and pad_to > value
    ]
    if not over:
        ref["why"] = (
            f"the speculating server itself, each prompt padded to {pad_to} tokens (past {size}, "
            f"so its prefill runs without graphs, {ISSUE}) and sent one at a time"
        )
        return ref
    limit, flag = over[0]
    ref.update(
        route="same-server",
        independent=False,
        padded_to=None,
        fix=f"serve with {flag}, or re-score against a server without --speculative-config "
        "(validation/run_av_acceptance.py)",
        why=(
            f"a prefill past {size} needs {pad_to} tokens, over the server's {limit}, so the same-server "
            f"reference would run through graphs the drafter can corrupt ({ISSUE})"
        ),
    )
    return ref


def drafts_per_request(response: dict) -> dict | None:
    """vLLM's per-request spec-decode metrics from one completion response, if the server exports them."""
    spec = (response.get("metrics") or {}).get("speculative_decoding") if isinstance(response, dict) else None
    if not isinstance(spec, dict):
        return None
    return {k: spec.get(k) for k in ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")}


def summarize(
    per_request: list[dict],
    *,
    concurrency: int,
    k: int | None,
    reference: dict,
    counters: dict | None = None,
    self_check: dict | None = None,
) -> dict:
    """The re-scoring evidence the live level records: `status` (proven | violations | too-little |
    reference-unreliable), `proven` (bool), `why` (one line) and, where the reference is at fault, `fix`."""
    tokens = sum(r["tokens"] for r in per_request)
    violations = sum(r["violations"] for r in per_request)
    near = sum(r["near_ties"] for r in per_request)
    drafts = [r["drafts"] for r in per_request if r.get("drafts")]
    trimmed = None
    if k and drafts and len(drafts) == len(per_request):
        trimmed = any((d["num_draft_tokens"] or 0) < k * (d["num_spec_steps"] or 0) for d in drafts)
    elif k and counters and counters.get("num_drafts"):
        trimmed = counters["num_draft_tokens"] < k * counters["num_drafts"]
    agree = self_check is None or self_check["disagreements"] == 0
    needs_check = reference.get("route") == "eager-padded"
    independent = bool(reference.get("independent")) and agree and (self_check is not None or not needs_check)
    out = {
        "tokens_checked": tokens,
        "violations": violations,
        "near_ties": near,
        "prompts": len(per_request),
        "concurrency": concurrency,
        "tolerance_nats": NEAR_TIE_NATS,
        "min_tokens": MIN_TOKENS,
        "min_prompts": MIN_PROMPTS,
        "min_concurrency": MIN_CONCURRENCY,
        "num_speculative_tokens": k,
        "reference": reference,
        "self_check": self_check,
        "reference_independent": independent,
        "drafts_per_request": [r.get("drafts") for r in per_request],
        "drafts_from_counters": counters,
        "trimmed": trimmed,
        "requests": [
            {key: r[key] for key in ("prompt", "tokens", "near_ties", "violations", "first_violations")}
            for r in per_request
        ],
    }
    if not independent:
        if not agree:
            d = self_check["first_disagreements"][0]
            why = (
                f"reference unreliable ({ISSUE}): the padded and the unpadded prefill of the same context "
                f"judge {self_check['disagreements']} of {self_check['positions']} positions differently "
                f"(prompt {self_check['prompt']!r}, token {d['index']}: top {d['first']['top']} padded, "
                f"{d['second']['top']} unpadded)"
            )
            fix = (
                f"re-score against a server without --speculative-config (validation/run_av_acceptance.py), or use a "
                f"vLLM build with PR #53520; {violations} violation(s) against the padded reference are not "
                "counted"
            )
        else:
            why = f"reference unreliable ({ISSUE}): it is not independent of the drafter: {reference.get('why')}"
            fix = reference.get("fix") or "re-score against a server without --speculative-config"
        out.update(status="reference-unreliable", proven=False, why=why, fix=fix)
    elif violations:
        first = next(r for r in per_request if r["violations"])
        v = first["first_violations"][0]
        why = (
            f"{violations} of {tokens} emitted tokens are not the reference argmax (prompt {first['prompt']!r}, "
            f"token {v['index']}: emitted {v['emitted']} at rank {v['rank']}, {v['gap_nats']} nats below "
            f"token {v['reference']}; reference: {reference['route']})"
        )
        out.update(status="violations", proven=False, why=why)
    elif tokens < MIN_TOKENS or len(per_request) < MIN_PROMPTS or concurrency < MIN_CONCURRENCY:
        out.update(
            status="too-little",
            proven=False,
            why=f"too little re-scored: {tokens} tokens from {len(per_request)} prompts at "
            f"concurrency {concurrency} (needs >= {MIN_TOKENS}, {MIN_PROMPTS}, {MIN_CONCURRENCY})",
        )
    else:
        out.update(
            status="proven",
            proven=True,
            why=f"{tokens} emitted tokens from {len(per_request)} prompts at concurrency {concurrency}: 0 "
            f"violations, {near} near-tie(s) within {NEAR_TIE_NATS} nats (reference: {reference['route']})"
            + (
                ""
                if trimmed is not False
                else "; no request had fewer than K drafts verified in a step (AV never trimmed)"
            ),
        )
    return out


def prompt_logprobs(client, model: str, ids: list[int], pad_to: int | None = None) -> list:
    """vLLM's prompt_logprobs for `ids`; with `pad_to`, the request carries filler tokens (the context's own
    ids again) up to that length after them, and only the entries of `ids` are returned."""
    full = list(ids)
    if pad_to and pad_to > len(full):
        full += [ids[i % len(ids)] for i in range(pad_to - len(ids))]
    reply = client.complete(full, max_tokens=1, model=model, temperature=0.0, prompt_logprobs=1, timeout_s=600)
    return reply["choices"][0]["prompt_logprobs"][: len(ids)]


def served_max_model_len(client, model: str) -> int | None:
    """The served model's max_model_len from /v1/models (vLLM lists it per model), or None."""
    try:
        data = client.get("/v1/models", timeout_s=30).json().get("data", [])
    except (ValueError, AttributeError):
        return None
    found = [m.get("max_model_len") for m in data if isinstance(m, dict) and m.get("id") == model]
    return found[0] if found and isinstance(found[0], int) and found[0] > 0 else None


def generate(
    client, model: str, *, prompts=RESCORE_PROMPTS, max_tokens: int = GEN_TOKENS, temperature: float = 0.0
) -> list[dict]:
    """All prompts at once: [{prompt, prompt_ids, output_ids, drafts}]."""

    def one(prompt: str) -> dict:
        return client.complete(
            prompt,
            max_tokens=max_tokens,
            model=model,
            ignore_eos=True,
            temperature=temperature,
            return_token_ids=True,
            timeout_s=600,
        )

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        replies = list(pool.map(one, prompts))
    out = []
    for prompt, reply in zip(prompts, replies):
        choice = reply["choices"][0]
        prompt_ids = reply.get("prompt_token_ids") or choice.get("prompt_token_ids")
        output_ids = choice.get("token_ids")
        if not prompt_ids or output_ids is None:
            raise ValueError("the server returned no token ids (return_token_ids): cannot re-score")
        out.append(
            {
                "prompt": prompt,
                "prompt_ids": list(prompt_ids),
                "output_ids": list(output_ids),
                "drafts": drafts_per_request(reply),
            }
        )
    return out


def judge(
    generated: list[dict],
    reference_client,
    reference_model: str,
    reference: dict,
    *,
    concurrency: int,
    k: int | None,
    counters: dict | None = None,
    check_client=None,
) -> dict:
    """Re-score `generated` on the reference (one request at a time) and summarize. `check_client`: the
    speculating server, for the self-check of an eager-padded reference."""
    pad_to = reference.get("padded_to") if reference.get("route") == "eager-padded" else None
    checks = SELF_CHECK_PROMPTS if pad_to and check_client is not None else 0
    per_request, routes = [], []
    for i, g in enumerate(generated):
        ids = g["prompt_ids"] + g["output_ids"]
        ref_lp = prompt_logprobs(reference_client, reference_model, ids, pad_to)
        judged = judge_tokens(g["output_ids"], len(g["prompt_ids"]), ref_lp)
        per_request.append({"prompt": g["prompt"], **judged, "drafts": g.get("drafts")})
        if i < checks:
            short = prompt_logprobs(check_client, reference_model, ids)
            routes.append((g["prompt"], compare_routes(g["output_ids"], len(g["prompt_ids"]), ref_lp, short)))
    check = None
    if routes:
        first = next(((prompt, got) for prompt, got in routes if got["disagreements"]), (None, {}))
        check = {
            "routes": ["eager-padded", "unpadded"],
            "prompts": len(routes),
            "positions": sum(got["positions"] for _, got in routes),
            "disagreements": sum(got["disagreements"] for _, got in routes),
            "prompt": first[0],
            "first_disagreements": first[1].get("first_disagreements", []),
        }
    return summarize(
        per_request, concurrency=concurrency, k=k, counters=counters, reference=reference, self_check=check
    )


def rescore(
    client,
    model: str,
    *,
    prompts=RESCORE_PROMPTS,
    max_tokens: int = GEN_TOKENS,
    k: int | None = None,
    temperature: float = 0.0,
    counters_delta=None,
    progress=lambda msg: None,
    capture_size: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> dict:
    """Generate all prompts at once on the speculating server, re-score each one there through the
    eager-padded route with the self-check, and summarize (see the module docstring).
    `temperature` > 0 is the negative control: sampled tokens judged as if greedy must show violations.
    `counters_delta`: a callable returning the spec-decode counter difference over the generation (or None)."""
    progress(f"live: {len(prompts)} greedy prompts at once, {max_tokens} tokens each, then re-scored by prefill")
    generated = generate(client, model, prompts=prompts, max_tokens=max_tokens, temperature=temperature)
    counters = counters_delta() if counters_delta else None
    longest = max(len(g["prompt_ids"]) + len(g["output_ids"]) for g in generated)
    max_model_len = served_max_model_len(client, model)
    reference = eager_reference(capture_size, max_num_batched_tokens, max_model_len, longest)
    progress(f"live: re-scoring reference: {reference['why']}")
    return judge(
        generated, client, model, reference, concurrency=len(prompts), k=k, counters=counters, check_client=client
    )
