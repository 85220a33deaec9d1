"""KV-cache formats (byte layout, exact dequantisation) and the memory-traffic model.

Layout facts come from docs/kernels.md ("KV cache layouts") (fp8_ds_mla V4: 576-byte data rows, then 8-byte
UE8M0 scale rows, page padded to a multiple of 576); the traffic model is checked against the
worked table computed independently when the model was written (docs/kernels.md).
"""

from __future__ import annotations

import pytest
import torch

from rocm_dspark.attention.cache_formats import gather_dequantized, pack_kv_cache
from rocm_dspark.attention.traffic import traffic_bytes
from rocm_dspark.errors import UsageError


@pytest.mark.parametrize("block_size, page", [(16, 9792), (32, 19008), (256, 149760)])
def test_ds_mla_page_stride_is_padded_to_576(block_size, page):
    cache, scale = pack_kv_cache(torch.zeros(2 * block_size, 512), "fp8_ds_mla", block_size)
    assert scale is None and cache.dtype == torch.uint8
    assert tuple(cache.shape) == (2, block_size, 584) and cache.stride(0) == page
    assert page % 576 == 0 and block_size * 584 <= page < block_size * 584 + 576


@pytest.mark.parametrize("fnuz", [False, True])
def test_ds_mla_bytes_at_the_documented_offsets(fnuz):
    bs = 16
    rows = torch.zeros(2 * bs, 512)
    rows[bs + 3, :448] = 1.0  # block 1, offset 3
    rows[bs + 3, 448:] = 1.5
    cache, _ = pack_kv_cache(rows, "fp8_ds_mla", bs, fnuz=fnuz)
    page = cache.stride(0)
    flat = torch.as_strided(cache, (2 * page,), (1,))
    data = flat[page + 3 * 576: page + 4 * 576]
    scales = flat[page + bs * 576 + 3 * 8: page + bs * 576 + 4 * 8]
    # amax 1.0: e = ceil(log2(1 / fp8max)) = -8 (OCP, max 448) or -7 (FNUZ, max 240); byte e + 127.
    assert scales.tolist() == [119 + fnuz] * 7 + [0]
    # 1.0 / 2**e = 256 (OCP) or 128 (FNUZ): both encode as 0x78 (exponent bias 7 vs 8).
    assert data[:448].unique().tolist() == [0x78]
    assert data[448:].view(torch.bfloat16).tolist() == [1.5] * 64  # RoPE: raw bf16 bytes
    # Reading FNUZ bytes as OCP (or back) is off by exactly 2x per element: the flag matters.
    wrong = gather_dequantized(cache, torch.tensor(bs + 3), "fp8_ds_mla", fnuz=not fnuz)[0]
    assert float(wrong) == (2.0 if fnuz else 0.5)


@pytest.mark.parametrize("kv_format, fnuz", [("bf16", False), ("fp8", False), ("fp8", True),
                                             ("fp8_ds_mla", False), ("fp8_ds_mla", True)])
def test_round_trip_error_is_within_the_format_precision(kv_format, fnuz):
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(64, 512, generator=gen) * torch.logspace(-3, 2, 64)[:, None]
    cache, scale = pack_kv_cache(rows, kv_format, 32, fnuz=fnuz)
    back = gather_dequantized(cache, torch.arange(64), kv_format, fnuz=fnuz, kv_scale=scale)
    err = (back - rows).abs()
    rope = slice(448, 512)
    # RoPE (and bf16 everywhere) is bf16 (8 significant bits): half an ulp is <= 2**-8 relative.
    if kv_format != "fp8":
        assert (err[:, rope] <= 2.0**-8 * rows[:, rope].abs() + 1e-30).all()
    if kv_format == "bf16":
        assert (err <= 2.0**-8 * rows.abs() + 1e-30).all()
    elif kv_format == "fp8_ds_mla":
        # e4m3 keeps 3 mantissa bits: half an ulp is 2**-4 relative for normals; each 64-dim group
        # has its own power-of-two scale, so small values stay accurate (subnormal step 2**-9 x group scale).
        groups = rows[:, :448].abs().view(64, 7, 64).amax(dim=2, keepdim=True)
        bound = 2.0**-4 * rows[:, :448].abs().view(64, 7, 64) + groups * 2.0**-9
        assert (err[:, :448].view(64, 7, 64) <= bound).all()
    else:  # per-tensor fp8: one scale for everything, so only large values keep relative precision
        step = rows.abs().amax() / (448.0 if not fnuz else 240.0)
        assert (err <= 2.0**-4 * rows.abs() + step * 2.0**-6).all()


def test_gather_of_any_slot_shape_equals_the_rows():
    gen = torch.Generator().manual_seed(1)
    cache, _ = pack_kv_cache(torch.randn(96, 512, generator=gen), "fp8_ds_mla", 32, fnuz=True)
    slots = torch.tensor([[95, 0, 33], [64, 31, 32]])
    full = gather_dequantized(cache, torch.arange(96), "fp8_ds_mla", fnuz=True)
    assert torch.equal(gather_dequantized(cache, slots, "fp8_ds_mla", fnuz=True), full[slots])


def test_bad_format_and_shape_are_usage_errors():
    with pytest.raises(UsageError, match="unknown kv_format"):
        pack_kv_cache(torch.zeros(32, 512), "fp4", 32)
    with pytest.raises(UsageError, match="rows must be"):
        pack_kv_cache(torch.zeros(30, 512), "bf16", 32)
    with pytest.raises(UsageError, match="kv_scale"):
        gather_dequantized(torch.zeros(1, 32, 512).to(torch.float8_e4m3fn), torch.arange(32), "fp8")


# Worked numbers (docs/kernels.md, "Memory-traffic model"): H=16, 8k context, fp8_ds_mla unless noted (MB = 1e6 bytes).
TABLE = [
    ("SWA-only 8x6", [6] * 8, 0, "fp8_ds_mla", 2.19, 5.16),
    ("SWA+top-512 8x6", [6] * 8, 512, "fp8_ds_mla", 16.65, 19.61),
    ("SWA-only 64x6", [6] * 64, 0, "fp8_ds_mla", 17.56, 41.29),
    ("SWA+top-512 64x6", [6] * 64, 512, "fp8_ds_mla", 133.16, 156.90),
    ("SWA-only 256x1", [1] * 256, 0, "fp8_ds_mla", 27.53, 27.53),
    ("bf16 SWA-only 16x4", [4] * 16, 0, "bf16", 4.24, 10.49),
]


@pytest.mark.parametrize("name, qlens, topk, kv_format, unique_mb, issued_mb", TABLE, ids=[t[0] for t in TABLE])
def test_traffic_model_reproduces_the_worked_table(name, qlens, topk, kv_format, unique_mb, issued_mb):
    t = traffic_bytes(qlens, [8192] * len(qlens), heads=16, window=128, kv_format=kv_format, topk=topk)
    assert round(t.unique / 1e6, 2) == pytest.approx(unique_mb, abs=0.011)
    assert round(t.issued / 1e6, 2) == pytest.approx(issued_mb, abs=0.011)


def test_traffic_model_head_blocks_and_short_contexts():
    one = traffic_bytes([6], [8192], heads=16, window=128, kv_format="bf16")
    two = traffic_bytes([6], [8192], heads=32, window=128, kv_format="bf16")
    # 32 heads = 2 head blocks: keys issued twice, q/out doubled, unique keys unchanged.
    assert two.issued - one.issued == 6 * 128 * 1024 + 6 * 16 * 512 * 4
    short = traffic_bytes([3], [2], heads=16, window=128, kv_format="bf16")
    assert short.unique - 3 * 16 * 512 * 4 - (4 * 2 + 4 + 12 * 3 + 4) == 5 * 1024  # all 5 positions once, 1 table entry
    with pytest.raises(UsageError):
        traffic_bytes([1], [1], heads=16, window=128, kv_format="int4")
