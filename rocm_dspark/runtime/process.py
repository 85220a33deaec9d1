"""The one vLLM process manager: start a server command, wait until it serves, stop its process group.

It runs any command (`vllm serve ...`, a generated launcher script) in its own process group with output to a log
file, so that stop() takes down vLLM's EngineCore/Worker children too. The wait is rocm_dspark.runtime.readiness's;
requests go through `server.client` (rocm_dspark.runtime.client.VllmClient).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rocm_dspark.errors import UsageError
from rocm_dspark.runtime.client import VllmClient, loopback_host
from rocm_dspark.runtime.procfs import stat_fields
from rocm_dspark.runtime.readiness import Readiness, ReadyCheck, poll_until, wait_ready
from rocm_dspark.runtime.refusal import find_refusal


def listening(host: str, port: int) -> bool:
    """Does something accept TCP connections on host:port? (A wildcard bind address is asked on loopback.)"""
    host = loopback_host(host)
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class StopResult:
    exit_code: int | None  # the leader's status (negative = killed by that signal), None: never started or not ours
    killed: bool  # SIGKILL was needed after the grace period
    elapsed_s: float
    leftover: tuple[int, ...] = ()  # pids still alive afterwards; empty means nothing left behind


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, pgrp) for every live process (zombies left out), read from /proc (Linux)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := stat_fields(int(entry))) and fields[0] != "Z":
            table[int(entry)] = (int(fields[1]), int(fields[2]))
    return table


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except ProcessLookupError:
            return []
    return [pid for pid, (_ppid, pgrp) in _proc_table().items() if pgrp == pgid]


def descendants(pid: int) -> list[int]:
    """Live descendants of `pid` (children that moved to another session included)."""
    if not os.path.isdir("/proc"):
        return []
    children: dict[int, list[int]] = {}
    for p, (ppid, _pgrp) in _proc_table().items():
        children.setdefault(ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def is_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, already dead but not yet reaped, counts as gone)."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def stop_group(
    pgid: int, grace_s: float, leader: subprocess.Popen | None = None, *, term_strays: bool = True
) -> StopResult:
    """SIGTERM process group `pgid` (and any descendant that left it), SIGKILL what is left after `grace_s`.

    `leader`: our Popen of the group's leader, reaped as it exits and killed first. term_strays=False: the
    descendants that left the group get no SIGTERM from here, for a leader that stops them itself (a launcher
    drains vLLM, which runs in its own group). Returns only when no process of the group is left, or says which
    pids survived.
    """
    t0 = time.monotonic()
    strays = set(descendants(pgid))  # before the leader dies and its children are re-parented

    def remaining() -> list[int]:
        if leader is not None:
            leader.poll()  # reap the leader so it does not linger as a zombie member
        return sorted(set(group_members(pgid)) | {p for p in strays if is_alive(p)})

    def signal_all(sig: int, others: set[int]) -> None:
        # Only pids seen alive just now: a recycled pid must never receive our signal.
        with contextlib.suppress(ProcessLookupError):
            if group_members(pgid):
                os.killpg(pgid, sig)
        for p in others:
            with contextlib.suppress(ProcessLookupError):
                if is_alive(p):
                    os.kill(p, sig)

    def wait_gone(seconds: float) -> None:
        poll_until(lambda: None if remaining() else True, seconds, max_s=0.1)

    killed = False
    if remaining():
        signal_all(signal.SIGTERM, strays if term_strays else set())
        wait_gone(grace_s)
        if remaining():
            killed = True
            # The leader first: helpers that watch their parent (vLLM's EngineCore, Python's
            # multiprocessing resource tracker, which ignores SIGTERM) then exit and clean up
            # shared memory by themselves; whatever is left after 2 s is killed too.
            if leader is not None and leader.poll() is None:
                leader.kill()
                wait_gone(2)
            signal_all(signal.SIGKILL, strays)
            wait_gone(10)
    code = None
    if leader is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = leader.wait(timeout=5)
    return StopResult(code, killed, time.monotonic() - t0, tuple(remaining()))


class VllmServer:
    """A server process: start(), wait_ready(), stop(); also a context manager. `client` talks to it.

    >>> with VllmServer(["vllm", "serve", model, "--port", str(port)], port=port) as srv:
    ...     r = srv.wait_ready(300)
    ...     if not r.ready: raise SystemExit(r.reason())
    ...     srv.client.complete("def f():", 8)
    """

    def __init__(
        self,
        argv: list[str] | tuple[str, ...],
        env: dict[str, str] | None = None,
        *,
        port: int,
        host: str = "127.0.0.1",
        log_path: str | os.PathLike | None = None,
    ):
        if not argv:
            raise UsageError("empty server command: pass the argv of `vllm serve ...` or of a launcher")
        self.argv = [str(a) for a in argv]
        self.env = dict(env or {})
        self.client = VllmClient(host, port)
        self.host, self.port = self.client.host, self.client.port
        self.log_path = (
            Path(log_path) if log_path else Path(tempfile.mkdtemp(prefix="rocm-dspark-server-")) / "server.log"
        )
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return self.client.base_url

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> VllmServer:
        if self.proc is not None:
            raise UsageError("this server was already started: make a new VllmServer for another run")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            try:
                # Own session = own process group: stop() signals vLLM's children along with it.
                self.proc = subprocess.Popen(
                    self.argv,
                    env={**os.environ, **self.env},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                raise UsageError(f"cannot start {self.argv[0]!r}: {exc.strerror}; check the command path") from None
        return self

    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def refusal(self) -> str | None:
        return find_refusal(self.log_text())

    def ready_check(self, gate: Callable[[], str | None] | None = None) -> ReadyCheck:
        """A look at this server for rocm_dspark.runtime.readiness.poll_until (its exit ends the wait early)."""
        if self.proc is None:
            raise UsageError("wait_ready() before start(): start the server first")
        return ReadyCheck(self.client, exit_code=self.proc.poll, log_text=self.log_text, gate=gate)

    def wait_ready(self, deadline_s: float = 600.0) -> Readiness:
        """Poll /health then /v1/models until both answer, the process exits, or `deadline_s` passes."""
        return wait_ready(self.ready_check(), deadline_s)

    def stop(self, grace_s: float = 15.0) -> StopResult:
        """SIGTERM the server's process group, SIGKILL after `grace_s` (stop_group)."""
        if self.proc is None:
            return StopResult(None, False, 0.0)
        return stop_group(self.proc.pid, grace_s, leader=self.proc)  # start_new_session: pid = group id

    def __enter__(self) -> VllmServer:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
