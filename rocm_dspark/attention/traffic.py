"""Memory-traffic model of one sparse-SWA call (docs/kernels.md, "Memory-traffic model"); pure Python.

unique = bytes the call must move at least once (top-k rows assumed not to overlap: an upper bound);
issued = bytes the kernel requests: every head block re-reads its token's keys, which may hit L2 /
Infinity Cache, so issued / time can exceed the peak.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from rocm_dspark.errors import UsageError

# Bytes per key row the kernel reads: fp8_ds_mla reads a 576-byte data row + its 8-byte scale row.
RECORD_BYTES = {"bf16": 1024, "fp8": 512, "fp8_ds_mla": 584}
INDEX_BYTES = 4


class TrafficBytes(NamedTuple):
    unique: int
    issued: int


def traffic_bytes(
    query_lens,
    context_lens,
    *,
    heads: int,
    window: int,
    kv_format: str,
    topk: int = 0,
    block_h: int = 16,
    block_size: int = 256,
) -> TrafficBytes:
    """Bytes for one causal (verify) call over requests with these query lengths and cached-context lengths.

    `topk` is the number of top-k rows per token (0 on SWA-only layers); output is bf16.
    """
    if kv_format not in RECORD_BYTES:
        raise UsageError(f"unknown kv_format {kv_format!r}: use one of {', '.join(RECORD_BYTES)}")
    if len(query_lens) != len(context_lens):
        raise UsageError("query_lens and context_lens need one entry per request")
    rec = RECORD_BYTES[kv_format]
    head_blocks = math.ceil(heads / block_h)
    tokens = sum(query_lens)
    q_and_out = tokens * heads * 512 * (2 + 2)
    window_union = window_keys = table_entries = 0
    for qlen, ctx in zip(query_lens, context_lens):
        if not qlen:
            continue
        seq = ctx + qlen
        union = min(seq, window + qlen - 1)
        window_union += union
        # Only the block-table entries covering the window are read, not the whole row.
        table_entries += (seq - 1) // block_size - (seq - union) // block_size + 1
        window_keys += sum(min(ctx + i + 1, window) for i in range(qlen))
    metadata = 4 * (len(query_lens) + 1) + 4 * len(query_lens) + 12 * tokens + 4 * table_entries
    topk_rows = tokens * topk
    unique = q_and_out + window_union * rec + topk_rows * (rec + INDEX_BYTES) + metadata
    issued = q_and_out + head_blocks * (window_keys + topk_rows) * rec + topk_rows * INDEX_BYTES + metadata
    return TrafficBytes(unique=unique, issued=issued)
