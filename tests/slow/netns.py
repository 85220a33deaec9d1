"""Separate network stacks for multi-node tests: network namespaces on one bridge, each a "node".

`Nodes(prefix, names)` creates one namespace per name plus a bridge namespace; node i gets the address
10.<net>.0.<i+1>/24 on an interface called IFACE inside it (interface names are per namespace, so every
node's link has the same name, as on a real cluster), and loopback up. The addresses exist only inside these
namespaces. `delete()` removes every namespace it created (their links go with them), also after a failure;
`exec_argv(name, argv)` prefixes `ip netns exec`. Needs root and iproute2.
"""

from __future__ import annotations

import shutil
import subprocess

IFACE = "eth-i28"  # <= 15 characters


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def available() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    r = subprocess.run(["ip", "netns", "add", "i28-probe"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", "i28-probe"], capture_output=True, timeout=30)
    return None


class Nodes:
    def __init__(self, prefix: str, names: list[str], net: int = 228):
        self.prefix, self.names, self.created = prefix, list(names), []
        self.addresses = {n: f"10.{net}.0.{i + 1}" for i, n in enumerate(self.names)}
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
        for i, name in enumerate(self.names):
            ns = self.ns(name)
            self._add_ns(ns)
            node_end, br_end = f"{self.prefix}n{i}", f"{self.prefix}b{i}"
            # Created inside the bridge namespace, so no link ever appears in the root namespace.
            _ip("-n", br, "link", "add", node_end, "type", "veth", "peer", "name", br_end)
            _ip("-n", br, "link", "set", node_end, "netns", ns)
            _ip("-n", ns, "link", "set", node_end, "name", IFACE)
            _ip("-n", ns, "addr", "add", f"{self.addresses[name]}/24", "dev", IFACE)
            _ip("-n", ns, "link", "set", IFACE, "up")
            _ip("-n", br, "link", "set", br_end, "master", "br0")
            _ip("-n", br, "link", "set", br_end, "up")

    def exec_argv(self, name: str, argv) -> list[str]:
        return ["ip", "netns", "exec", self.ns(name), *argv]

    def delete(self) -> list[str]:
        """Delete every namespace made here; returns those that could not be deleted."""
        left = []
        for ns in reversed(self.created):
            r = subprocess.run(["ip", "netns", "delete", ns], capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                left.append(f"{ns}: {r.stderr.strip()}")
        self.created = []
        return left
