"""Per-token SWA metadata derived on the device from `query_start_loc` (one Triton launch).

The launch takes only graph-constant scalars (padded token and request counts, window, flags), never a
host copy of per-request lengths, so a captured graph stays correct for every device layout with the same
padded token count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rocm_dspark.attention import _triton
from rocm_dspark.errors import UsageError

_BLOCK_T = 128  # tokens per program; the kernel is a handful of vector ops per token


@dataclass(frozen=True)
class SwaMetadataBuffers:
    """Persistent int32 per-token buffers (req, pos, start, end, live), allocated once for the largest
    padded token count with `allocate(max_tokens, device)`; their addresses never change, so graphs can
    capture them."""

    req: torch.Tensor  # owning request, -1 when dead
    pos: torch.Tensor  # absolute position of the token, -1 when dead
    start: torch.Tensor  # first key position of the window (inclusive)
    end: torch.Tensor  # key window end (exclusive); start == end == 0 when dead
    live: torch.Tensor  # 1 for a real token, 0 for padding / trimmed / invalid

    @classmethod
    def allocate(cls, max_tokens: int, device) -> SwaMetadataBuffers:
        if int(max_tokens) < 1:
            raise UsageError(f"max_tokens must be >= 1, got {max_tokens}: size it for the largest padded batch")
        make = lambda: torch.zeros(int(max_tokens), dtype=torch.int32, device=device)  # noqa: E731
        return cls(req=make(), pos=make(), start=make(), end=make(), live=make())

    @property
    def max_tokens(self) -> int:
        return self.req.numel()


@dataclass(frozen=True)
class SwaMetadata:
    """What the attention kernel reads: the buffers plus the graph-constant layout facts."""

    buffers: SwaMetadataBuffers
    block_table: torch.Tensor
    block_size: int
    window: int
    causal: bool
    num_tokens: int  # padded token count T_pad: the attention grid size (the buffers' rows that count)


@triton.jit
def _swa_metadata_kernel(
    qsl_ptr,
    seq_lens_ptr,
    slot_ptr,
    replay_ptr,
    req_ptr,
    pos_ptr,
    start_ptr,
    end_ptr,
    live_ptr,
    num_tokens,
    num_reqs,
    window,
    HAS_REPLAY: tl.constexpr,
    CAUSAL: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_grid = t < num_tokens
    total = tl.load(qsl_ptr + num_reqs)

    # Owning request = (first r in [0, R] with qsl[r] > t) - 1. Zero-length (padding) requests
    # have qsl[r] == qsl[r+1] and are skipped by construction. Fixed step count: no host lengths.
    lo = tl.zeros([BLOCK_T], dtype=tl.int32)
    hi = tl.zeros([BLOCK_T], dtype=tl.int32) + num_reqs
    for _ in tl.static_range(SEARCH_STEPS):
        active = lo < hi
        mid = (lo + hi) // 2  # always within [0, R]: a safe address
        v = tl.load(qsl_ptr + mid, mask=in_grid & active, other=0)
        right = active & (v <= t)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & (v > t), mid, hi)
    req = lo - 1

    slot = tl.load(slot_ptr + t, mask=in_grid, other=-1)
    live = in_grid & (t < total) & (req >= 0) & (slot >= 0)
    safe_req = tl.where(live, req, 0)
    q0 = tl.load(qsl_ptr + safe_req, mask=live, other=0)
    q1 = tl.load(qsl_ptr + safe_req + 1, mask=live, other=0)
    seq_len = tl.load(seq_lens_ptr + safe_req, mask=live, other=0)
    prefix = seq_len - (q1 - q0)  # tokens already in the cache before this step
    live = live & (prefix >= 0)  # a request shorter than its query is inconsistent: dead
    pos = prefix + (t - q0)

    if CAUSAL:
        start = tl.maximum(pos - window + 1, 0)
        if HAS_REPLAY:
            replay = tl.load(replay_ptr + safe_req, mask=live, other=0)
            start = tl.maximum(start, replay)
        end = pos + 1
    else:
        # DSpark draft block: the trailing `window` context positions plus the whole block.
        start = tl.maximum(prefix - window, 0)
        end = seq_len
    start = tl.minimum(start, end)

    tl.store(req_ptr + t, tl.where(live, req, -1), mask=in_grid)
    tl.store(pos_ptr + t, tl.where(live, pos, -1), mask=in_grid)
    tl.store(start_ptr + t, tl.where(live, start, 0), mask=in_grid)
    tl.store(end_ptr + t, tl.where(live, end, 0), mask=in_grid)
    tl.store(live_ptr + t, live.to(tl.int32), mask=in_grid)


def _check_int_tensor(name: str, t, ndim: int, device, dtypes=(torch.int32,)) -> None:
    if not isinstance(t, torch.Tensor):
        raise UsageError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise UsageError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        names = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise UsageError(f"{name} must be {names}, got {str(t.dtype).replace('torch.', '')}: convert it first")
    if t.device != device:
        raise UsageError(f"{name} is on {t.device} but query_start_loc is on {device}: keep all inputs on one device")


def compute_swa_metadata(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    buffers: SwaMetadataBuffers,
    *,
    window: int,
    block_size: int,
    causal: bool = True,
    replay_start: torch.Tensor | None = None,
    num_tokens: int | None = None,
) -> SwaMetadata:
    """Fill `buffers` for the padded batch from device tensors only: one Triton launch, no host sync.

    query_start_loc [R_pad+1] int32, seq_lens [R_pad] int32, block_table [R_pad, nblk] int32, slot_mapping
    [>= T_pad] int32 or int64, replay_start [R_pad] int32 or None. Only graph-constant scalars are passed
    (T_pad = num_tokens, default slot_mapping.numel(); R_pad = seq_lens.numel()). Per token t < T_pad it
    writes the owning request (a binary search on the device query_start_loc; zero-length requests are
    skipped), its position, the key window [start, end) and liveness. Dead tokens (t >= qsl[R_pad],
    slot_mapping[t] < 0, or inconsistent lengths) get req = pos = -1, start = end = 0, live = 0.
    Window: causal [max(pos - W + 1, 0, replay_start[r]), pos + 1); non-causal (the DSpark draft block)
    [max(L - qlen - W, 0), L). The rule: docs/kernels.md, "Per-token key set".
    """
    device = query_start_loc.device if isinstance(query_start_loc, torch.Tensor) else None
    _check_int_tensor("query_start_loc", query_start_loc, 1, device)
    _check_int_tensor("seq_lens", seq_lens, 1, device)
    _check_int_tensor("block_table", block_table, 2, device)
    _check_int_tensor("slot_mapping", slot_mapping, 1, device, (torch.int32, torch.int64))
    num_reqs = seq_lens.numel()
    if query_start_loc.numel() != num_reqs + 1:
        raise UsageError(
            f"query_start_loc has {query_start_loc.numel()} entries but seq_lens has {num_reqs}: "
            "query_start_loc needs one more entry than there are (padded) requests"
        )
    if block_table.shape[0] < num_reqs:
        raise UsageError(
            f"block_table has {block_table.shape[0]} rows for {num_reqs} requests: give one row per request"
        )
    if replay_start is not None:
        _check_int_tensor("replay_start", replay_start, 1, device)
        if replay_start.numel() < num_reqs:
            raise UsageError(
                f"replay_start has {replay_start.numel()} entries for {num_reqs} requests: give one per request"
            )
    num_tokens = int(slot_mapping.numel() if num_tokens is None else num_tokens)
    limit = min(buffers.max_tokens, slot_mapping.numel())
    if not 1 <= num_tokens <= limit:
        raise UsageError(
            f"num_tokens={num_tokens} must be in 1..{limit} "
            "(the buffers' max_tokens and slot_mapping length): allocate buffers for the largest padded batch"
        )
    if buffers.req.device != device:
        raise UsageError(
            f"metadata buffers are on {buffers.req.device} but inputs on {device}: allocate them on {device}"
        )
    if int(window) < 1 or int(block_size) < 1:
        raise UsageError(f"window ({window}) and block_size ({block_size}) must be positive")

    grid = (triton.cdiv(num_tokens, _BLOCK_T),)
    _triton.launch(
        _swa_metadata_kernel,
        grid,
        device,
        query_start_loc,
        seq_lens,
        slot_mapping,
        replay_start if replay_start is not None else seq_lens,  # dummy pointer, never read
        buffers.req,
        buffers.pos,
        buffers.start,
        buffers.end,
        buffers.live,
        num_tokens,
        num_reqs,
        int(window),
        HAS_REPLAY=replay_start is not None,
        CAUSAL=bool(causal),
        SEARCH_STEPS=math.ceil(math.log2(num_reqs + 1)) + 1,
        BLOCK_T=_BLOCK_T,
    )
    return SwaMetadata(
        buffers=buffers,
        block_table=block_table,
        block_size=int(block_size),
        window=int(window),
        causal=bool(causal),
        num_tokens=num_tokens,
    )
