"""`rocm-dspark plan --nodes N`: one line per strategy; only DP replicas of the profile's TP group get a number."""

from __future__ import annotations

import json

from tests.conftest import cli_env
from tests.helpers import run_cli


def test_plan_nodes_predicts_tp_dp_and_says_why_not_for_the_rest():
    r = run_cli(["plan", "--gpu", "mi355x", "--concurrency", "512", "--nodes", "2", "--json"],
                       capture_output=True, text=True, env=cli_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["strategies"]["mi355x"][1:]
    by = {row["strategy"]: row for row in rows}
    assert list(by) == ["multi_node_tp", "multi_node_tep", "multi_node_dep", "multi_node_tp_dp", "multi_node_tp_pp",
                        "pd_cluster", "replicas"]
    tpdp = by.pop("multi_node_tp_dp")
    # 2 nodes x 8 GPUs / TP4 = 4 replicas; at c=512 every rank runs its max_num_seqs=128 and the single TP4 group
    # is capped at 128 too, so 4 independent replicas would give exactly 4x. DP ranks step in lockstep and pay
    # the largest rank's tokens (the planner's DP model), so the prediction sits a little below 4x, never above.
    assert tpdp["dp"] == 4 and tpdp["tp"] == 4
    assert 0.85 * 4 <= tpdp["speedup"] <= 4.0 * 1.01, tpdp
    assert all(row["tokens_per_s"] is None and row["why"] for row in by.values())


def test_plan_nodes_text_has_one_line_per_strategy():
    r = run_cli(["plan", "--gpu", "mi300x", "--concurrency", "64", "--nodes", "3"],
                       capture_output=True, text=True, env=cli_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    lines: list[str] = []
    for line in r.stdout.split("Strategies at 3 node(s)")[1].split("):\n", 1)[1].splitlines():
        if line.startswith("    ") and lines:  # a wrapped row goes on the row above (rocm_dspark/textwidth.py)
            lines[-1] += " " + line.strip()
        elif line.startswith("  "):
            lines.append(line)
        else:
            break
    assert [line.split()[0] for line in lines] == ["multi_node_tp", "multi_node_tep", "multi_node_dep",
                                                   "multi_node_tp_dp", "multi_node_tp_pp", "pd_cluster",
                                                   "replicas"]
    assert "DP3 x TP8" in lines[3]
