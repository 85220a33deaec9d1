"""Negative control: SWA metadata planned on the host from the host's query lengths.

This is what the refused upstream UNIFORM_BATCH builders effectively do: they trust the host's
per-request query lengths (every verify request = 1+K tokens, or the host's even spread of the
draft budget) and the host's seq_lens upper bound. Under adaptive verification the device trims
drafts, so the real boundaries differ and this plan gives tokens to the wrong request and
position, silently. It writes into the same buffers and feeds the same attention kernel as
`compute_swa_metadata`, so a test (or the startup probe) can show that planning from host
lengths is wrong exactly when the device layout differs, and that the device path is right.
"""

from __future__ import annotations

import torch

from rocm_dspark.attention.metadata import SwaMetadata, SwaMetadataBuffers
from rocm_dspark.errors import UsageError


def uniform_query_start_loc(num_reqs: int, query_len: int) -> torch.Tensor:
    """The layout the host believes: every request has `query_len` tokens."""
    if num_reqs < 0 or query_len < 0:
        raise UsageError(f"need num_reqs ({num_reqs}) >= 0 and query_len ({query_len}) >= 0")
    return torch.tensor([r * query_len for r in range(num_reqs + 1)], dtype=torch.int32)


def host_planned_metadata(
    query_start_loc_cpu: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    block_table: torch.Tensor,
    buffers: SwaMetadataBuffers,
    *,
    window: int,
    block_size: int,
    causal: bool = True,
    num_tokens: int,
) -> SwaMetadata:
    """Per-token request/position/window planned in Python from the host lengths, then copied to `buffers`."""
    if not 1 <= num_tokens <= buffers.max_tokens:
        raise UsageError(f"num_tokens={num_tokens} must be in 1..{buffers.max_tokens}")
    qsl = [int(x) for x in query_start_loc_cpu]
    lens = [int(x) for x in seq_lens_cpu]
    req, pos = [-1] * num_tokens, [-1] * num_tokens
    start, end, live = ([0] * num_tokens for _ in range(3))
    for r in range(len(lens)):
        q0, q1 = qsl[r], qsl[r + 1]
        for t in range(q0, min(q1, num_tokens)):
            p = lens[r] - (q1 - q0) + (t - q0)
            if p < 0:
                continue
            req[t], pos[t], live[t] = r, p, 1
            if causal:
                start[t], end[t] = max(p - window + 1, 0), p + 1
            else:
                start[t], end[t] = max(lens[r] - (q1 - q0) - window, 0), lens[r]
    for buf, values in zip(
        (buffers.req, buffers.pos, buffers.start, buffers.end, buffers.live), (req, pos, start, end, live)
    ):
        buf[:num_tokens].copy_(torch.tensor(values, dtype=torch.int32))
    return SwaMetadata(
        buffers=buffers,
        block_table=block_table,
        block_size=int(block_size),
        window=int(window),
        causal=bool(causal),
        num_tokens=int(num_tokens),
    )
