"""Is the server on a port the plan's own command? What lets the live level count on a server the probe did
not start (so `up` probes the server it started instead of loading the 511 GB model a second time).

The rules (docs/probe.md, "Trust model for probe records"): /proc (rocm_dspark.runtime.procfs) must show that the
process serving the port (the holder of its listening socket, or the nearest common parent of all holders:
vLLM's API-server workers rename themselves and share the parent's socket) runs as this user or root, with
exactly the plan's argv (at most a Python interpreter and its options in front, as a console script's shebang
runs it) and every variable of the plan's environment, and is the same process (pid and start time) before and
after the level's requests. Not shown: which vLLM files the program loads (as when the probe starts it), or, for
a container, which image it runs (the launcher runs the digest it pinned; rocm_dspark/up).
"""

from __future__ import annotations

import os
import shlex

from rocm_dspark.runtime import procfs


def _short(argv) -> str:
    text = " ".join(shlex.quote(a) for a in argv)
    return text if len(text) <= 160 else text[:157] + "..."


def argv_difference(actual: list[str], want: list[str]) -> str | None:
    """None when `actual` (a /proc cmdline) runs `want`, else the first difference, in words."""
    if not actual:
        return "its command line is empty"
    name = os.path.basename(want[0])
    at = next((i for i in range(min(3, len(actual))) if os.path.basename(actual[i]) == name), None)
    if at is None:
        return f"it runs {_short(actual[:3])}, not {want[0]}"
    prefix = actual[:at]
    if prefix and not (os.path.basename(prefix[0]).startswith("python") and all(a.startswith("-") for a in prefix[1:])):
        return f"{actual[at]} is run through {_short(prefix)}, not directly or by a Python interpreter"
    got, expected = actual[at + 1 :], list(want[1:])
    for i, (g, w) in enumerate(zip(got, expected)):
        if g != w:
            return f"argument {i + 1} is {_short([g])}, the plan's is {_short([w])}"
    if len(got) != len(expected):
        extra = got[len(expected) :] or expected[len(got) :]
        return (
            f"it has {len(got)} arguments, the plan {len(expected)} "
            f"({'extra' if len(got) > len(expected) else 'missing'}: {_short(extra)})"
        )
    return None


def env_difference(actual: dict[str, str] | None, want: dict) -> str | None:
    if actual is None:
        return "its environment cannot be read (another user's process?)"
    wrong = sorted(k for k, v in want.items() if actual.get(k) != str(v))
    return f"its environment differs from the plan's in {', '.join(wrong)}" if wrong else None


def _server_pid(holders: list[int]) -> int:
    chains = [[h] + procfs.ancestors(h) for h in holders]
    common = set(chains[0]).intersection(*chains[1:])
    return next(p for p in chains[0] if p in common) if common else holders[0]


def identify(argv, env: dict, port: int, whose: str = "the plan's") -> dict:
    """Evidence about the process serving `port` (JSON-ready); "verified" is True only when every rule holds.
    `whose` names the command in the reasons ("the plan's", or a --server-json file's)."""
    ev: dict = {"port": port, "verified": False, "pid": None}
    inodes = procfs.listening_inodes(port)
    if not inodes:
        ev["why"] = f"nothing listens on port {port}"
        return ev
    holders = procfs.socket_holders(inodes)
    ev["holders"] = holders
    if not holders:
        ev["why"] = f"no process we may inspect holds the listening socket on port {port} (another user's?)"
        return ev
    pid = _server_pid(holders)
    ev.update(pid=pid, start_ticks=procfs.start_ticks(pid), uid=procfs.real_uid(pid), cmdline=procfs.cmdline(pid))
    if ev["uid"] not in (os.getuid(), 0):
        why: str | None = f"process {pid} runs as uid {ev['uid']}, not as this user ({os.getuid()}) or root"
    else:
        why = argv_difference(ev["cmdline"] or [], list(argv)) or env_difference(procfs.environ(pid), env)
        why = f"process {pid} is not {whose} command: {why}" if why else None
    ev["verified"] = why is None
    ev["why"] = why or f"process {pid} (uid {ev['uid']}) serves port {port} with {whose} argv and environment"
    return ev


def still_serving(before: dict, argv, env: dict, port: int, whose: str = "the plan's") -> dict:
    """identify() again after the requests: verified only if it is the same process as before."""
    after = identify(argv, env, port, whose)
    if (
        before.get("verified")
        and after["verified"]
        and (after["pid"], after["start_ticks"]) != (before["pid"], before["start_ticks"])
    ):
        after.update(
            verified=False, why=f"another process serves port {port} now (pid {before['pid']} -> {after['pid']})"
        )
    return after
