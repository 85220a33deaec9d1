"""Line widths of what the commands print: prose wraps to the terminal (COLUMNS; PIPE_WIDTH when
stdout is no terminal) with a hanging indent, shell commands break between words with ` \\` continuations that
still paste and run, and tables stay within MAX_TABLE columns."""

from __future__ import annotations

import os
import re
import shlex
import sys

PIPE_WIDTH = 100  # a pipe, a log, a file: no terminal to ask
MIN_WIDTH = 40  # below this a hanging indent leaves no room for words
MAX_TABLE = 160  # tables are read wide, but not wider than this


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
    widths = [
        max((len(r[i]) for r in rows if i < len(r) - 1), default=0) for i in range(max(map(len, rows), default=0))
    ]
    return [indent + "  ".join([c.ljust(widths[i]) for i, c in enumerate(r[:-1])] + r[-1:]).rstrip() for r in rows]


def wrap(text: str, first: str = "", rest: str | None = None, width: int | None = None) -> list[str]:
    """`text` (line breaks folded; aligned spaces kept) filled to `width` (default: columns()): the first line
    starts with `first`, the others with `rest` (default: a hanging indent, `first`'s width plus two). A word
    longer than a line (a URL, a flag) is kept whole."""
    rest = " " * (len(first) + 2) if rest is None else rest
    return _fill(re.sub(r"\s*[\r\n]\s*", " ", text.strip()), width or columns(), first, rest) or [first.rstrip()]


_BLANKS = str.maketrans("\t\n\x0b\x0c\r", "     ")


def _fill(text: str, width: int, first: str, rest: str) -> list[str]:
    """textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_long_words=False,
    break_on_hyphens=False), line for line (tests/test_textwidth.py compares the two): textwrap compiles its
    word-splitting patterns at import, a cost every `recipe` paid for its one wrapped note."""
    if width <= 0:
        raise ValueError(f"invalid width {width!r} (must be > 0)")
    chunks = [c for c in re.split(r"( +)", text.expandtabs().translate(_BLANKS)) if c]
    chunks.reverse()
    lines: list[str] = []
    while chunks:
        indent = rest if lines else first
        room = width - len(indent)
        if lines and chunks[-1].strip() == "":  # a line starts at a word, not at the blanks before it
            del chunks[-1]
        line: list[str] = []
        used = 0
        while chunks and used + len(chunks[-1]) <= room:
            used += len(chunks[-1])
            line.append(chunks.pop())
        if chunks and len(chunks[-1]) > room and not line:  # a word longer than a line: kept whole, alone
            line.append(chunks.pop())
        if line and line[-1].strip() == "":  # nor ends at the blanks after its last word
            del line[-1]
        if line:
            lines.append(indent + "".join(line))
    return lines


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
        if (
            cur.strip()
            and len(cur) + 1 + len(word) + 2 > width
            and (fits_alone or len(_pieces(word, width - len(cur) - 2, width - 2)) == 1)
        ):
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


def command(words: list[str], indent: str = "", width: int | None = None, continued: bool = False) -> list[str]:
    """A command the caller built (its words already shell-quoted) within the width: the first line at `indent`,
    broken between words with ` \\` (command_lines), continuations two further in. `continued`: the caller
    ends the last line with ` \\` too (one flag per line), so that line keeps room for it."""
    width = width or columns()
    if len(indent) + len(line := " ".join(words)) + (2 if continued else 0) <= width:
        return [indent + line]
    return [
        indent + ln if i == 0 or ln.startswith(" ") else ln
        for i, ln in enumerate(command_lines(list(words), "  ", width - len(indent)))
    ]


def comment(line: str, width: int | None = None) -> list[str]:
    """A `# ` comment line within the width: wrapped, every continuation `#   ` (still a comment)."""
    width = width or columns()
    return [line] if len(line) <= width else wrap(line.removeprefix("# "), "# ", "#   ", width)


def prose(line: str, width: int | None = None) -> list[str]:
    """A line of prose within the width: wrapped under its own leading spaces, with a hanging indent."""
    width = width or columns()
    if len(line) <= width:
        return [line]
    lead = line[: len(line) - len(line.lstrip(" "))]
    return wrap(line, lead, lead + "  ", width)
