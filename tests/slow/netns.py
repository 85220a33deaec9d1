"""Separate network stacks for multi-node tests: network namespaces on one bridge, each a "node".

`Nodes(tag, names)` creates one namespace per name plus a bridge namespace; node i gets the address
10.<net>.0.<i+1>/24 on an interface called IFACE inside it (interface names are per namespace, so every
node's link has the same name, as on a real cluster), and loopback up. The addresses and links exist only
inside these namespaces (the veth pairs are made inside the bridge namespace), so two test processes never
share one: only namespace names are global, and they carry PREFIX and this process's pid
(`<PREFIX>-<tag>-<pid>-<name>`), so two pytest-xdist workers cannot collide. `delete()` removes every
namespace it created (their links go with them), also after a failure; `sweep()` deletes namespaces of this
prefix left by a process that is gone. `exec_argv(name, argv)` prefixes `ip netns exec`. Needs root and iproute2.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

IFACE = "eth-i28"  # <= 15 characters
PREFIX = os.environ.get("ROCM_DSPARK_NETNS_PREFIX", "rdsp")  # a session's own prefix, e.g. its branch name


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _namespaces() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]


def sweep() -> list[str]:
    """Delete this prefix's namespaces whose creating process is gone (a killed run); returns their names."""
    gone = []
    for ns in _namespaces():
        m = re.match(rf"^{re.escape(PREFIX)}-[^-]+-(\d+)-", ns)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)
            gone.append(ns)
    return gone


def available() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    probe = f"{PREFIX}-probe-{os.getpid()}-x"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True, timeout=30)
    sweep()
    return None


class Nodes:
    def __init__(self, tag: str, names: list[str], net: int = 228):
        self.prefix, self.names, self.created, self.net = f"{PREFIX}-{tag}-{os.getpid()}", list(names), [], net
        self.addresses = {n: f"10.{net}.0.{i + 1}" for i, n in enumerate(self.names)}
        self._links = 0
        try:
            self._create()
        except BaseException:
            self.delete()
            raise

    def ns(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self.created.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def _create(self) -> None:
        br = self.ns("br")
        self._add_ns(br)
        _ip("-n", br, "link", "add", "br0", "type", "bridge")
        _ip("-n", br, "link", "set", "br0", "up")
        for name in self.names:
            self._add_ns(self.ns(name))
            self.add_link(name, IFACE, self.addresses[name])

    def add_link(self, name: str, ifname: str, address: str, bridged: bool = True) -> None:
        """A veth named `ifname` in node `name` with `address`/24: on the bridge, or (bridged=False) a link to
        nowhere (its peer stays in the node), as a second NIC on a network that does not reach the others."""
        ns, br, i = self.ns(name), self.ns("br"), self._links
        self._links += 1
        node_end, br_end = f"v{i}n", f"v{i}b"
        # Created inside the bridge namespace, so no link ever appears in the root namespace.
        _ip("-n", br, "link", "add", node_end, "type", "veth", "peer", "name", br_end)
        _ip("-n", br, "link", "set", node_end, "netns", ns)
        _ip("-n", ns, "link", "set", node_end, "name", ifname)
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", ifname)
        _ip("-n", ns, "link", "set", ifname, "up")
        if bridged:
            _ip("-n", br, "link", "set", br_end, "master", "br0")
            _ip("-n", br, "link", "set", br_end, "up")
        else:  # the peer joins the node itself: the link is up but leads nowhere
            _ip("-n", br, "link", "set", br_end, "netns", ns)
            _ip("-n", ns, "link", "set", br_end, "up")

    def exec_argv(self, name: str, argv) -> list[str]:
        return ["ip", "netns", "exec", self.ns(name), *argv]

    def sockets(self, name: str, state: str) -> list[tuple[str, str, int]]:
        """(local, peer, pid) of every TCP socket in `state` in node `name` (`ss -tnp` inside its namespace)."""
        out = subprocess.run(self.exec_argv(name, ["ss", "-tnpH", "state", state]), capture_output=True, text=True,
                             timeout=30).stdout
        # With a state filter ss leaves out the State column: Recv-Q Send-Q Local Peer users:(("x",pid=N,fd=M),...).
        return [(m.group(1), m.group(2), int(pid)) for m in re.finditer(r"^\d+\s+\d+\s+(\S+)\s+(\S+)\s+users:(.*)$", out, re.M)
                for pid in re.findall(r"\bpid=(\d+)", m.group(3))]

    def delete(self) -> list[str]:
        """Delete every namespace made here; returns those that could not be deleted."""
        left = []
        for ns in reversed(self.created):
            r = subprocess.run(["ip", "netns", "delete", ns], capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                left.append(f"{ns}: {r.stderr.strip()}")
        self.created = []
        return left
