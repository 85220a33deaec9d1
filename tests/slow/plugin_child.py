"""What the two real-vLLM plugin suites (test_plugin_real.py, test_plugin_forward_real.py) share: running one
of their scenarios in a fresh child Python and telling whether vLLM is importable at all.

Each scenario runs the test file itself as a script in a new interpreter, because vLLM's ROCm platform must
be forced before vLLM binds `current_platform`, which happens once per process. The child prints one JSON
line; the parent reads the last one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_child(script: str | Path, scenario: str, payload: dict | None = None, *, env_extra: dict | None = None,
              timeout: int = 600) -> dict:
    """Run `python script scenario payload-json` with the Triton interpreter on and no outside vLLM plugins;
    return the child's last JSON line (assert with its stderr tail when it fails)."""
    env = dict(os.environ)
    env.update({"TRITON_INTERPRET": "1", "VLLM_NO_USAGE_STATS": "1", "PYTHONPATH": str(REPO)})
    env.pop("VLLM_PLUGINS", None)  # only our entry point: no plugin from the environment
    env.pop("VLLM_USE_V2_MODEL_RUNNER", None)  # the scenarios set it themselves where they need it
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, str(script), scenario, json.dumps(payload or {})], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, f"child {scenario} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1])


def vllm_importable() -> bool:
    try:
        return importlib.util.find_spec("vllm") is not None
    except ValueError:  # a half-imported vllm module without __spec__
        return False


def common_metadata(lay: dict):
    """vLLM's CommonAttentionMetadata for one test layout (device and CPU query_start_loc may differ:
    that difference is what adaptive verification's trimming produces). Imports torch and vLLM, so call
    it only inside a child scenario."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    def i32(x):
        return torch.tensor(x, dtype=torch.int32)

    return CommonAttentionMetadata(
        query_start_loc=i32(lay["qsl"]), query_start_loc_cpu=i32(lay["qsl_cpu"]),
        seq_lens=i32(lay["seq_lens"]), num_reqs=len(lay["seq_lens"]), num_actual_tokens=lay["num_tokens"],
        max_query_len=lay["max_query_len_cpu"], max_seq_len=max(lay["seq_lens"]),
        block_table_tensor=i32(lay["block_table"]),
        slot_mapping=torch.tensor(lay["slot_mapping"], dtype=torch.int64), causal=lay["causal"],
        seq_lens_cpu_upper_bound=i32(lay["seq_lens"]),
    )
