"""Negative control: SWA metadata planned from the host's query lengths instead of the device's.

This is what the refused upstream UNIFORM_BATCH builders effectively do: they trust the host's
per-request query lengths (every verify request = 1+K tokens, or the host's even spread of the
draft budget) and the host's seq_lens upper bound. Under adaptive verification the device trims
drafts, so the real boundaries differ and this plan gives tokens to the wrong request and
position, silently. It is `compute_swa_metadata` itself, fed the host's lengths, so a test (or the
startup probe) can show that planning from host lengths is wrong exactly when the device layout
differs, and that the device path is right.
"""

from __future__ import annotations

import torch

from rocm_dspark.attention.metadata import SwaMetadata, SwaMetadataBuffers, compute_swa_metadata
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
    """compute_swa_metadata fed the host's lengths instead of the device's, with no token trimmed (the host
    knows of none): correct only when the device and host layouts agree."""
    if not 1 <= num_tokens <= buffers.max_tokens:
        raise UsageError(f"num_tokens={num_tokens} must be in 1..{buffers.max_tokens}")
    device = buffers.req.device
    every_slot_valid = torch.zeros(num_tokens, dtype=torch.int32, device=device)
    return compute_swa_metadata(
        query_start_loc_cpu.to(device),
        seq_lens_cpu.to(device),
        block_table,
        every_slot_valid,
        buffers,
        window=window,
        block_size=block_size,
        causal=causal,
        num_tokens=num_tokens,
    )
