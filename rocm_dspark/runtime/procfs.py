"""What Linux's /proc says about a process: who holds a listening TCP port, and a process's command line,
environment, owner, parent and start time.

Formats: proc(5) (https://man7.org/linux/man-pages/man5/proc.5.html): /proc/net/tcp and tcp6 (hex local
address:port, state 0A = LISTEN, inode), /proc/<pid>/fd/* links `socket:[inode]`, NUL-separated cmdline and
environ, `Uid:` (real, effective, saved, fs) in status, ppid (field 4) and starttime (field 22) in stat.
A process of another user hides its fds and environ unless we are root: those read as "unknown" (None), never
as a match.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
TCP_LISTEN = "0A"


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat from field 3 (state) on, or None when the process is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: the fields after it start past the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (stat field 22), or None when it is gone."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields else None


def parent(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[1]) if fields else None


def ancestors(pid: int) -> list[int]:
    """Parent, grandparent, ... up to (not including) pid 0."""
    out: list[int] = []
    p = parent(pid)
    while p and p not in out:
        out.append(p)
        p = parent(p)
    return out


def real_uid(pid: int) -> int | None:
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _nul_list(path: Path) -> list[str] | None:
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    parts = raw.split(b"\0")
    if parts[-1] == b"":  # the list ends with a NUL
        parts.pop()
    return [os.fsdecode(part) for part in parts]


def cmdline(pid: int) -> list[str] | None:
    """The argv the process was started with (None: gone or unreadable; [] for a kernel thread)."""
    return _nul_list(PROC / str(pid) / "cmdline")


def environ(pid: int) -> dict[str, str] | None:
    """The environment the process was started with (None: gone, or another user's and we are not root)."""
    items = _nul_list(PROC / str(pid) / "environ")
    if items is None:
        return None
    return dict(item.split("=", 1) for item in items if "=" in item)


def listening_inodes(port: int) -> set[int]:
    """Socket inodes of TCP sockets in LISTEN on `port` (any address, IPv4 and IPv6), in this network namespace."""
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == TCP_LISTEN and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(f[9]))
    return inodes


def socket_holders(inodes: set[int]) -> list[int]:
    """Pids with an open fd on one of these sockets (only processes whose fds we may read)."""
    if not inodes:
        return []
    links = {f"socket:[{i}]" for i in inodes}
    out = []
    for entry in os.listdir(PROC):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(PROC / entry / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(PROC / entry / "fd" / fd) in links:
                    out.append(int(entry))
                    break
            except OSError:
                continue
    return sorted(out)
