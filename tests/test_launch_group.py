"""A multi-node group's launchers, run for real on loopback with the stand-in `vllm` of test_launchers_run.py:
the head's adaptive start is refused, the head publishes block verification in the shared group directory, and
the worker (which had started adaptive) stops and restarts with block verification: the group falls back
together. The worker is ready only when the head answers /health and /v1/models. No AMD GPU involved."""

from __future__ import annotations

import json
import signal
import time

import pytest

from rocm_dspark.cli import main as _cli_main  # noqa: F401  (the CLI imports cleanly with the group options)
from tests.test_launchers_run import Rig, alive, free_port, http_status, make_plan, wait_until


def _spec_modes(records):
    out = []
    for r in records:
        argv = [a.decode() for a in r["argv"]]
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        out.append("adaptive" if spec["enable_adaptive_verification"] else "block")
    return out


def phase(rig) -> str | None:
    try:
        return rig.state().get("phase")
    except (FileNotFoundError, ValueError):  # not written yet, or caught mid-rename
        return None


@pytest.fixture
def rigs(tmp_path):
    head, worker = Rig(tmp_path / "head"), Rig(tmp_path / "worker")
    group = tmp_path / "shared-group"
    return head, worker, group


def _write(rig, plan, name, group):
    from rocm_dspark.launch.launchers import write_launchers

    return write_launchers(plan, rig.root / "out", "shell", name=name, group=group).launcher


def test_group_falls_back_together(rigs):
    head_rig, worker_rig, group = rigs
    hp, wp = free_port(), free_port()
    head = _write(head_rig, make_plan(hp), "grp-node0-head", {"group_role": "head", "group_name": "grp"})
    worker = _write(worker_rig, make_plan(wp, extra=("--headless",)), "grp-node1-worker",
                    {"group_role": "worker", "ready_host": "127.0.0.1", "ready_port": hp, "group_name": "grp"})
    common = {"ROCM_DSPARK_GROUP_DIR": str(group)}
    w = worker_rig.start(worker, **common)
    h = None
    try:
        # The worker waits for the head's mode before it starts anything.
        assert not wait_until(lambda: worker_rig.records(), 3)
        h = head_rig.start(head, STANDIN_REFUSE_ADAPTIVE="1", STANDIN_REFUSE_AFTER="3", **common)
        assert wait_until(lambda: http_status(hp, "/v1/models") == 200, 90), "head never became ready"
        assert wait_until(lambda: phase(worker_rig) == "serving", 90), worker_rig.state()
        # The worker started adaptive (the head's first mode), then block when the head fell back. (Its readiness is
        # the head's, which can answer before the worker's block vLLM has written its record: wait for it.)
        assert wait_until(lambda: _spec_modes(worker_rig.records()) == ["adaptive", "block"], 10), worker_rig.records()
        assert _spec_modes(head_rig.records()) == ["adaptive", "block"]
        lines = (group / "grp.group-mode").read_text().splitlines()
        assert lines[0] == "2" and lines[1] == "block" and "Adaptive verification" in lines[2]
        assert worker_rig.state()["mode"] == "block" and head_rig.state()["mode"] == "block"
        # The adaptive worker process was stopped, not left running beside the block one.
        first = worker_rig.records()[0]["pids"]
        assert wait_until(lambda: not any(alive(p) for p in first), 10)
    finally:
        for proc in (w, h):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=40)
    pids = [p for rig in (head_rig, worker_rig) for r in rig.records() for p in r["pids"]]
    assert wait_until(lambda: not any(alive(p) for p in pids), 10)


def test_group_with_fallback_needs_a_shared_directory(rigs):
    head_rig, worker_rig, _ = rigs
    hp = free_port()
    head = _write(head_rig, make_plan(hp), "g-head", {"group_role": "head", "group_name": "grp"})
    worker = _write(worker_rig, make_plan(free_port()), "g-worker",
                    {"group_role": "worker", "ready_host": "127.0.0.1", "ready_port": hp, "group_name": "grp"})
    for rig, script in ((head_rig, head), (worker_rig, worker)):
        r = rig.run(script, timeout=30)
        assert r.returncode != 0
        assert b"ROCM_DSPARK_GROUP_DIR" in r.stderr and not rig.records()


def test_block_group_needs_no_directory_and_worker_waits_for_head(rigs):
    head_rig, worker_rig, _ = rigs
    hp, wp = free_port(), free_port()
    head = _write(head_rig, make_plan(hp, adaptive=False), "b-head", {"group_role": "head", "group_name": "grp"})
    worker = _write(worker_rig, make_plan(wp, adaptive=False), "b-worker",
                    {"group_role": "worker", "ready_host": "127.0.0.1", "ready_port": hp, "group_name": "grp"})
    w = worker_rig.start(worker)
    h = None
    try:
        assert wait_until(lambda: worker_rig.records(), 60)
        state = worker_rig.root / "state" / "launch-state"
        assert wait_until(state.exists, 30)
        time.sleep(2)
        assert worker_rig.state()["phase"] == "starting"  # its own vLLM runs, but the group is not up
        h = head_rig.start(head)
        assert wait_until(lambda: phase(worker_rig) == "serving", 90)
    finally:
        for proc in (w, h):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=40)


def test_cli_writes_one_launcher_per_node(tmp_path):
    from click.testing import CliRunner

    from rocm_dspark.cli import cli

    out = tmp_path / "out"
    out.mkdir()
    r = CliRunner().invoke(cli, ["launch", "--model", "V4.1-Flash", "--gpu", "mi355x", "--strategy", "multi_node_tp_pp",
                                 "--nodes", "3", "--head-address", "10.0.0.1", "--output", str(out), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"rocm-dspark-deepseek-v4-1-flash-mi355x-node{i}-{role}.sh"
                     for i, role in ((0, "head"), (1, "worker"), (2, "worker"))]
    assert data["nodes"] == 3
    text = (out / names[2]).read_text()
    assert "the worker of group" in text and "BASE_URL=http://10.0.0.1:" in text and "'--node-rank'" not in text
    assert "  --node-rank 2" in text
    from tests.test_launchers import shellcheck

    for n in names:
        shellcheck(out / n)
