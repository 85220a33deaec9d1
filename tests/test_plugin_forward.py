"""The plugin's decode wrapper without vLLM: the rule that picks the kernel, the hand-over to vLLM's
method, and our attention through the wrapper against the PyTorch reference (Triton interpreted
on CPU tensors). The layer is a namespace carrying the attributes `_forward_decode` reads; vLLM's
method is an instrument that records its call. The real class is exercised in
tests/slow/test_plugin_forward_real.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rocm_dspark.attention import SwaMetadataBuffers, compute_swa_metadata, make_case, reference_sparse_swa
from rocm_dspark.vllm_plugin.swa_forward import ORIGINAL, attention_plan, choose, make_forward_decode


def _case(fnuz: bool):
    # A trimmed verify batch: device lengths 3, 1, 6 and a padded tail (slot -1), vLLM's block size 32.
    return make_case([3, 1, 6], [40, 7, 90], heads=16, window=64, block_size=32, kv_format="fp8_ds_mla",
                     fnuz=fnuz, num_reqs_padded=5, num_tokens_padded=14, sink=True, seed=3)


def _metadata(case):
    buffers = SwaMetadataBuffers.allocate(case.num_tokens, "cpu")
    return compute_swa_metadata(case.query_start_loc, case.seq_lens, case.block_table, case.slot_mapping, buffers,
                                num_tokens=case.num_tokens, **case.metadata_args())


def _layer(case):
    return SimpleNamespace(attn_sink=torch.nn.Parameter(case.sink, requires_grad=False),
                           swa_cache_layer=SimpleNamespace(kv_cache=case.kv_cache), scale=case.scale,
                           nope_head_dim=448, rope_head_dim=64, _use_aiter_sparse_mla=False)


def _args(case, swa, **over):
    args = dict(swa_only=True, output=torch.empty_like(case.q), output_mxfp8=None, use_aiter_sparse_mla=False,
                swa_cache=case.kv_cache, swa=swa, q=case.q, nope_head_dim=448, rope_head_dim=64)
    args.update(over)
    return args


def test_rule_runs_ours_only_in_the_settled_case():
    case = _case(True)
    swa = _metadata(case)
    assert choose(**_args(case, swa)).ours
    cases = {
        "compressed": _args(case, swa, swa_only=False),
        "MXFP8": _args(case, swa, output=None, output_mxfp8=(torch.empty(1), torch.empty(1))),
        "aiter": _args(case, swa, use_aiter_sparse_mla=True),
        "SwaMetadata": _args(case, None),
        "584-byte": _args(case, swa, swa_cache=torch.zeros(4, 32, 528, dtype=torch.uint8)),
        "448+64": _args(case, swa, nope_head_dim=512, rope_head_dim=0),
        "decode rows": _args(case, swa, q=case.q[:3]),
        "bf16": _args(case, swa, output=torch.empty_like(case.q, dtype=torch.float32)),
    }
    for word, args in cases.items():
        got = choose(**args)
        assert not got.ours and word in got.reason, (word, got)


def test_other_cases_reach_vllms_method_with_every_argument():
    case = _case(False)
    calls = []

    def vllm_forward_decode(self, **kw):  # instrument standing in for vLLM's method
        calls.append((self, kw))
        return 7

    wrapped = make_forward_decode(vllm_forward_decode, fnuz=False)
    assert getattr(wrapped, ORIGINAL) is vllm_forward_decode
    layer = _layer(case)
    got = wrapped(layer, case.q, "pos", "kv", SimpleNamespace(rocm_dspark_swa=_metadata(case)), "md", False,
                  case.q.clone())
    assert got == 7 and calls[0][0] is layer
    assert calls[0][1]["positions"] == "pos" and calls[0][1]["swa_only"] is False and calls[0][1]["output_mxfp8"] is None


@pytest.mark.parametrize("fnuz", [True, False])
def test_wrapped_decode_equals_the_reference(fnuz):
    case = _case(fnuz)
    swa = _metadata(case)

    def never(*a, **k):
        raise AssertionError("vLLM's method must not run in the settled case")

    wrapped = make_forward_decode(never, fnuz=fnuz)
    output = torch.full_like(case.q, float("nan"))
    rotated = wrapped(_layer(case), q=case.q, positions=None, kv_cache=None,
                      swa_metadata=SimpleNamespace(rocm_dspark_swa=swa), attn_metadata=None, swa_only=True,
                      output=output)
    assert rotated == 0  # nothing rotated: vLLM's forward_mqa inverse-RoPEs every row after us
    ref = reference_sparse_swa(case.q, case.kv_cache, case.query_start_loc, case.seq_lens, case.block_table,
                               case.slot_mapping, **case.reference_args())
    big = float(ref.abs().max())
    assert big > 0.05 and not torch.isnan(output).any()
    assert float((output.float() - ref).abs().max()) <= 1e-2 * big + 2e-3
    # Decoding with the other fp8 flavour gives a different answer: the flag matters and is passed.
    other = torch.empty_like(case.q)
    make_forward_decode(never, fnuz=not fnuz)(_layer(case), q=case.q, positions=None, kv_cache=None,
                                              swa_metadata=SimpleNamespace(rocm_dspark_swa=swa), attn_metadata=None,
                                              swa_only=True, output=other)
    assert float((other.float() - ref).abs().max()) > 0.05


def test_attention_plan_names_the_kernel_per_case():
    plan = attention_plan(installed=True, fnuz=True)
    assert [row["runs"] for row in plan] == ["rocm-dspark", "vLLM", "vLLM", "vLLM"]
    assert plan[0]["reason"].startswith("FNUZ e4m3") and "not yet run on MI300-class hardware" in plan[0]["reason"]
    off = attention_plan(installed=False, why_not="platform is cpu")
    assert all(row["runs"] == "vLLM" and "platform is cpu" in row["reason"] for row in off)
