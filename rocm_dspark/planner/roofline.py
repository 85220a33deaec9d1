"""The roofline step-cost model of the seed document, parameterised from recipes/.

A step is one target forward over `tokens` tokens (every request's anchor row plus its verified drafts)
plus the drafter. The forward takes max(bytes read / bandwidth, FLOPs / FLOP/s): small batches are
bandwidth bound (the weights are streamed once per step whatever the batch), large ones compute bound.

This is a model, not a measurement. It has not been run against MI300-class hardware, and it leaves out
attention over the context, kernel launches, the sampler and the TP all-reduces. A real step is slower,
most of all at small batches. Pass a measured cost table (cost_table.py) when you have one.

Modelling assumptions for an MoE target such as DeepSeek-V4.1-Flash (all stated in the CLI notes):
  * Bytes read per step = dense bytes (attention, shared experts, norms: read on every step)
    + routed-expert bytes x the expected share of experts that at least one token is routed to,
    1 - (1 - k/E)^tokens under uniform, independent routing (DeepInfer profiles with random routing
    too). One token reads exactly the active parameters; a large batch reads every expert.
  * FLOPs per token = 2 x active parameters per output token (attention FLOPs left out).
  * TP divides both the bytes and the FLOPs evenly over the TP group's GPUs.
  * The draft model is a scaled copy of the target (same dense share, same routing sparsity) with
    draft_b parameters: recipes/ carries no routing facts for the draft.
  * Verify tokens are padded up to the captured graph sizes, as vLLM pads a decode step.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocm_dspark.errors import UsageError

# The seed document's efficiency factors (effective / peak), used for every GPU until measured.
BANDWIDTH_EFFICIENCY = 0.8
COMPUTE_EFFICIENCY = 0.5


@dataclass(frozen=True)
class Hardware:
    """Effective roofs of the GPUs that run one engine (a TP group)."""

    bandwidth_bytes_per_s: float
    flops_per_s: float


@dataclass(frozen=True)
class ModelCost:
    """What one forward of a model must read and compute."""

    dense_bytes: float  # read on every step, whatever the batch
    flops_per_token: float
    expert_bytes: float = 0.0  # routed experts: read only when some token is routed to them
    expert_share: float = 0.0  # k/E, the share of routed experts one token touches

    def bytes_read(self, tokens):
        import numpy as np

        tokens = np.asarray(tokens, dtype=np.float64)
        touched = 1.0 - (1.0 - self.expert_share) ** tokens if self.expert_bytes else 0.0
        return self.dense_bytes + self.expert_bytes * touched

    def scaled(self, factor: float) -> ModelCost:
        return ModelCost(
            self.dense_bytes * factor, self.flops_per_token * factor, self.expert_bytes * factor, self.expert_share
        )


def forward_seconds(model: ModelCost, hw: Hardware, tokens):
    """Roofline time of one forward over `tokens` tokens (0 tokens: no forward, 0 s)."""
    import numpy as np

    tokens = np.asarray(tokens, dtype=np.float64)
    t = np.maximum(model.bytes_read(tokens) / hw.bandwidth_bytes_per_s, tokens * model.flops_per_token / hw.flops_per_s)
    return np.where(tokens > 0, t, 0.0)


def pad_to_capture(tokens, capture_sizes):
    """Round each token count up to the next captured graph size; above the largest, no padding
    (vLLM runs such steps without a full graph)."""
    import numpy as np

    tokens = np.asarray(tokens, dtype=np.int64)
    if not capture_sizes:
        return tokens
    sizes = np.asarray(sorted(capture_sizes), dtype=np.int64)
    idx = np.searchsorted(sizes, tokens, side="left")
    padded = sizes[np.minimum(idx, len(sizes) - 1)]
    return np.where(tokens > sizes[-1], tokens, padded)


def profile_capture_grid(model, profile, capture_size: int | None = None) -> tuple[int, ...]:
    """vLLM's capture grid up to `capture_size`, by default the recipe's for the profile's max_num_seqs."""
    from rocm_dspark.recipe.capture import capture_size as recipe_capture_size
    from rocm_dspark.recipe.capture import vllm_capture_grid

    largest = capture_size or recipe_capture_size(profile.max_num_seqs, model.block_size, profile.capture_cap)
    return tuple(vllm_capture_grid(largest, profile.max_num_batched_tokens))


@dataclass(frozen=True)
class RooflineCost:
    """Step cost = drafter time + verify forward time, both from the roofline."""

    hardware: Hardware
    target: ModelCost
    draft: ModelCost | None = None  # None: every draft forward takes draft_forward_seconds
    draft_forward_seconds: float = 0.0
    block_draft: bool = True  # one forward drafts the whole block (DFlash/DSpark)
    capture_sizes: tuple[int, ...] = ()  # verify tokens are padded up to these
    label: str = "roofline"

    def verify_seconds(self, tokens):
        return forward_seconds(self.target, self.hardware, pad_to_capture(tokens, self.capture_sizes))

    def draft_seconds(self, num_requests: int, k: int) -> float:
        """Drafting k positions for num_requests requests: one forward over the whole block, or k
        forwards of one position each (token-by-token drafters such as EAGLE or MTP)."""
        if k <= 0 or num_requests <= 0:
            return 0.0
        forwards, tokens = (1, num_requests * k) if self.block_draft else (k, num_requests)
        if self.draft is None:
            return forwards * self.draft_forward_seconds
        return forwards * float(forward_seconds(self.draft, self.hardware, tokens))


def moe_model_cost(
    *,
    weight_bytes: float,
    total_params: float,
    active_params: float,
    experts_per_token: int | None,
    routed_experts: int | None,
) -> ModelCost:
    """Split the bytes of an MoE model into always-read dense bytes and routed-expert bytes so that
    one token reads exactly its active parameters and a saturated batch reads all `weight_bytes`."""
    bytes_per_param = weight_bytes / total_params
    active_bytes = active_params * bytes_per_param
    flops = 2.0 * active_params
    if not experts_per_token or not routed_experts:
        return ModelCost(dense_bytes=weight_bytes, flops_per_token=flops)
    share = experts_per_token / routed_experts
    expert_bytes = (weight_bytes - active_bytes) / (1.0 - share)
    dense_bytes = weight_bytes - expert_bytes
    if dense_bytes < 0 or expert_bytes < 0:
        raise UsageError(
            f"model facts are inconsistent: active {active_params / 1e9:g}B of {total_params / 1e9:g}B params "
            f"with {experts_per_token}/{routed_experts} experts leaves negative dense bytes; check recipes/models"
        )
    return ModelCost(dense_bytes=dense_bytes, flops_per_token=flops, expert_bytes=expert_bytes, expert_share=share)


def catalog_model_cost(model) -> ModelCost:
    """moe_model_cost of a catalog model (recipes/models: its params and architecture)."""
    params, arch = model.params, model.architecture
    try:
        return moe_model_cost(
            weight_bytes=float(params["weight_bytes_per_step_gb"]) * 1e9,
            total_params=float(params["backbone_b"]) * 1e9,
            active_params=float(params["active_output_token_b"]) * 1e9,
            experts_per_token=arch.get("experts_per_token"),
            routed_experts=arch.get("routed_experts"),
        )
    except KeyError as exc:
        raise UsageError(f"recipes/models: {model.key}.params.{exc.args[0]} is missing; the planner needs it") from None


def from_catalog(model, gpu, profile, *, capture_size: int | None = None) -> RooflineCost:
    """The roofline for one (model, GPU) profile from the catalog (catalog.ModelSpec, GpuSpec, Profile);
    `capture_size`: the largest captured size (default: the recipe's for the profile's max_num_seqs)."""
    if profile.dp != 1 or profile.ep != 1:
        raise UsageError(
            f"the roofline models one TP group; profile {profile.id} has dp={profile.dp} ep={profile.ep}; "
            f"pass a measured per-rank --cost-table instead"
        )
    target = catalog_model_cost(model)
    draft_params = float(model.params.get("draft_b") or 0.0) * 1e9
    tp = profile.tp
    # FP8 GEMM peak as the compute roof: MXFP4 experts are dequantised on gfx942 (no FP4 MFMA) and
    # whether vLLM's gfx950 path runs FP4 MFMA is not recorded; FP8 is the conservative common roof.
    hardware = Hardware(
        bandwidth_bytes_per_s=tp * gpu.hbm_bandwidth_tbps * 1e12 * BANDWIDTH_EFFICIENCY,
        flops_per_s=tp * gpu.peak_fp8_tflops * 1e12 * COMPUTE_EFFICIENCY,
    )
    return RooflineCost(
        hardware=hardware,
        target=target,
        draft=target.scaled(draft_params / (float(model.params["backbone_b"]) * 1e9)) if draft_params else None,
        block_draft=True,
        capture_sizes=profile_capture_grid(model, profile, capture_size),
        label=f"roofline {model.key} on {tp}x {gpu.name} (TP{tp})",
    )
