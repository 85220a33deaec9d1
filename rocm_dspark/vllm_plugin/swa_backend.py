"""Our subclass of vLLM's ROCm DeepSeek-V4.1 sparse-SWA backend (imported only when patching).

vLLM 0.30-0.32 refuses adaptive verification (AV) on ROCm partly because this backend's metadata
builder reports UNIFORM_BATCH. Our builder subclasses vLLM's own (found through
`get_builder_cls()`, whose class name changed across releases) and changes two things:

* `get_cudagraph_support` reports ALWAYS when `enable_adaptive_verification` is on, vLLM's own
  answer otherwise. Under AV vLLM maps FULL to FULL_AND_PIECEWISE / FULL_DECODE_ONLY, so only
  decode batches replay FULL graphs, and ...
* ... `build` derives every per-token decode quantity (owning request, window, liveness, slot
  rows, CSR) on the device from `query_start_loc` with our Triton kernels
  (`rocm_dspark.attention.compute_swa_metadata` + `swa_layout.write_vllm_swa_rows`) into the
  builder's persistent buffers. A graph captured for one layout therefore replays correctly for
  every layout AV trims on the device. Batches with prefill rows (never replayed under AV) go
  through vLLM's build first, then their decode rows are rewritten the same way.

The metadata also carries our `SwaMetadata` as `rocm_dspark_swa` for `sparse_swa_attention`.
"""

from __future__ import annotations

import dataclasses
import inspect

#: Set on every class we create; the patcher uses it to stay idempotent and to undo.
MARKER = "rocm_dspark_replaces"


def _metadata_class(builder_cls) -> type:
    """The metadata dataclass vLLM's ROCm builder returns (its name differs across releases)."""
    annotation = inspect.signature(builder_cls.build).return_annotation
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return annotation
    raise TypeError(f"{builder_cls.__qualname__}.build has no dataclass return annotation; cannot subclass it")


def _as_bool(causal) -> bool:
    # vLLM passes a bool, or a one-element tensor for the DSpark draft; vLLM itself does `not causal`.
    return bool(causal.item()) if hasattr(causal, "item") else bool(causal)


def make_swa_backend(base_backend: type) -> type:
    """A subclass of `base_backend` whose builder is ours (see the module docstring)."""
    import torch
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    from rocm_dspark.attention import SwaMetadataBuffers, compute_swa_metadata
    from rocm_dspark.vllm_plugin.swa_layout import write_vllm_swa_rows

    base_builder = base_backend.get_builder_cls()
    base_metadata = _metadata_class(base_builder)
    metadata_cls = dataclasses.make_dataclass(
        "RocmDsparkSparseSWAMetadata",
        [("rocm_dspark_swa", object, dataclasses.field(default=None))],
        bases=(base_metadata,),
    )

    class RocmDsparkSparseSWAMetadataBuilder(base_builder):
        @classmethod
        def get_cudagraph_support(cls, vllm_config, kv_cache_spec):
            spec = vllm_config.speculative_config
            if spec is not None and spec.enable_adaptive_verification:
                # Decode rows come from the device query_start_loc into persistent buffers (build).
                return AttentionCGSupport.ALWAYS
            return super().get_cudagraph_support(vllm_config, kv_cache_spec)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            max_tokens = self.vllm_config.scheduler_config.max_num_batched_tokens
            self.rocm_dspark_buffers = SwaMetadataBuffers.allocate(max_tokens, self.device)
            self.rocm_dspark_counts = torch.zeros(max_tokens, dtype=torch.int32, device=self.device)

        def build(self, common_prefix_len, common_attn_metadata, fast_build=False, replay_start=None):
            cam = common_attn_metadata
            # The split reads the CPU query_start_loc; under AV it stays right because every
            # verification row is <= 1+K tokens and the CPU total is exact.
            num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens = split_decodes_and_prefills(
                cam, decode_threshold=self.decode_threshold
            )
            base = None
            if num_decode_tokens == 0 or num_prefill_tokens > 0:
                base = super().build(
                    common_prefix_len=common_prefix_len, common_attn_metadata=cam,
                    fast_build=fast_build, replay_start=replay_start,
                )
                if num_decode_tokens == 0:
                    return metadata_cls(**vars(base))
            fields, swa = self._rocm_dspark_decode_rows(cam, num_decode_tokens, replay_start)
            if base is not None:
                # Mixed batch: prefill rows keep vLLM's request map (read at absolute positions).
                return metadata_cls(**{**vars(base), **fields, "rocm_dspark_swa": swa})
            # Decode-only batch (what AV replays): the request map is ours too.
            token_to_req = self.token_to_req_indices[:num_decode_tokens]
            torch.clamp(swa.req, min=0, out=token_to_req)  # vLLM maps unplaceable tokens to 0
            return metadata_cls(
                block_table=cam.block_table_tensor,
                slot_mapping=cam.slot_mapping,
                block_size=self.block_size,
                seq_lens=cam.seq_lens,
                query_start_loc=cam.query_start_loc,
                query_start_loc_cpu=cam.query_start_loc_cpu,
                token_to_req_indices=token_to_req,
                replay_start=replay_start if replay_start is not None else self.no_replay_start,
                num_decodes=num_decodes,
                num_prefills=0,
                num_prefill_tokens=0,
                max_decode_query_len=min(cam.max_query_len, self.decode_threshold),
                rocm_dspark_swa=swa,
                **fields,
            )

        def _rocm_dspark_decode_rows(self, cam, num_tokens, replay_start):
            causal = _as_bool(cam.causal)
            if causal:
                width, dense = self.window_size, self.decode_swa_indices
            else:
                # vLLM asserts the same: only the DSpark draft block is non-causal.
                assert self.is_dspark, "non-causal DeepSeek-V4 SWA is only used by the DSpark draft"
                width = self.noncausal_index_width
                if self.decode_swa_indices_noncausal is None:
                    self.decode_swa_indices_noncausal = torch.zeros(
                        self._max_tokens, 1, width, dtype=torch.int32, device=self.device
                    )
                dense = self.decode_swa_indices_noncausal
            swa = compute_swa_metadata(
                cam.query_start_loc, cam.seq_lens, cam.block_table_tensor, cam.slot_mapping,
                self.rocm_dspark_buffers, window=self.window_size, block_size=self.block_size,
                causal=causal, replay_start=replay_start if causal else None, num_tokens=num_tokens,
            )
            self.decode_swa_lens[num_tokens:] = 0
            ragged, indptr = write_vllm_swa_rows(
                swa, num_rows=num_tokens, width=width, dense=dense[:, 0, :],
                lens=self.decode_swa_lens, counts=self.rocm_dspark_counts,
                indptr=self.decode_swa_ragged_indptr_buffer, ragged=self.decode_swa_ragged_indices_buffer,
            )
            is_valid = self.is_valid_token[: cam.slot_mapping.shape[0]]
            torch.ge(cam.slot_mapping, 0, out=is_valid)
            torch.ne(swa.live, 0, out=is_valid[:num_tokens])
            fields = dict(
                is_valid_token=is_valid,
                decode_swa_indices=dense[:num_tokens],
                decode_swa_lens=self.decode_swa_lens[:num_tokens],
                decode_swa_width=width,
                num_decode_tokens=num_tokens,
                decode_swa_ragged_indices=ragged,
                decode_swa_ragged_indptr=indptr,
            )
            return fields, swa

    backend = type(
        "RocmDspark" + base_backend.__name__,
        (base_backend,),
        {"get_builder_cls": staticmethod(lambda: RocmDsparkSparseSWAMetadataBuilder), MARKER: base_backend},
    )
    setattr(RocmDsparkSparseSWAMetadataBuilder, MARKER, base_builder)
    RocmDsparkSparseSWAMetadataBuilder.metadata_cls = metadata_cls
    return backend
