"""The startup probe's kernel check: our device-planned path vs the reference on trimmed layouts.

One set of persistent buffers (as a captured graph would hold) sees several device layouts of a
4-request DSpark verify batch (K=5, so the host believes 4 x 6 tokens): the uniform layout, then
layouts trimmed on the device, with zero-length padding requests and a padded tail. For each:
  - our path (compute_swa_metadata + sparse_swa_attention) must match the reference, and rows of
    dead tokens must be zero although the output buffer was filled with garbage first;
  - the host-planned negative control must disagree with the reference on every trimmed layout
    (and agree on the uniform one, which shows the control itself is sound).
On a GPU the two launches are captured once in a CUDA/HIP graph and replayed per layout.
On CPU everything runs in the Triton interpreter: `interpreted: True`, not valid for gating.
"""

from __future__ import annotations

import time

QUERY_LEN = 6  # 1 + K with K = 5 DSpark draft tokens
CONTEXTS = [5, 130, 300, 40]  # shorter than, around and longer than the 128-token window
LAYOUTS = [  # device query lengths; the host always believes [6, 6, 6, 6]
    [6, 6, 6, 6],
    [3, 1, 6, 2],
    [1, 6, 2, 5],
    [4, 2, 6, 0],  # the last request became padding
    [1, 1, 1, 1],
]
GARBAGE = 7.0  # written into the output before each launch: dead rows must come back as zeros


def _excess(out, ref, tol) -> tuple[float, float]:
    """(max |out - ref|, max of |out - ref| - (atol + rtol |ref|)); the second is <= 0 when within tolerance."""
    diff = (out.float().cpu() - ref).abs()
    return float(diff.max()), float((diff - tol["atol"] - tol["rtol"] * ref.abs()).max())


def run_kernel_check(device="cpu", *, interpret_ok: bool) -> dict:
    """Run the check; never raises for a failed check: the answer is the dict below (JSON-serialisable), with
    device_name and arch added on a GPU. interpreted=True results are not valid for gating (the CPU
    interpreter, not the GPU code)."""
    started = time.monotonic()
    result = {
        "passed": False,
        "reason": "",
        "device": str(device),
        "interpreted": None,
        "layouts_checked": 0,
        "max_abs_err": None,
        "tolerance": None,  # {rtol, atol}
        "negative_control_caught": False,
        "negative_control_agrees_on_uniform": None,
        "negative_control_err": None,  # its smallest error over the trimmed layouts
        "graph_replay": False,
        "seconds": None,
    }
    try:
        _run(device, interpret_ok, result)
    except Exception as exc:  # the probe records the reason instead of crashing
        result["passed"] = False
        result["reason"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def _run(device, interpret_ok: bool, result: dict) -> None:
    import torch

    from rocm_dspark.attention import _triton
    from rocm_dspark.attention.cases import make_case, make_layout
    from rocm_dspark.attention.host_plan import host_planned_metadata, uniform_query_start_loc
    from rocm_dspark.attention.kernel import sparse_swa_attention
    from rocm_dspark.attention.metadata import SwaMetadataBuffers, compute_swa_metadata
    from rocm_dspark.attention.reference import reference_sparse_swa

    device = torch.device(device)
    interpreted = _triton.interpreted(device)
    result["interpreted"] = interpreted
    if interpreted and not interpret_ok:
        result["reason"] = "the Triton interpreter is active (no GPU) and interpret_ok=False: nothing was run"
        return
    on_gpu = device.type == "cuda"
    if on_gpu and not torch.cuda.is_available():
        result["reason"] = f"device {device} requested but torch sees no GPU"
        return
    if on_gpu:
        props = torch.cuda.get_device_properties(device)
        result["device_name"] = props.name
        result["arch"] = getattr(props, "gcnArchName", "") or f"sm_{props.major}{props.minor}"
    # The production SWA cache on gfx942 is FNUZ fp8_ds_mla; OCP elsewhere (docs/kernels.md, "KV cache layouts").
    fnuz = on_gpu and "gfx94" in result.get("arch", "")
    # Interpreter: fp32 dot operands, then fp32 -> bf16 by truncation (the interpreter ignores
    # round-to-nearest), so < 1 bf16 ulp <= 2**-7 |x|. GPU: bf16 K and P operands (section 3.3).
    tol = {"rtol": 2.0**-7, "atol": 1e-5} if interpreted else {"rtol": 2e-2, "atol": 2e-2}
    result["tolerance"] = tol

    base = make_case(
        LAYOUTS[0],
        CONTEXTS,
        heads=16,
        window=128,
        block_size=32,
        kv_format="fp8_ds_mla",
        fnuz=fnuz,
        sink=True,
        topk=64,
        topk_format="fp8_ds_mla",
        extra_blocks=8,
        seed=11,
    ).to(device)
    num_tokens, num_reqs = base.num_tokens, len(CONTEXTS)
    # Persistent inputs and outputs: a replay only changes their contents.
    keys = ("query_start_loc", "seq_lens", "block_table", "slot_mapping")
    static = [getattr(base, key).clone() for key in keys]
    qsl, seq_lens, table, slots = static
    buffers = SwaMetadataBuffers.allocate(num_tokens, device)
    out = torch.empty_like(base.q)
    attn_args = base.attention_args()

    def step():
        md = compute_swa_metadata(qsl, seq_lens, table, slots, buffers, num_tokens=num_tokens, **base.metadata_args())
        sparse_swa_attention(base.q, base.kv_cache, md, out=out, **attn_args)

    step()  # compiles every kernel variant before any capture
    graph = None
    if on_gpu:
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()

    # Negative control: planned from what the host believes (uniform 1+K, seq_lens = context + 1+K), so no
    # device layout changes it; it reads the same persistent block table.
    control_md = host_planned_metadata(
        uniform_query_start_loc(num_reqs, QUERY_LEN),
        torch.tensor([c + QUERY_LEN for c in CONTEXTS], dtype=torch.int32),
        table,
        SwaMetadataBuffers.allocate(num_tokens, device),
        window=base.window,
        block_size=base.block_size,
        num_tokens=num_tokens,
    )
    max_err, control_errs, caught = 0.0, [], []
    for i, qlens in enumerate(LAYOUTS):
        layout = make_layout(
            qlens,
            CONTEXTS,
            num_reqs_padded=num_reqs,
            num_tokens_padded=num_tokens,
            block_size=base.block_size,
            num_blocks=base.kv_cache.shape[0],
            table_width=table.shape[1],
            seed=100 + i,
            device=device,
        )
        for key, dst in zip(keys, static):
            dst.copy_(layout[key])
        out.fill_(GARBAGE)
        if graph is not None:
            graph.replay()
            torch.cuda.synchronize(device)
        else:
            step()
        ref = reference_sparse_swa(base.q, base.kv_cache, qsl, seq_lens, table, slots, **base.reference_args())
        err, excess = _excess(out, ref, tol)
        max_err = max(max_err, err)
        if excess > 0:
            result["max_abs_err"] = max_err
            result["reason"] = f"layout {qlens}: kernel differs from the reference by {err:.3g} (beyond tolerance)"
            return
        result["layouts_checked"] = i + 1

        control = sparse_swa_attention(base.q, base.kv_cache, control_md, **attn_args)
        c_err, c_excess = _excess(control, ref, tol)
        if qlens == [QUERY_LEN] * num_reqs:
            result["negative_control_agrees_on_uniform"] = c_excess <= 0
        else:
            control_errs.append(c_err)
            caught.append(c_excess > 0)

    result["max_abs_err"] = max_err
    result["graph_replay"] = graph is not None
    result["negative_control_err"] = min(control_errs) if control_errs else None  # its weakest catch
    result["negative_control_caught"] = bool(caught) and all(caught)
    if not result["negative_control_caught"]:
        result["reason"] = (
            "the host-planned negative control matched the reference on a trimmed layout: the check cannot tell right from wrong"
        )
    elif not result["negative_control_agrees_on_uniform"]:
        result["reason"] = (
            "the host-planned negative control is wrong even on the uniform layout: the control is broken"
        )
    else:
        where = (
            "Triton interpreter on CPU (not valid for gating)"
            if interpreted
            else f"{result.get('device_name', device)}, graph replay"
        )
        result["passed"] = True
        result["reason"] = (
            f"{len(LAYOUTS)} device layouts match the reference within tolerance; host-planned control caught; {where}"
        )
