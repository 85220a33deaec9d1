"""swa_layout: our per-token windows -> vLLM's dense SWA rows + CSR, checked against brute force.

Runs the Triton kernels on CPU tensors through the Triton interpreter. The builder that calls this
inside real vLLM classes is covered by tests/slow/test_plugin_real.py.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
from rocm_dspark.attention import _triton  # noqa: E402,F401  first: sets TRITON_INTERPRET on a CPU-only host

pytest.importorskip("triton")

from rocm_dspark.attention import SwaMetadataBuffers, compute_swa_metadata  # noqa: E402
from rocm_dspark.vllm_plugin.swa_layout import write_vllm_swa_rows  # noqa: E402


def brute_force(qsl, seq_lens, table, slots, *, window, block_size, causal, num_tokens, width):
    """Per token: the owning request from qsl, its window's global slots (vLLM's definition)."""
    dense, lens = [], []
    for t in range(num_tokens):
        owner = next((r for r in range(len(seq_lens)) if qsl[r] <= t < qsl[r + 1]), None)
        if owner is None or slots[t] < 0:
            dense.append([-1] * width), lens.append(0)
            continue
        qlen = qsl[owner + 1] - qsl[owner]
        prefix = seq_lens[owner] - qlen
        pos = prefix + t - qsl[owner]
        positions = range(max(pos - window + 1, 0), pos + 1) if causal else range(max(prefix - window, 0), seq_lens[owner])
        row = [table[owner][p // block_size] * block_size + p % block_size for p in positions]
        dense.append(row + [-1] * (width - len(row))), lens.append(len(row))
    kept = [[s for s in row[:n] if s >= 0] for row, n in zip(dense, lens)]
    indptr = [0]
    for row in kept:
        indptr.append(indptr[-1] + len(row))
    return dense, lens, indptr, [s for row in kept for s in row]


def random_batch(rng, block_size, holes):
    num_reqs = rng.randint(1, 7)
    lens = [rng.randint(1, 6) for _ in range(num_reqs)]
    seq = [rng.choice([rng.randint(q, 50), rng.randint(150, 600)]) for q in lens]
    nblk = max(seq) // block_size + 2
    table = [[rng.randint(0, 500) for _ in range(nblk)] for _ in range(num_reqs + 1)]
    if holes:  # a freed block reads as -1: vLLM keeps its negative slot in the row, drops it from the CSR
        for row in table:
            row[rng.randrange(nblk)] = -1
    qsl = [0]
    for q in lens:
        qsl.append(qsl[-1] + q)
    qsl.append(qsl[-1])  # one padding request of length 0
    slots = [rng.randint(0, 10_000) for _ in range(qsl[-1])] + [-1] * rng.randint(0, 3)
    if len(slots) > 2:
        slots[rng.randrange(qsl[-1])] = -1  # an invalid token inside a request
    return qsl, seq + [0], table, slots


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("holes", [False, True])
def test_rows_and_csr_match_brute_force(causal, holes):
    rng = random.Random(hash((causal, holes)) & 0xFFFF)
    window = 128
    width = window if causal else 192  # vLLM's DSpark non-causal width for W=128, K=5
    buffers = SwaMetadataBuffers.allocate(64, "cpu")
    cap = 64
    dense = torch.full((cap, 1, width + 8), 7, dtype=torch.int32)  # row stride wider than width on purpose
    lens = torch.zeros(cap, dtype=torch.int32)
    counts = torch.zeros(cap, dtype=torch.int32)
    indptr = torch.zeros(cap + 1, dtype=torch.int32)
    ragged = torch.zeros(cap * width, dtype=torch.int32)
    addresses = {t.data_ptr() for t in (dense, lens, indptr, ragged)}
    for trial in range(6):
        bs = (32, 64)[trial % 2]
        qsl, seq, table, slots = random_batch(rng, bs, holes)
        n = len(slots)
        md = compute_swa_metadata(
            torch.tensor(qsl, dtype=torch.int32), torch.tensor(seq, dtype=torch.int32),
            torch.tensor(table, dtype=torch.int32), torch.tensor(slots, dtype=torch.int64), buffers,
            window=window, block_size=bs, causal=causal, num_tokens=n,
        )
        out_ragged, out_indptr = write_vllm_swa_rows(md, num_rows=n, width=width, dense=dense[:, 0, :], lens=lens,
                                                     counts=counts, indptr=indptr, ragged=ragged)
        want_dense, want_lens, want_indptr, want_ragged = brute_force(
            qsl, seq, table, slots, window=window, block_size=bs, causal=causal, num_tokens=n, width=width)
        assert dense[:n, 0, :width].tolist() == want_dense
        assert (dense[:n, 0, width:] == 7).all()  # nothing written past the row width
        assert lens[:n].tolist() == want_lens
        assert out_indptr.tolist() == want_indptr
        assert out_ragged[: want_indptr[-1]].tolist() == want_ragged
        assert out_ragged.numel() == n * width and out_ragged.data_ptr() == ragged.data_ptr()
        assert {t.data_ptr() for t in (dense, lens, indptr, ragged)} == addresses


def test_rejects_buffers_that_are_too_small():
    buffers = SwaMetadataBuffers.allocate(8, "cpu")
    md = compute_swa_metadata(torch.tensor([0, 2], dtype=torch.int32), torch.tensor([10], dtype=torch.int32),
                              torch.zeros(1, 4, dtype=torch.int32), torch.arange(2), buffers,
                              window=128, block_size=32)
    with pytest.raises(ValueError, match="too small"):
        write_vllm_swa_rows(md, num_rows=2, width=128, dense=torch.zeros(8, 128, dtype=torch.int32),
                            lens=torch.zeros(8, dtype=torch.int32), counts=torch.zeros(8, dtype=torch.int32),
                            indptr=torch.zeros(3, dtype=torch.int32), ragged=torch.zeros(100, dtype=torch.int32))
