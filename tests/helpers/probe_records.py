"""Probe records for the gate tests, built and signed by the real code (tests/test_probe_gate.py explains the
host the fixture mi300x_host stands in for)."""

from __future__ import annotations

import itertools
import os

from rocm_dspark.probe import fingerprint, store
from rocm_dspark.probe.fingerprint import FIELDS
from rocm_dspark.probe.record import LevelResult, build_record
from rocm_dspark.recipe.resolve import Selection, resolve_plan
from tests.helpers import FIXTURES

SELECTION = Selection(model="V4.1-Flash", gpu="mi300x", vllm_version="0.32.0")


# Level results as a GPU host would write them (formats of static.py, kernel.py + selfcheck, live.py).
STATIC_OK = LevelResult("static", True, True, "8x AMD Instinct MI300X (gfx942) ...; checks pass with the rocm-dspark plugin",
                        "valid for gating: checks ran on this host's ROCm platform", "2026-11-29T10:00:00Z", 30.0,
                        {"forced_platform": False, "checks_used": "with_plugin", "checks": []})


KERNEL_OK = LevelResult("kernel", True, True, "5 device layouts match the reference within tolerance; host-planned control caught; AMD Instinct MI300X, graph replay",
                        "valid for gating: AMD Instinct MI300X (gfx942:sramecc+:xnack-), HIP graph replay",
                        "2026-11-29T10:00:30Z", 20.0,
                        {"passed": True, "device": "cuda", "interpreted": False, "layouts_checked": 5,
                         "negative_control_caught": True, "negative_control_agrees_on_uniform": True,
                         "graph_replay": True, "device_name": "AMD Instinct MI300X", "arch": "gfx942:sramecc+:xnack-",
                         "hip_version": "6.2.41133-dd7f95766"})


LIVE_OK = LevelResult("live", True, True, "ready after 1500.0 s; deterministic check passed; ...",
                      "valid for gating: the plan's own command with enable_adaptive_verification on",
                      "2026-11-29T10:01:00Z", 1600.0,
                      {"source": "plan", "attached": False, "adaptive_verification": True, "ready": True,
                       "token_correct": True, "reference_independent": True})


LIVE_REFUSED = LIVE_OK._replace(passed=False, reason="vLLM refused to start: ValueError: Adaptive verification trims ...",
                                evidence={**LIVE_OK.evidence, "ready": False})


_SEQ = itertools.count(10)  # never exhausted however many tests share a worker


def write(state, fp, levels=(STATIC_OK, KERNEL_OK, LIVE_OK), *, override=None, record_id=None) -> tuple[str, str]:
    """Write a record built by the real code; returns (id, path). Later calls get later ids."""
    n = next(_SEQ)
    rid = record_id or f"20261129T{10 + n // 100:02d}{n % 100:02d}00Z-{os.urandom(4).hex()}"
    data = build_record(record_id=rid, created_at="2026-11-29T10:00:00Z", finished_at="2026-11-29T10:30:00Z",
                        toolkit_version=fp["toolkit_version"], host={"hostname": "mi300x-host", "platform": "Linux"},
                        selection=SELECTION._asdict(), fingerprint=fp,
                        levels_requested=[lv.name for lv in levels] or ["static"], levels=list(levels),
                        live_override=override)
    path = store.write_record(store.records_dir(state), data)
    return rid, str(path)


def here(catalog, selection=SELECTION) -> dict:
    return fingerprint.current_fingerprint(catalog, resolve_plan(catalog, selection))


ROCMINFO_MI300X_X8 = FIXTURES / "host" / "rocminfo_text__mi300x_x8__rocm6.2.3__rocm-issue4021.txt"


def fingerprint_dict(**changes) -> dict:
    fp = {key: None for key, _, _ in FIELDS}
    fp.update(toolkit_version="0.1.0", vllm_version="0.32.0", torch_version="2.13.0+cpu", gpu_count=0,
              model_id="deepseek-ai/DeepSeek-V4.1-Flash", model_revision="dba1be0", gpu="mi300x", plan_vllm="0.32.0",
              image="vllm/vllm-openai-rocm@sha256:00", tp=8, dp=1, ep=1, nodes=1, num_speculative_tokens=5,
              max_num_seqs=128, launch={"argv": ["vllm", "serve", "x"], "env": {"A": "1"}})
    fp.update(changes)
    return fp


def level(name="static", passed=True, **evidence) -> LevelResult:
    return LevelResult(name, passed, False, "why", "not valid for gating: test", "2026-11-29T10:00:00Z", 1.5, evidence)


def make(levels=(), requested=("static",), **changes) -> dict:
    args = dict(record_id="20261129T100000Z-0123abcd", created_at="2026-11-29T10:00:00Z",
                finished_at="2026-11-29T10:00:02Z", toolkit_version="0.1.0", host={"hostname": "h", "platform": "p"},
                selection={"model": "V4.1-Flash"}, fingerprint=fingerprint_dict(), levels_requested=requested,
                levels=list(levels) or [level()], live_override=None)
    args.update(changes)
    return build_record(**args)
