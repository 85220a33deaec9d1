"""Line widths of what the commands print: prose wraps to the terminal (COLUMNS; PIPE_WIDTH when
stdout is no terminal) with a hanging indent, shell commands break between words with ` \\` continuations that
still paste and run, and tables stay within MAX_TABLE columns."""

from __future__ import annotations

import os
import re
import shlex
import sys
import textwrap

PIPE_WIDTH = 100   # a pipe, a log, a file: no terminal to ask
MIN_WIDTH = 40     # below this a hanging indent leaves no room for words
MAX_TABLE = 160    # tables are read wide, but not wider than this


def columns() -> int:
    """COLUMNS when set, else the terminal's width when stdout is one, else PIPE_WIDTH; within MIN..MAX_TABLE."""
    raw = os.environ.get("COLUMNS", "")
    width = int(raw) if raw.isdigit() else 0
    if not width:
        try:
            width = os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else PIPE_WIDTH
        except (AttributeError, OSError, ValueError):  # no real stdout (a test runner's, a closed one)
            width = PIPE_WIDTH
    return max(MIN_WIDTH, min(width, MAX_TABLE))


def aligned(rows, indent: str = "") -> list[str]:
    """Rows of cells as lines, each column padded to its widest cell (the last left as is), two spaces apart."""
    rows = [[str(c) for c in row] for row in rows]
    widths = [max((len(r[i]) for r in rows if i < len(r) - 1), default=0) for i in range(max(map(len, rows), default=0))]
    return [indent + "  ".join([c.ljust(widths[i]) for i, c in enumerate(r[:-1])] + r[-1:]).rstrip() for r in rows]


def wrap(text: str, first: str = "", rest: str | None = None, width: int | None = None) -> list[str]:
    """`text` (line breaks folded; aligned spaces kept) filled to `width` (default: columns()): the first line
    starts with `first`, the others with `rest` (default: a hanging indent, `first`'s width plus two). A word
    longer than a line (a URL, a flag) is kept whole."""
    rest = " " * (len(first) + 2) if rest is None else rest
    return textwrap.wrap(re.sub(r"\s*[\r\n]\s*", " ", text.strip()), width=width or columns(), initial_indent=first,
                         subsequent_indent=rest, break_long_words=False, break_on_hyphens=False) or [first.rstrip()]


def _pieces(word: str, first: int, room: int) -> list[str]:
    """A quoted word too long for its line -> quoted pieces (the first within `first` columns, the others within
    `room`) that bash, and shlex once the `\\`-newline continuations are joined, read back as the same word:
    split after commas, semicolons and blanks, each piece quoted on its own."""
    try:
        raw = shlex.split(word)
    except ValueError:
        return [word]
    if len(raw) != 1 or shlex.quote(raw[0]) != word:  # only a plainly quoted word: "$HOME/x" must stay as is
        return [word]
    out: list[str] = []
    cur = ""
    for tok in re.findall(r"[^,; ]*[,; ]+|[^,; ]+$", raw[0]):
        if cur and len(shlex.quote(cur + tok)) > (room if out else first):
            out.append(cur)
            cur = tok
        else:
            cur += tok
    out.append(cur)
    return [shlex.quote(p) for p in out] if len(out) > 1 else [word]


def command_lines(words: list[str], indent: str = "  ", width: int | None = None) -> list[str]:
    """Shell words (already quoted) as lines that paste and run: broken between words with ` \\`, later lines
    indented; a word longer than a line is split into quoted pieces that continue at column 0 (an indent
    there would end the word)."""
    width = width or columns()
    lines, cur = [], ""
    for word in words:
        fits_alone = len(indent) + len(word) + 2 <= width
        # A word that cannot be split (a long path) starts its own line rather than overrun this one.
        if cur.strip() and len(cur) + 1 + len(word) + 2 > width and (
                fits_alone or len(_pieces(word, width - len(cur) - 2, width - 2)) == 1):
            lines.append(cur + " \\")
            cur = indent
        cur = cur + " " if cur.strip() else cur
        pieces = [word] if len(cur) + len(word) + 2 <= width else _pieces(word, width - len(cur) - 1, width - 2)
        cur += pieces[0]
        for piece in pieces[1:]:
            lines.append(cur + "\\")
            cur = piece
    lines.append(cur)
    return lines


def _words(line: str) -> list[str]:
    """The line split at unquoted blanks, each word as written (quotes, `$VAR`, `&&` kept)."""
    words, cur, quote, escaped = [], "", "", False
    for ch in line:
        if escaped:
            cur, escaped = cur + ch, False
        elif ch == "\\" and quote != "'":
            cur, escaped = cur + ch, True
        elif quote:
            cur, quote = cur + ch, "" if ch == quote else quote
        elif ch in "'\"":
            cur, quote = cur + ch, ch
        elif ch in " \t":
            if cur:
                words.append(cur)
            cur = ""
        else:
            cur += ch
    return words + [cur] if cur else words


# The first word of a printed command (as `up --dry-run` and `plan` print them); a path or an assignment also
# starts one. Anything else is prose.
COMMAND_WORDS = frozenset({"docker", "podman", "rocm-dspark", "systemctl", "sudo", "vllm", "amd-smi", "rocminfo",
                           "kubectl", "install", "skopeo", "cat", "command", "python", "python3", "bash"})


def is_command(line: str) -> bool:
    try:
        words = shlex.split(line)
    except ValueError:
        return False
    return bool(words) and ("/" in words[0] or words[0] in COMMAND_WORDS
                            or re.match(r"[A-Za-z_][A-Za-z0-9_]*=", words[0]) is not None)


def fit(line: str, indent: str = "", width: int | None = None) -> list[str]:
    """One printed line within the width, each continuation under `indent`: a shell command broken with
    ` \\` (command_lines), a `# ` comment wrapped as comments, prose wrapped with a hanging indent."""
    width = width or columns()
    if len(indent) + len(line) <= width:
        return [indent + line]
    if is_command(line):
        words = _words(line)
        return [indent + ln if i == 0 or ln.startswith(" ") else ln
                for i, ln in enumerate(command_lines(words, "  ", width - len(indent)))]
    if line.startswith("# "):
        return wrap(line[2:], indent + "# ", indent + "#   ", width)
    lead = line[:len(line) - len(line.lstrip(" "))]
    return wrap(line, indent + lead, indent + lead + "  ", width)


def fit_all(lines, indent: str = "", width: int | None = None) -> list[str]:
    """fit() for each line, except a quoted piece of the word above (the line before ends in `'\\`), which
    must stay at column 0 whatever indent the caller gave it."""
    out: list[str] = []
    for line in lines:
        if out and out[-1].endswith("'\\"):
            out.append(line.lstrip(" "))
        else:
            out += fit(line, indent, width)
    return out


def joined(lines: list[str]) -> str:
    """What bash reads from `lines`: each backslash-newline continuation removed."""
    return "\n".join(lines).replace("\\\n", "")


__all__ = ["columns", "wrap", "command_lines", "fit", "fit_all", "is_command", "joined", "PIPE_WIDTH", "MAX_TABLE"]
