"""The startup probe's kernel check (run_kernel_check) on CPU, and proof that it can fail.

On CPU it runs in the Triton interpreter, so its result says `interpreted: True` (the probe
must not gate on it). The last two tests break the path on purpose: a check that cannot fail
would prove nothing.
"""

from __future__ import annotations

from rocm_dspark.attention.selfcheck import run_kernel_check

# The passing check on CPU (interpreted, five layouts, the negative control caught, its weakest miss far outside our
# tolerance) is asserted on the kernel level's evidence in tests/test_probe_levels.py: that level runs this same
# run_kernel_check("cpu", interpret_ok=True) in its child process, and one run of it costs ~10 CPU-seconds.


def test_refuses_to_run_interpreted_when_not_allowed():
    result = run_kernel_check("cpu", interpret_ok=False)
    assert result["passed"] is False and result["layouts_checked"] == 0 and "interpret_ok=False" in result["reason"]


def test_fails_when_metadata_is_planned_from_host_lengths(monkeypatch):
    """Swap our device metadata for the host plan: the check must report the wrong layout."""
    import torch

    from rocm_dspark.attention import host_plan, metadata, selfcheck

    def host_planned(query_start_loc, seq_lens, block_table, slot_mapping, buffers, *, window, block_size,
                     num_tokens, **_):
        qsl = host_plan.uniform_query_start_loc(len(selfcheck.CONTEXTS), selfcheck.QUERY_LEN)
        lens = torch.tensor([c + selfcheck.QUERY_LEN for c in selfcheck.CONTEXTS], dtype=torch.int32)
        return host_plan.host_planned_metadata(qsl, lens, block_table, buffers, window=window,
                                               block_size=block_size, num_tokens=num_tokens)

    monkeypatch.setattr(metadata, "compute_swa_metadata", host_planned)
    result = run_kernel_check("cpu", interpret_ok=True)
    assert result["passed"] is False
    assert result["layouts_checked"] == 1  # the uniform layout passes, the first trimmed one fails
    assert "layout [3, 1, 6, 2]" in result["reason"]


def test_an_exception_becomes_a_reason_not_a_crash(monkeypatch):
    from rocm_dspark.attention import kernel

    def broken(*args, **kwargs):
        raise RuntimeError("simulated launch failure\nsecond line")

    monkeypatch.setattr(kernel, "sparse_swa_attention", broken)
    result = run_kernel_check("cpu", interpret_ok=True)
    assert result["passed"] is False and result["reason"] == "RuntimeError: simulated launch failure"
