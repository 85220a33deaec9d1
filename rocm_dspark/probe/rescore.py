"""Token re-scoring: are a speculating server's greedy outputs the tokens its own model would emit?

Adaptive verification (AV) with kernels that read the wrong query boundaries still starts and still answers;
it emits wrong tokens. So the live level checks every emitted token against a reference from the same server:

1. Generate: `RESCORE_PROMPTS` greedy (temperature 0, ignore_eos, `GEN_TOKENS` each) all at once, so that one
   decode step holds requests whose drafts are accepted to different depths (under AV: verify lengths that
   differ within a step). `return_token_ids` gives the prompt and output token ids.
2. Re-score: each prompt + output goes back as a prompt (token ids) with `prompt_logprobs`, max_tokens 1. A
   prefill runs no speculation, and vLLM reads no prefix cache for a request with prompt_logprobs
   (vllm/sampling_params.py: skip_reading_prefix_cache), so this is the model's own distribution at every
   position, computed without the decode path under test.
3. Judge: each emitted token must be the reference argmax (rank 1), or within `NEAR_TIE_NATS` of the top
   logprob (a near-tie: bf16 batch-shape noise can flip those on a GPU; counted separately). Anything else is
   a violation. AV counts as proven only with zero violations over at least `MIN_TOKENS` tokens from at
   least `MIN_PROMPTS` prompts sent `MIN_CONCURRENCY` at a time.

The drafts each request had verified come from vLLM's per-request spec-decode metrics
(`--per-request-spec-decode-metrics summary`: `metrics.speculative_decoding` in each response) where the
server exports them, and from the `vllm:spec_decode_*` counters' difference otherwise; a run whose
requests were never trimmed below K drafts per step is recorded as such (`trimmed`).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

NEAR_TIE_NATS = 0.02      # |top logprob - emitted token's logprob| allowed for a rank > 1 token
MIN_TOKENS = 256          # emitted tokens re-scored, over all prompts
MIN_PROMPTS = 4
MIN_CONCURRENCY = 4
GEN_TOKENS = 64
RESCORE_PROMPTS = (
    "def fibonacci(n):", "The three primary colours are", "Once upon a time, in a small village,",
    "import numpy as np\n\ndef softmax(x):", "Question: what is 17 times 19? Answer:",
    "The capital of France is", "SELECT name, age FROM users WHERE", "1, 2, 3, 5, 8, 13,",
)


def judge_tokens(output_ids: list[int], prompt_len: int, prompt_logprobs: list, *, tolerance: float = NEAR_TIE_NATS
                 ) -> dict:
    """Judge one request: `prompt_logprobs` is vLLM's list for prompt + output (entry i: {token id (str or
    int): {logprob, rank, ...}} or None at position 0). Returns tokens, near_ties, violations (first few
    detailed)."""
    tokens = near = 0
    violations = []
    count = 0
    for j, token in enumerate(output_ids):
        pos = prompt_len + j
        entry = prompt_logprobs[pos] if pos < len(prompt_logprobs) else None
        if not isinstance(entry, dict) or not entry:
            raise ValueError(f"no prompt logprobs at position {pos} of {len(prompt_logprobs)}")
        scored = {int(k): v for k, v in entry.items()}
        mine = scored.get(int(token))
        if mine is None:
            raise ValueError(f"the emitted token {token} at position {pos} has no prompt logprob")
        top_id, top = min(scored.items(), key=lambda kv: (kv[1]["rank"], -kv[1]["logprob"]))
        tokens += 1
        if mine["rank"] == 1 or int(token) == top_id:
            continue
        gap = float(top["logprob"]) - float(mine["logprob"])
        if math.isfinite(gap) and gap <= tolerance:
            near += 1
            continue
        count += 1
        if len(violations) < 5:
            violations.append({"index": j, "emitted": int(token), "rank": mine["rank"], "reference": top_id,
                               "gap_nats": round(gap, 6)})
    return {"tokens": tokens, "near_ties": near, "violations": count, "first_violations": violations}


def drafts_per_request(response: dict) -> dict | None:
    """vLLM's per-request spec-decode metrics from one completion response, if the server exports them."""
    spec = (response.get("metrics") or {}).get("speculative_decoding") if isinstance(response, dict) else None
    if not isinstance(spec, dict):
        return None
    return {k: spec.get(k) for k in ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")}


def summarize(per_request: list[dict], *, concurrency: int, k: int | None, counters: dict | None = None,
              tolerance: float = NEAR_TIE_NATS) -> dict:
    """The re-scoring evidence the live level records, with `proven` (bool) and `why` (one line)."""
    tokens = sum(r["tokens"] for r in per_request)
    violations = sum(r["violations"] for r in per_request)
    near = sum(r["near_ties"] for r in per_request)
    drafts = [r["drafts"] for r in per_request if r.get("drafts")]
    trimmed = None
    if k and drafts and len(drafts) == len(per_request):
        trimmed = any((d["num_draft_tokens"] or 0) < k * (d["num_spec_steps"] or 0) for d in drafts)
    elif k and counters and counters.get("num_drafts"):
        trimmed = counters["num_draft_tokens"] < k * counters["num_drafts"]
    out = {"tokens_checked": tokens, "violations": violations, "near_ties": near, "prompts": len(per_request),
           "concurrency": concurrency, "tolerance_nats": tolerance, "min_tokens": MIN_TOKENS,
           "min_prompts": MIN_PROMPTS, "min_concurrency": MIN_CONCURRENCY, "num_speculative_tokens": k,
           "drafts_per_request": [r.get("drafts") for r in per_request], "drafts_from_counters": counters,
           "trimmed": trimmed, "requests": [{key: r[key] for key in ("prompt", "tokens", "near_ties", "violations",
                                                                       "first_violations")} for r in per_request]}
    if violations:
        first = next(r for r in per_request if r["violations"])
        v = first["first_violations"][0]
        why = (f"{violations} of {tokens} emitted tokens are not the reference argmax (prompt {first['prompt']!r}, "
               f"token {v['index']}: emitted {v['emitted']} at rank {v['rank']}, {v['gap_nats']} nats below "
               f"token {v['reference']})")
        out.update(proven=False, why=why)
    elif tokens < MIN_TOKENS or len(per_request) < MIN_PROMPTS or concurrency < MIN_CONCURRENCY:
        out.update(proven=False, why=f"too little re-scored: {tokens} tokens from {len(per_request)} prompts at "
                                     f"concurrency {concurrency} (needs >= {MIN_TOKENS}, {MIN_PROMPTS}, "
                                     f"{MIN_CONCURRENCY})")
    else:
        out.update(proven=True, why=f"{tokens} emitted tokens from {len(per_request)} prompts at concurrency "
                                    f"{concurrency}: 0 violations, {near} near-tie(s) within {tolerance} nats"
                                    + ("" if trimmed is not False else "; no request had fewer than K drafts "
                                       "verified in a step (AV never trimmed)"))
    return out


def _generate(client, model: str, prompt: str, max_tokens: int, temperature: float) -> dict:
    return client.complete(prompt, max_tokens=max_tokens, model=model, temperature=temperature, ignore_eos=True,
                           return_token_ids=True, timeout_s=600)


def _rescore(client, model: str, prompt_ids: list[int], output_ids: list[int]) -> list:
    reply = client.complete(list(prompt_ids) + list(output_ids), max_tokens=1, model=model, temperature=0.0,
                            prompt_logprobs=1, timeout_s=600)
    return reply["choices"][0]["prompt_logprobs"]


def rescore(client, model: str, *, prompts=RESCORE_PROMPTS, max_tokens: int = GEN_TOKENS, k: int | None = None,
            temperature: float = 0.0, counters_delta=None, progress=lambda msg: None) -> dict:
    """Generate all prompts at once, re-score each one, and summarize (see the module docstring).
    `temperature` > 0 is the negative control: sampled tokens judged as if greedy must show violations.
    `counters_delta`: a callable returning the spec-decode counter difference over the generation (or None)."""
    progress(f"live: {len(prompts)} greedy prompts at once, {max_tokens} tokens each, then re-scored by prefill")
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        replies = list(pool.map(lambda p: _generate(client, model, p, max_tokens, temperature), prompts))
    counters = counters_delta() if counters_delta else None
    per_request = []
    for prompt, reply in zip(prompts, replies):
        choice = reply["choices"][0]
        prompt_ids = reply.get("prompt_token_ids") or choice.get("prompt_token_ids")
        output_ids = choice.get("token_ids")
        if not prompt_ids or output_ids is None:
            raise ValueError("the server returned no token ids (return_token_ids): cannot re-score")
        judged = judge_tokens(output_ids, len(prompt_ids), _rescore(client, model, prompt_ids, output_ids))
        per_request.append({"prompt": prompt, **judged, "drafts": drafts_per_request(reply)})
    return summarize(per_request, concurrency=len(prompts), k=k, counters=counters)
