"""What `up`'s steps (and the service's starts) do, as typed actions: run an argv, write a file, wait for a URL, say
a sentence.

A step lists its actions once; `execute` runs a Run and `render` prints any of them for --dry-run. The printed
text is a bash script: a Run is its argv shell-quoted (shlex), broken only between words with ` \\`, so a paste
runs exactly the argv `execute` runs; everything else is a `#` comment, wrapped as comments.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass

from rocm_dspark import textwidth


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    root: bool = False  # through sudo unless this process is root
    detach: bool = False  # a server left running (printed with ` &`; rocm_dspark.service.control starts it)


@dataclass(frozen=True)
class Write:
    path: str
    mode: int
    what: str = "file"


@dataclass(frozen=True)
class Wait:
    url: str
    deadline_s: float
    what: str = ""


@dataclass(frozen=True)
class Say:
    text: str


Action = Run | Write | Wait | Say


class Failed(Exception):
    """One line: what failed, and the fix; optionally a log tail to show first (`up` fails its step with it)."""

    def __init__(self, message: str, fix: str, log_tail: str = ""):
        super().__init__(message)
        self.message, self.fix, self.log_tail = message, fix, log_tail


def argv_of(action: Run) -> list[str]:
    """The argv this process executes for `action` (sudo first where it is not root)."""
    head = ["sudo"] if action.root and os.geteuid() != 0 else []
    if action.env and head:  # sudo drops the caller's environment: `env` sets it past sudo
        head += ["env", *(f"{k}={v}" for k, v in action.env)]
    return [*head, *action.argv]


def _words(action: Run) -> list[str]:
    lead = [] if action.root and os.geteuid() != 0 else [f"{k}={shlex.quote(v)}" for k, v in action.env]
    return lead + [shlex.quote(w) for w in argv_of(action)]


def _text(action: Action) -> str:
    if isinstance(action, Say):
        return action.text
    if isinstance(action, Write):
        return f"writes the {action.what} {shlex.quote(action.path)} (mode {action.mode:04o})"
    assert isinstance(action, Wait)
    return f"waits for {action.url} {action.what} (deadline {action.deadline_s:.0f} s)"


def render(actions, indent: str = "    ", width: int | None = None) -> list[str]:
    """The lines --dry-run prints for `actions`: commands bash runs as they are, the rest comments."""
    width = width or textwidth.columns()
    out: list[str] = []
    for a in actions:
        if isinstance(a, Run):
            words = _words(a) + (["&"] if a.detach else [])
            line = indent + words[0]
            for w in words[1:]:
                if len(line) + 1 + len(w) + 2 > width and line.strip():
                    out.append(line + " \\")
                    line = indent + "  " + w
                else:
                    line += " " + w
            out.append(line)
        else:
            out += textwidth.wrap(_text(a), indent + "# ", indent + "#   ", width)
    return out


def execute(action: Run, timeout: float = 300.0) -> tuple[int, str]:
    """Run `action`; (exit status, its output)."""
    env = {**os.environ, **dict(action.env)}
    try:
        proc = subprocess.run(argv_of(action), capture_output=True, text=True, timeout=timeout, env=env)
    except OSError as exc:
        return 127, str(exc)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def run_all(commands: list[Run], say, what: str, fix: str, timeout: float = 120.0) -> None:
    """Execute each command, said as --dry-run prints it; the first that fails raises Failed."""
    for c in commands:
        say(f"  $ {shlex.join(argv_of(c))}")
        code, text = execute(c, timeout=timeout)
        if code != 0:
            last = text.splitlines()[-1] if text else "no output"
            raise Failed(f"{what}: `{shlex.join(c.argv)}` failed (exit {code}): {last}", fix)
