"""Device SWA metadata (Triton, interpreter on CPU) against a brute-force Python definition.

The oracle below walks requests and tokens on the host, straight from docs/kernels.md ("Per-token key set");
the kernel instead binary-searches the device query_start_loc per token. Integers: exact match.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rocm_dspark.attention.metadata import SwaMetadataBuffers, compute_swa_metadata
from rocm_dspark.attention.cases import make_layout
from rocm_dspark.errors import UsageError


def brute_force(qsl, seq_lens, slot_mapping, num_tokens, window, causal, replay):
    """Per-token (req, pos, start, end, live) lists from the definition."""
    req, pos, start, end, live = [-1] * num_tokens, [-1] * num_tokens, [0] * num_tokens, [0] * num_tokens, [0] * num_tokens
    for r in range(len(seq_lens)):
        q0, q1 = qsl[r], qsl[r + 1]
        for t in range(q0, min(q1, num_tokens)):
            p = seq_lens[r] - (q1 - q0) + (t - q0)
            if slot_mapping[t] < 0 or p < 0:
                continue
            req[t], pos[t], live[t] = r, p, 1
            if causal:
                start[t] = max(p - window + 1, 0, replay[r] if replay else 0)
                end[t] = p + 1
            else:
                start[t], end[t] = max(seq_lens[r] - (q1 - q0) - window, 0), seq_lens[r]
            start[t] = min(start[t], end[t])
    return req, pos, start, end, live


def run_metadata(layout, num_tokens, window, causal, replay=None, max_tokens=None, garbage=True):
    buffers = SwaMetadataBuffers.allocate(max_tokens or num_tokens, "cpu")
    if garbage:  # stale values from an earlier replay must be overwritten
        for b in (buffers.req, buffers.pos, buffers.start, buffers.end, buffers.live):
            b.copy_(torch.randint(-50, 50, b.shape, dtype=torch.int32))
    replay_t = torch.tensor(replay, dtype=torch.int32) if replay is not None else None
    md = compute_swa_metadata(layout["query_start_loc"], layout["seq_lens"], layout["block_table"],
                              layout["slot_mapping"], buffers, window=window, block_size=16, causal=causal,
                              replay_start=replay_t, num_tokens=num_tokens)
    return [getattr(md.buffers, name)[: md.num_tokens].tolist() for name in ("req", "pos", "start", "end", "live")]


def expected(layout, num_tokens, window, causal, replay=None):
    return list(brute_force(layout["query_start_loc"].tolist(), layout["seq_lens"].tolist(),
                            layout["slot_mapping"].tolist(), num_tokens, window, causal, replay))


@pytest.mark.parametrize("causal", [True, False])
def test_trimmed_layout_with_padding_requests_and_tail(causal):
    # Zero-length requests between real ones, two padding requests, 5 padded tail tokens.
    qlens, ctx = [3, 0, 1, 6, 0, 2], [5, 0, 40, 200, 0, 31]
    layout = make_layout(qlens, ctx, num_reqs_padded=8, num_tokens_padded=17, block_size=16)
    got = run_metadata(layout, 17, window=32, causal=causal)
    assert got == expected(layout, 17, 32, causal)
    req, pos, start, end, live = got
    assert live == [1] * 12 + [0] * 5 and req[:4] == [0, 0, 0, 2] and req[12:] == [-1] * 5
    if causal:  # token 4 is request 3's first token at position 200: window [169, 201)
        assert (pos[4], start[4], end[4]) == (200, 169, 201)
    else:  # the DSpark block sees the trailing 32 context positions plus all 6 block tokens
        assert (start[4], end[4]) == (200 - 32, 206)


def test_invalid_slot_and_replay_start():
    qlens, ctx = [4, 2], [50, 3]
    layout = make_layout(qlens, ctx, num_reqs_padded=2, num_tokens_padded=8, block_size=16, invalid_tokens=(1,))
    replay = [45, 1]
    got = run_metadata(layout, 8, window=32, causal=True, replay=replay)
    assert got == expected(layout, 8, 32, True, replay)
    req, pos, start, end, live = got
    assert live[1] == 0 and req[1] == -1 and end[1] == 0  # slot_mapping -1: dead
    assert start[0] == 45 and start[4] == 1  # replay_start lifts the window's lower bound


def test_inconsistent_lengths_are_dead_not_negative_positions():
    layout = make_layout([3], [0], num_reqs_padded=1, num_tokens_padded=4, block_size=16)
    layout["seq_lens"] = torch.tensor([2], dtype=torch.int32)  # shorter than its 3 query tokens
    got = run_metadata(layout, 4, window=8, causal=True)
    assert got[4] == [0, 0, 0, 0] and got[0] == [-1] * 4


def test_empty_batch_all_dead():
    layout = make_layout([], [], num_reqs_padded=3, num_tokens_padded=6, block_size=16)
    assert run_metadata(layout, 6, window=8, causal=True)[4] == [0] * 6


@settings(max_examples=60, deadline=None)
@given(
    qlens=st.lists(st.integers(0, 6), min_size=1, max_size=9),
    ctx_seed=st.integers(0, 10**6),
    pad_reqs=st.integers(0, 3),
    tail=st.integers(0, 7),
    window=st.sampled_from([1, 8, 32, 128]),
    causal=st.booleans(),
    with_replay=st.booleans(),
)
def test_random_layouts_match_brute_force(qlens, ctx_seed, pad_reqs, tail, window, causal, with_replay):
    gen = torch.Generator().manual_seed(ctx_seed)
    ctx = torch.randint(0, 300, (len(qlens),), generator=gen).tolist()
    num_tokens = max(1, sum(qlens) + tail)
    invalid = [t for t in range(sum(qlens)) if torch.rand((), generator=gen) < 0.1]
    layout = make_layout(qlens, ctx, num_reqs_padded=len(qlens) + pad_reqs, num_tokens_padded=num_tokens,
                         block_size=16, invalid_tokens=invalid, seed=ctx_seed)
    replay = None
    if with_replay:
        replay = [int(torch.randint(0, c + 1, (), generator=gen)) for c in ctx] + [0] * pad_reqs
    got = run_metadata(layout, num_tokens, window, causal, replay, max_tokens=num_tokens + 5)
    assert got == expected(layout, num_tokens, window, causal, replay)


def test_no_host_synchronisation(monkeypatch):
    """The wrapper must not read device values on the host: forbid the usual ways of doing so."""
    layout = make_layout([2, 5], [10, 60], num_reqs_padded=3, num_tokens_padded=9, block_size=16)
    buffers = SwaMetadataBuffers.allocate(9, "cpu")

    def forbidden(*args, **kwargs):
        raise AssertionError("host synchronisation in compute_swa_metadata")

    from rocm_dspark.attention import _triton

    # Patch only while the host wrapper runs, not while the interpreter executes the kernel
    # (the interpreter legitimately reads CPU memory: it *is* the device here).
    real_launch = _triton.launch

    def launch(*args, **kwargs):
        monkeypatch.undo()
        return real_launch(*args, **kwargs)

    monkeypatch.setattr(_triton, "launch", launch)
    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__index__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    md = compute_swa_metadata(layout["query_start_loc"], layout["seq_lens"], layout["block_table"],
                              layout["slot_mapping"], buffers, window=16, block_size=16)
    assert md.buffers.live[: md.num_tokens].tolist() == [1] * 7 + [0] * 2


def test_search_steps_cover_many_requests():
    # 200 one-token requests: the fixed-step binary search must reach every one.
    qlens = [1] * 200
    layout = make_layout(qlens, [3] * 200, num_reqs_padded=256, num_tokens_padded=210, block_size=16)
    got = run_metadata(layout, 210, window=4, causal=True)
    assert got[0] == list(range(200)) + [-1] * 10
    assert math.ceil(math.log2(257)) + 1 >= 9


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.update(query_start_loc=a["query_start_loc"][:-1]), "one more entry"),
        (lambda a: a.update(seq_lens=a["seq_lens"].long()), "seq_lens must be int32"),
        (lambda a: a.update(block_table=a["block_table"][0]), "block_table must have 2"),
        (lambda a: a.update(num_tokens=99), "num_tokens=99"),
        (lambda a: a.update(window=0), "window (0)"),
        (lambda a: a.update(replay_start=torch.zeros(1, dtype=torch.int32)), "replay_start has 1"),
    ],
)
def test_bad_input_is_a_usage_error(change, message):
    layout = make_layout([2, 3], [4, 5], num_reqs_padded=2, num_tokens_padded=6, block_size=16)
    args = dict(layout, window=8, num_tokens=6)
    change(args)
    buffers = SwaMetadataBuffers.allocate(8, "cpu")
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compute_swa_metadata(args.pop("query_start_loc"), args.pop("seq_lens"), args.pop("block_table"),
                             args.pop("slot_mapping"), buffers, block_size=16, **args)


def test_allocate_rejects_zero():
    with pytest.raises(UsageError, match="max_tokens"):
        SwaMetadataBuffers.allocate(0, "cpu")
