"""Cost models: the roofline (seed formula, MoE byte model, catalog adapter) and measured cost tables."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.errors import UsageError
from rocm_dspark.planner.cost_table import MeasuredCost, load_cost_table
from rocm_dspark.planner.roofline import from_catalog, moe_model_cost, pad_to_capture
from rocm_dspark.planner.seed.example import seed_cost

# --- roofline ------------------------------------------------------------------------------------------


def test_seed_roofline_is_the_seed_formula():
    w_bytes, bw, flop_per_token, flops = 16e9, 3.35e12 * 0.8, 2 * 8e9, 989e12 * 0.5
    cost = seed_cost(block=False)
    for tokens in (1, 7, 100, 165, 166, 512, 4096):
        assert float(cost.verify_seconds(tokens)) == pytest.approx(max(w_bytes / bw, tokens * flop_per_token / flops),
                                                                   rel=1e-15)
    assert cost.draft_seconds(32, 5) == pytest.approx(5 * 0.25e-3)
    assert seed_cost(block=True).draft_seconds(32, 5) == pytest.approx(0.25e-3)
    assert cost.draft_seconds(32, 0) == 0.0


def test_moe_bytes_match_monte_carlo_uniform_routing():
    """One token reads exactly the active parameters; T tokens read the expected share of experts that
    uniform routing (k distinct of E per token) touches, checked by simulating the routing."""
    model = moe_model_cost(weight_bytes=290e9, total_params=552e9, active_params=16e9,
                           experts_per_token=6, routed_experts=384)
    per_param = 290e9 / 552e9
    assert float(model.bytes_read(1)) == pytest.approx(16e9 * per_param, rel=1e-12)
    assert float(model.bytes_read(10**6)) == pytest.approx(290e9, rel=1e-9)
    rng = np.random.default_rng(0)
    for tokens in (2, 8, 64):
        touched = []
        for _ in range(400):
            routed = np.zeros(384, bool)
            for _ in range(tokens):
                routed[rng.choice(384, 6, replace=False)] = True
            touched.append(routed.mean())
        simulated = model.dense_bytes + model.expert_bytes * np.mean(touched)
        assert float(model.bytes_read(tokens)) == pytest.approx(simulated, rel=0.01)


def test_pad_to_capture_rounds_up_and_leaves_oversize_steps():
    sizes = (1, 2, 4, 8, 16, 24)
    assert pad_to_capture([0, 1, 3, 5, 9, 17, 24, 25, 100], sizes).tolist() == [1, 1, 4, 8, 16, 24, 24, 25, 100]
    assert pad_to_capture([3, 5], ()).tolist() == [3, 5]


@pytest.mark.parametrize("gpu_key", ["mi300x", "mi325x", "mi350x", "mi355x"])
def test_roofline_from_catalog_for_every_profile(gpu_key):
    cat = load_catalog()
    model = cat.find_model("V4.1-Flash")
    gpu, profile = cat.find_gpu(gpu_key), model.profiles[gpu_key]
    cost = from_catalog(model, gpu, profile)
    bandwidth = profile.tp * gpu.hbm_bandwidth_tbps * 1e12 * 0.8
    active_bytes = model.params["active_output_token_b"] * model.params["weight_bytes_per_step_gb"] \
        / model.params["backbone_b"] * 1e9
    # One token: bandwidth bound, TP divides the active bytes.
    assert float(cost.verify_seconds(1)) == pytest.approx(active_bytes / bandwidth, rel=1e-9)
    # A saturated step reads the whole 290 GB (768 tokens pad to the captured 768).
    assert float(cost.verify_seconds(768)) == pytest.approx(
        max(290e9 / bandwidth, 768 * 32e9 / (profile.tp * gpu.peak_fp8_tflops * 1e12 * 0.5)), rel=1e-4)
    assert cost.capture_sizes[-1] == 1024 and 768 in cost.capture_sizes
    assert float(cost.verify_seconds(5)) == float(cost.verify_seconds(8))   # padded to the graph size 8
    assert 0 < cost.draft_seconds(1, 5) < float(cost.verify_seconds(6))


# --- measured tables -----------------------------------------------------------------------------------


def test_measured_table_follows_vllms_rules():
    """docs/scheduler.md, "Executable goldens": verify samples (1,10) (2,10.2) (4,10.4) (8,11) (16,13), capture limit 8
    => table[0..24] = 10,10,10.2,10.4,10.4,11,11,11,11,13 x8,13.25,...,15; draft (1,1) (4,1.2) (8,1.5)."""
    cost = MeasuredCost.from_samples(verify=[(1, 10), (2, 10.2), (4, 10.4), (8, 11), (16, 13)],
                                     draft=[(1, 1), (4, 1.2), (8, 1.5)], capture_sizes=[1, 2, 4, 8])
    table = (cost.verify_seconds(np.arange(25)) * 1000).round(6).tolist()
    expected = [10, 10, 10.2, 10.4, 10.4, 11, 11, 11, 11] + [13] * 8 + [13 + 0.25 * i for i in range(1, 9)]
    assert table == pytest.approx(expected)
    assert [round(cost.draft_seconds(n, 3) * 1000, 6) for n in range(1, 9)] == [1, 1.2, 1.2, 1.2, 1.5, 1.5, 1.5, 1.5]
    assert cost.draft_seconds(4, 0) == 0.0


def test_measured_table_is_monotone_and_uses_medians():
    cost = MeasuredCost.from_samples(verify=[(8, 5.0), (8, 7.0), (8, 6.0), (16, 5.5), (32, 9.0)])
    assert cost.verify_ms == ((8, 6.0), (16, 5.5), (32, 9.0))
    ms = cost.verify_seconds([8, 16, 32]) * 1000
    assert ms.tolist() == [6.0, 6.0, 9.0]  # running max: a faster bigger graph cannot be cheaper


def test_load_json_and_csv(tmp_path):
    j = tmp_path / "costs.json"
    j.write_text(json.dumps({"verify": [[1, 10], [8, 11], [16, 13]], "draft": [[1, 1.0]], "capture_sizes": [1, 8, 16]}))
    cost = load_cost_table(j)
    assert cost.capture_sizes == (1, 8, 16) and cost.draft_ms == ((1, 1.0),)
    assert float(cost.verify_seconds(5)) * 1000 == pytest.approx(11.0)
    c = tmp_path / "costs.csv"
    c.write_text("# profiled at 8192 context\ntokens,ms\n1,10\n8,11\n16,13\n")
    cost = load_cost_table(c, capture_sizes=[1, 8, 16])
    assert cost.verify_ms == ((1, 10.0), (8, 11.0), (16, 13.0)) and cost.draft_ms == ()


@pytest.mark.parametrize("name, text, fragment", [
    ("bad.json", "{not json", "malformed JSON"),
    ("nokey.json", '{"draft": [[1, 2]]}', "verify"),
    ("neg.json", '{"verify": [[1, -2]]}', "non-negative"),
    ("zero.json", '{"verify": [[0, 2]]}', "positive integer"),
    ("frac.json", '{"verify": [[1.5, 2]]}', "positive integer"),
    ("pair.json", '{"verify": [[1, 2, 3]]}', "[size, ms] pair"),
    ("empty.json", '{"verify": []}', "no samples"),
    ("extra.json", '{"verify": [[1, 2]], "verfy": 1}', "unknown keys"),
    ("nan.csv", "tokens,ms\n1,nan\n", "finite"),
    ("header.csv", "size,time\n1,2\n", "header"),
    ("word.csv", "tokens,ms\n1,fast\n", "not a number"),
    ("empty.csv", "", "empty cost table"),
])
def test_malformed_tables_give_one_line_errors(tmp_path, name, text, fragment):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError) as err:
        load_cost_table(path)
    assert fragment in str(err.value) and "\n" not in str(err.value) and name in str(err.value)


def test_missing_table_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_cost_table(tmp_path / "nope.json")


@pytest.mark.parametrize("capture_sizes", [(), (1, 2, 4, 8)])  # dense: nothing captured, or a sample at every size
def test_a_dense_table_with_the_drafter_inside_says_so_too(capture_sizes):
    """`includes_draft`: the warning that the step times carry the measured launch's drafter is said for a dense
    table as for a sparse one (it was said only for sparse tables)."""
    verify = [(1, 10.0), (2, 11.0), (4, 12.0), (8, 14.0)]
    cost = MeasuredCost.from_samples(verify, capture_sizes=capture_sizes, includes_draft=True)
    assert cost.dense
    assert any("include the drafter" in n for n in cost.notes())
    assert not any("include the drafter" in n for n in MeasuredCost.from_samples(verify, capture_sizes=capture_sizes).notes())
