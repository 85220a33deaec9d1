"""The evidence fields the gate reads from a probe level, as a typed record.

A level's `evidence` is the JSON its record stores (rocm_dspark.probe.record); the gate never reads it by
key. A field the level did not record, or recorded as anything but a JSON boolean, is None, and the gate
treats None as "not shown" (so a hand-edited "yes" proves nothing).
"""

# No __future__ annotations: NamedTuple would compile each string annotation at import (benchmarks/recipe_latency.py).

from typing import NamedTuple


class GateEvidence(NamedTuple):
    forced_platform: bool | None = None  # static: vLLM's ROCm platform was forced (no AMD GPU)
    interpreted: bool | None = None  # kernel: ran in the Triton interpreter, not on a GPU
    graph_replay: bool | None = None  # kernel: a captured graph was replayed
    negative_control_caught: bool | None = None  # kernel: the host-planned control was told apart
    attached: bool | None = None  # live: a server the probe did not start
    command_verified: bool | None = None  # live, attached: /proc showed the plan's command serving
    adaptive_verification: bool | None = None  # live: the command had enable_adaptive_verification on
    ready: bool | None = None  # live: /health and /v1/models answered
    token_correct: bool | None = None  # live: re-scoring proved the emitted tokens (probe.rescore)
    reference_independent: bool | None = None  # live: the re-scoring reference is out of the drafter's reach
    reference_unreliable: bool | None = None  # live: the reference's self-check failed (vllm#53488)

    @classmethod
    def of(cls, evidence: dict) -> "GateEvidence":
        def flag(name: str) -> bool | None:
            value = evidence.get(name) if isinstance(evidence, dict) else None
            return value if isinstance(value, bool) else None

        return cls(*(flag(name) for name in cls._fields))
