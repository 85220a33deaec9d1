"""The group launcher's --iface rule on loopback, fast (the stand-in `vllm` of tests/helpers/launcher_rig.py, never
started): an interface that exists but does not hold the group's address is refused in one line before vLLM
starts. The same rule on separate network stacks (lo, a second NIC, the head's side) with the real launcher:
tests/slow/test_multinode_netns.py::test_a_wrong_iface_fails_at_once_with_one_line."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tests.helpers.launcher_rig import Rig, free_port, make_plan


def _other_iface() -> str | None:
    names = sorted(n for n in os.listdir("/sys/class/net") if n != "lo") if os.path.isdir("/sys/class/net") else []
    return names[0] if names else None


@pytest.mark.skipif(shutil.which("ip") is None or _other_iface() is None, reason="needs iproute2 and an interface besides lo")
def test_an_existing_iface_that_does_not_hold_the_group_address_is_refused_at_once(tmp_path):
    iface, rig, port = _other_iface(), Rig(tmp_path), free_port()
    script = rig.write(make_plan(free_port(), extra=("--headless",)), name="w",
                       group={"group_role": "worker", "ready_host": "127.0.0.1", "ready_port": free_port(),
                              "join_host": "127.0.0.1", "join_port": port, "group_nodes": 2, "iface": iface})
    t0 = time.monotonic()
    res = rig.run(script, ROCM_DSPARK_JOIN_TIMEOUT_S="30", ROCM_DSPARK_GROUP_DIR=str(tmp_path / "group"), timeout=20)
    took = time.monotonic() - t0
    errors = [ln for ln in res.stderr.decode().splitlines() if "]: error: " in ln]
    assert res.returncode == 1 and errors == [
        f"rocm-dspark[w]: error: cannot join the group at 127.0.0.1:{port} (interface {iface}): 127.0.0.1 is this "
        f"node's address on interface lo, not {iface}; Gloo/RCCL would bind {iface} (GLOO_SOCKET_IFNAME), not the "
        "address the group meets at: regenerate with --iface lo"], res.stderr
    assert took < 10 and rig.records() == []  # at once (not after the 30 s join timeout), vLLM never started
