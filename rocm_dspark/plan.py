"""The launch plan: what resolve() returns and every renderer, launcher, probe and validator consumes."""

from __future__ import annotations

import json
from typing import NamedTuple

# NamedTuple rather than dataclasses: importing dataclasses (and inspect behind it) costs ~16 ms,
# most of what `rocm-dspark recipe` would otherwise spend beyond importing yaml and click.


class Note(NamedTuple):
    """Why one non-obvious value in the plan is what it is."""

    topic: str
    text: str


class LaunchPlan(NamedTuple):
    model_id: str                 # Hugging Face id passed to `vllm serve`
    model_key: str                # catalog key, e.g. "DeepSeek-V4.1-Flash"
    served_name: str              # --served-model-name
    gpu: str                      # catalog GPU key, e.g. "mi355x"
    arch: str                     # gfx942 / gfx950
    profile: str                  # profile id, e.g. "DeepSeek-V4.1-Flash/mi355x"
    status: str                   # verified / experimental / unverified
    status_date: str
    evidence: tuple[str, ...]
    vllm_version: str
    image: str                    # container image pinned by digest
    host: str
    port: int
    argv: tuple[str, ...]         # full argv, starting with the program ("vllm", "serve", ...)
    env: dict[str, str]
    speculative_config: dict      # the exact object serialised into --speculative-config
    adaptive_verification: bool
    # When adaptive verification is on, the same launch with the flag off: the start-up fallback.
    block_argv: tuple[str, ...] | None = None
    notes: tuple[Note, ...] = ()

    def to_json_dict(self) -> dict:
        d = self._asdict()
        d["env"] = dict(self.env)
        d["speculative_config"] = dict(self.speculative_config)
        d["argv"] = list(self.argv)
        d["block_argv"] = list(self.block_argv) if self.block_argv else None
        d["evidence"] = list(self.evidence)
        d["notes"] = [n._asdict() for n in self.notes]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict(), indent=2, sort_keys=False)
