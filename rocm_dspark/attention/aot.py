"""Compile the attention kernel for a GPU target without a GPU, and report what the compiler made.

Triton can lower to AMD gcn (hsaco) and NVIDIA PTX/cubin on any host. That proves the kernel
compiles for gfx942 / gfx950 / sm90 (the interpreter cannot: it accepts code the compiler
rejects), and gives register, spill and LDS numbers that chose the default tile. These are
compiler statistics, not timings. Needs TRITON_INTERPRET=0 in a process where triton was not
yet imported in interpreter mode (the tests run it in a subprocess).
"""

from __future__ import annotations

import re

from rocm_dspark.errors import UsageError

_POINTER = {"bf16": "*bf16", "fp8": "*fp8e4nv", "fp8_fnuz": "*fp8e4b8", "fp8_ds_mla": "*u8"}
# Integer arguments that are multiples of 16 in real launches (Triton specialises on that).
_DIV16_INTS = set(
    "stride_qt stride_qh stride_ot stride_oh kv_stride_blk x_stride_blk block_size x_block_size xidx_stride topk_width".split()
)
_CACHES = ("kv_ptr", "x_ptr")  # may exceed 2 GiB: no 32-bit buffer offsets for them


def _target(arch: str):
    from triton.backends.compiler import GPUTarget

    if arch.startswith("gfx"):
        return GPUTarget("hip", arch, 64)  # CDNA is wave64
    m = re.fullmatch(r"sm_?(\d+)", arch)
    if m:
        return GPUTarget("cuda", int(m.group(1)), 32)
    raise UsageError(f"unknown target {arch!r}: use a gfx name such as gfx942, or sm_90")


def compile_report(
    arch: str,
    *,
    kv_format: str = "fp8_ds_mla",
    fnuz: bool = False,
    topk: bool = True,
    sink: bool = True,
    block_h: int = 16,
    block_k: int = 16,
    num_warps: int = 4,
) -> dict:
    """Compile one variant for `arch`; returns register/spill/LDS statistics and the dot instructions used."""
    from rocm_dspark.attention import _triton

    if _triton.interpreting():
        raise UsageError("compile_report needs the Triton compiler: run it with TRITON_INTERPRET=0")
    import triton
    from triton.compiler import ASTSource

    from rocm_dspark.attention.kernel import _FORMAT_CODE, _sparse_swa_kernel

    target = _target(arch)
    hip = target.backend == "hip"
    cache_ptr = _POINTER["fp8_fnuz" if kv_format == "fp8" and fnuz else kv_format]
    types = dict(q_ptr="*bf16", out_ptr="*bf16", kv_ptr=cache_ptr, x_ptr=_POINTER["fp8_ds_mla"], qk_scale_log2="fp32")
    consts = dict(
        KV_FMT=_FORMAT_CODE[kv_format],
        KV_FNUZ=fnuz,
        X_FMT=_FORMAT_CODE["fp8_ds_mla"],
        X_FNUZ=False,
        HAS_TOPK=topk,
        HAS_TOPK_LENS=topk,
        HAS_SINK=sink,
        BLOCK_H=block_h,
        BLOCK_K=block_k,
        DOT_F32=False,
    )
    signature, attrs = {}, {}
    for i, name in enumerate(_sparse_swa_kernel.arg_names):
        if name in consts:
            signature[name] = "constexpr"
            continue
        signature[name] = types.get(
            name,
            "*fp32" if name.endswith("scale_ptr") or name == "sink_ptr" else "*i32" if name.endswith("_ptr") else "i32",
        )
        if name.endswith("_ptr") or name in _DIV16_INTS:
            attrs[(i,)] = [["tt.divisibility", 16]]
            if hip and name.endswith("_ptr") and name not in _CACHES:
                attrs[(i,)].append(["tt.pointer_range", 32])
    compiled = triton.compile(
        ASTSource(_sparse_swa_kernel, signature, consts, attrs), target=target, options={"num_warps": num_warps}
    )
    report = dict(arch=arch, kv_format=kv_format, fnuz=fnuz, topk=topk, block_h=block_h, block_k=block_k)
    report.update(num_warps=num_warps, lds_bytes=compiled.metadata.shared)
    if hip:
        asm = compiled.asm["amdgcn"]

        def field(key):
            m = re.search(rf"\.{key}:\s+(\d+)", asm)
            return int(m.group(1)) if m else None

        report.update(
            vgprs=field("vgpr_count"),
            vgpr_spills=field("vgpr_spill_count"),
            sgpr_spills=field("sgpr_spill_count"),
            dot_instructions=sorted(set(re.findall(r"v_mfma\w+", asm))),
        )
    else:
        ptx = compiled.asm["ptx"]
        report.update(dot_instructions=sorted(set(re.findall(r"\b(?:wgmma|mma)\.[\w.]+", ptx))))
    return report
