"""Goldens: the seed examples' printed tables, to the printed digit, recomputed by the planner.

The examples (docs/seed-examples.md): best K by batch on an 8B/H100 roofline, the adaptive-verification
table with the examples' own torch.manual_seed(0) draws, the Markov example, and the expected-tokens lesson
(2.64 expected tokens and the method choice). The expected strings below are copied from the examples'
printed outputs.
"""

from __future__ import annotations

import pytest

from rocm_dspark.planner.seed import example as seed


def test_best_k_table_matches_the_seed_output():
    rows = seed.best_k_table()
    assert [r.batch for r in rows] == [1, 32, 128, 512]
    assert [f"{r.no_spec_tokens_per_s:.0f}" for r in rows] == ["168", "5360", "21440", "30906"]
    assert [(r.best_k_token_by_token, r.best_k_block) for r in rows] == [(8, 8), (5, 5), (1, 1), (0, 0)]
    speedups = [f"{s:.2f}" for r in rows for s in (r.speedup_token_by_token, r.speedup_block)]
    assert speedups == ["3.24", "4.15", "2.95", "3.41", "1.26", "1.26", "1.00", "1.00"]


def test_adaptive_table_matches_the_seed_output_with_its_own_draws():
    rows = seed.adaptive_table()
    assert [r.admitted for r in rows] == [112, 57, 7]
    assert [(f"{r.mean_verified_accurate:.1f}", f"{r.mean_verified_inaccurate:.1f}") for r in rows] == [
        ("7.0", "7.0"), ("0.9", "0.0"), ("0.0", "0.0")]
    assert [f"{r.no_spec_tokens_per_s:.0f}" for r in rows] == ["2680", "21440", "30906"]
    assert [f"{r.verify_all_tokens_per_s:.0f}" for r in rows] == ["10104", "15182", "15146"]
    assert [f"{r.adaptive_tokens_per_s:.0f}" for r in rows] == ["10104", "29053", "30448"]


def test_markov_example_matches_the_seed_output():
    parallel, markov = seed.markov_example()
    assert (f"{parallel:.2f}", f"{markov:.2f}") == ("0.62", "0.81")


def test_lesson_expected_tokens_and_method_choice():
    lesson = seed.lesson_example()
    assert abs(lesson["expected_tokens"] - 2.64) < 1e-12
    name, speedup = lesson["choice"]
    assert name == "block" and speedup > 1.0
    # block: (1 + .75 + .5625 + .39375) x 10 ms / 11 ms; tree: 2.64 x 10 / 12 = 2.2 loses
    assert speedup == pytest.approx(2.70625 * 10.0 / 11.0, rel=1e-12)
    assert lesson["choice_small_budget"][0] == "baseline"


def test_seed_lines_print_the_seed_numbers():
    text = "\n".join(seed.seed_lines())
    for fragment in ("168 tok/s", "best K=8 (3.24x)", "best K=8 (4.15x)", "30906 tok/s",
                     "admitted  112", "admitted   57", "admitted    7", "adaptive  29053", "verify all  15182",
                     "independent positions 0.62, with the transition 0.81", "[0.8, 0.7, 0.5]: 2.64",
                     "method choice: block"):
        assert fragment in text


# --- the replayed generator against torch itself -------------------------------------------------------


def test_torch_cpu_draws_equal_torch_rand_and_randperm():
    torch = pytest.importorskip("torch")
    import numpy as np

    from rocm_dspark.planner.seed.torch_draws import TorchCpuDraws

    torch.manual_seed(0)
    draws = TorchCpuDraws(0)
    for shape in [(16, 7), (128, 7), (5,), (512, 7)]:
        assert np.array_equal(draws.rand(*shape), torch.rand(*shape).numpy())
    torch.manual_seed(0)
    draws = TorchCpuDraws(0)
    for n in (64, 64, 10, 1, 2):
        assert np.array_equal(draws.randperm(n), torch.randperm(n).numpy())
    torch.manual_seed(1234)
    assert np.array_equal(TorchCpuDraws(1234).rand(3, 3), torch.rand(3, 3).numpy())


def test_adaptive_table_equals_the_seed_code_run_with_torch():
    """Run the seed's own code (torch, float32) and compare with the planner's rows."""
    torch = pytest.importorskip("torch")
    w_bytes, bw = 16e9, 3.35e12 * 0.8
    flop_per_token, flops = 2 * 8e9, 989e12 * 0.5
    t_draft, k = 0.25e-3, 7

    def step_time(tokens):
        return max(w_bytes / bw, tokens * flop_per_token / flops)

    torch.manual_seed(0)
    reference = []
    for batch in (16, 128, 512):
        conf = torch.cat([torch.full((batch // 2, k), 0.9), torch.full((batch - batch // 2, k), 0.55)]) \
            * torch.rand(batch, k).mul(0.2).add(0.9)
        conf = conf.clamp(max=0.99)
        survival = conf.cumprod(1)
        order = survival.flatten().sort(descending=True).values
        gain = torch.cat([torch.zeros(1), order.cumsum(0)])
        rates = [(batch + gain[b]) / (t_draft + step_time(batch + b)) for b in range(len(gain))]
        b = max(range(len(gain)), key=lambda i: rates[i])
        fixed = (batch + survival.sum()) / (t_draft + step_time(batch * (1 + k)))
        reference.append((b, float(rates[b]), float(fixed)))
    for row, (b, rate, fixed) in zip(seed.adaptive_table(), reference):
        assert row.admitted == b
        assert row.adaptive_tokens_per_s == pytest.approx(rate, rel=1e-5)   # float32 vs float64
        assert row.verify_all_tokens_per_s == pytest.approx(fixed, rel=1e-5)
