"""Gloo binds the interface GLOO_SOCKET_IFNAME names (what --iface exports), shown on separate network stacks
(tests/slow/netns.py) with torch.distributed itself: vLLM on CPU forms its cross-node groups this way
(vllm/distributed/parallel_state.py init_distributed_environment: init_process_group over a tcp:// init
method, backend gloo), and torch reads GLOO_SOCKET_IFNAME when it makes a Gloo group
(pytorch torch/csrc/distributed/c10d/init.cpp). Cheap: two torch processes, no vLLM load.

Node 1 has two links on the bridge: eth-i28 (10.233.0.2, the kernel's route to the head) and eth-i28b
(10.233.0.12). Named eth-i28b, Gloo listens on 10.233.0.12 only (the address it gives its peers), not on the
kernel's 10.233.0.2; its outgoing connections take the kernel's route. Named lo, rank 1 listens on 127.0.0.1,
an address no peer can reach: by hand here a 2-rank group then formed once (rank 1 dialled the head) and hung
once (no all_reduce 25 s past its 15 s timeout), so it is no test; the launcher refuses such an --iface before
vLLM starts (test_multinode_netns.py::test_a_wrong_iface_fails_at_once_with_one_line).
Not yet run on MI300-class hardware (RCCL reads NCCL_SOCKET_IFNAME there; not shown here).
"""

from __future__ import annotations

import subprocess

import pytest

from tests.slow import netns

pytestmark = pytest.mark.slow

STORE_PORT = 29501  # vLLM's default --master-port
SECOND = "eth-i28b"
RANK = r'''
import datetime, sys, torch, torch.distributed as dist
rank, master, timeout = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
dist.init_process_group("gloo", init_method=f"tcp://{master}:%d", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=timeout))
t = torch.ones(1) * (rank + 1)
dist.all_reduce(t)
print("all_reduce", t.item(), flush=True)
sys.stdin.readline()  # hold the group while the test reads the sockets
''' % STORE_PORT


@pytest.fixture(scope="module")
def nodes():
    why = netns.available()
    if why:
        pytest.skip(why)
    n = netns.Nodes("gloo", ["n0", "n1"], net=233)
    try:
        n.add_link("n1", SECOND, "10.233.0.12")
        yield n
    finally:
        left = n.delete()
    assert not left, left


def start(nodes, vllm_venv, node: str, rank: int, iface: str, timeout_s: float) -> subprocess.Popen:
    env = {"PATH": "/usr/bin:/bin", "GLOO_SOCKET_IFNAME": iface, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(nodes.exec_argv(node, [str(vllm_venv / "bin" / "python"), "-c", RANK, str(rank),
                                                   nodes.addresses["n0"], str(timeout_s)]),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def sockets(nodes, node: str, pid: int, state: str) -> list[tuple[str, str]]:
    return [(local, peer) for local, peer, p in nodes.sockets(node, state) if p == pid]


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def test_gloo_binds_the_named_interface_not_the_kernels_route(nodes, vllm_venv):
    kernel = subprocess.run(nodes.exec_argv("n1", ["ip", "-o", "route", "get", nodes.addresses["n0"]]),
                            capture_output=True, text=True, timeout=30).stdout
    assert f" dev {netns.IFACE} src 10.233.0.2 " in kernel, kernel  # the kernel's choice is the first link
    r0 = start(nodes, vllm_venv, "n0", 0, netns.IFACE, 60)
    r1 = start(nodes, vllm_venv, "n1", 1, SECOND, 60)
    try:
        for r in (r0, r1):
            line = r.stdout.readline()
            assert line.strip() == "all_reduce 3.0", (line, r.stderr.read() if r.poll() is not None else "")
        listening = sockets(nodes, "n1", r1.pid, "listening")
        connected = sockets(nodes, "n1", r1.pid, "established")
        print(f"\nrank 1 (GLOO_SOCKET_IFNAME={SECOND}) listening {listening}, connected {connected}")
        # Gloo's device listens on the named interface's address only: the address it gives its peers.
        assert listening and {a.rsplit(":", 1)[0] for a, _ in listening} == {"10.233.0.12"}, listening
        # Its outgoing connections (here: to the head's Gloo listener and the store) take the kernel's route.
        assert connected and all(a.replace("[::ffff:", "").startswith("10.233.0.2") and "10.233.0.1" in p
                                 for a, p in connected), connected
    finally:
        stop(r0, r1)

