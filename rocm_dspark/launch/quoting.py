"""Quote values for the languages the launchers are written in: bash and systemd unit files.

Every value that `launchers.py` puts into a generated file goes through one of these functions, so a
model path, served name or env value with spaces, quotes, `$(...)`, backticks, newlines, `%` or non-ASCII
reaches vLLM literally. Anything a target language cannot carry at all (NUL anywhere; control characters in
a systemd path) is refused with a UsageError instead of being mangled.
"""

from __future__ import annotations

import re

from rocm_dspark.errors import UsageError

# Words bash never splits or expands; everything else is quoted. No ',' and no leading '=': bash takes them
# literally, but shellcheck flags them inside an array (SC2054, SC2191), and the launcher must pass shellcheck.
_BASH_SAFE = re.compile(r"[A-Za-z0-9_@%+:./-][A-Za-z0-9_@%+=:./-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# systemd's strict user/group name rule (valid_user_group_name without VALID_USER_RELAX): the names it
# accepts without a warning. Relaxed names ("a b", "-x", "a.b") load with a warning; ":" "/" and control
# characters are refused outright. We accept only the strict set, so no unit ever loads with a warning.
_UNIT_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,30}")
# Inside bash's $'...' (bash_word): the characters with a short escape.
_ANSI_C_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t"}


def _is_control(ch: str) -> bool:
    return ord(ch) < 0x20 or ord(ch) == 0x7F


def _refuse_nul(value: str, what: str) -> None:
    if "\0" in value:
        raise UsageError(f"{what} contains a NUL byte, which no program argument or env value can carry; remove it")


def bash_word(value: str, what: str = "value") -> str:
    """One bash word that expands to exactly `value`.

    Plain words stay bare; others are single-quoted (nothing inside '...' is special); values with control
    characters (newline, tab, ESC...) use $'...' so the script stays one readable line per value.
    """
    _refuse_nul(value, what)
    if value and _BASH_SAFE.fullmatch(value):
        return value
    if not any(_is_control(ch) for ch in value):
        return "'" + value.replace("'", "'\\''") + "'"
    # a short escape, else \xHH for a control character (bash reads at most two hex digits: a following digit is safe)
    escaped = (_ANSI_C_ESCAPES.get(ch) or (f"\\x{ord(ch):02x}" if _is_control(ch) else ch) for ch in value)
    return "$'" + "".join(escaped) + "'"


def bash_comment(text: str) -> str:
    """Text safe inside a `# ...` comment: a newline would end the comment and start a command."""
    return "".join(" " if _is_control(ch) else ch for ch in text)


def env_name(name: str) -> str:
    """An environment variable name bash can export and systemd can pass; refused otherwise."""
    if not _ENV_NAME.fullmatch(name):
        raise UsageError(
            f"env name {name!r} is not a valid variable name: use letters, digits and '_', not starting with a digit"
        )
    return name


def systemd_specifiers(text: str) -> str:
    """Escape `%` so systemd does not expand specifiers such as %n or %h (systemd.unit(5), "Specifiers")."""
    return text.replace("%", "%%")


def systemd_text(text: str) -> str:
    """Free text for Description=: one line, no specifiers, no trailing backslash (it would join the next line)."""
    one_line = "".join(" " if _is_control(ch) else ch for ch in text)
    return systemd_specifiers(one_line).strip().rstrip("\\").strip()


def systemd_path(path: str, what: str) -> str:
    """An absolute path for settings that take the rest of the line (EnvironmentFile=, WorkingDirectory=)."""
    _refuse_nul(path, what)
    if not path.startswith("/"):
        raise UsageError(f"{what} {path!r} must be an absolute path for a systemd unit")
    if any(_is_control(ch) for ch in path) or path != path.strip():
        raise UsageError(
            f"{what} {path!r} has control characters or edge spaces, which a systemd unit cannot carry; choose another path"
        )
    if "\\" in path:
        # A trailing backslash continues the line (systemd.syntax(7)): the next setting, User=, would be eaten
        # and the service would run as root. systemd has no escape for it in a path, so it is refused anywhere.
        raise UsageError(
            f"{what} {path!r} contains a backslash, which a systemd unit line cannot carry safely; choose another path"
        )
    return systemd_specifiers(path)


def systemd_executable(path: str, what: str = "launcher path") -> str:
    """The program word of ExecStart=, double-quoted so spaces survive.

    systemd refuses executable names containing quotes, backslashes or control characters ("Executable name
    contains special characters", systemd 252), and does no $VAR expansion on the program word, so only
    `%` needs escaping here.
    """
    bad = sorted({ch for ch in path if ch in "'\"\\"})
    if bad:
        raise UsageError(
            f"{what} {path!r} contains {' '.join(bad)}, which systemd refuses in an ExecStart program path; choose another --output"
        )
    systemd_path(path, what)
    return '"' + systemd_specifiers(path) + '"'


def systemd_arg(word: str, what: str) -> str:
    """One argument of ExecStart=: systemd splits the line on whitespace, reads quotes and C escapes inside them,
    and expands $VAR and %-specifiers anywhere (systemd.service(5), "Command lines"; "$$" and "%%" are literal).
    Plain words stay bare; others are double-quoted with those characters escaped. Control characters are refused:
    a newline would end the line."""
    _refuse_nul(word, what)
    if any(_is_control(ch) for ch in word):
        raise UsageError(f"{what} {word!r} has control characters, which a systemd unit cannot carry; choose another")
    if word and _BASH_SAFE.fullmatch(word) and "%" not in word:
        return word
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%")
    return f'"{escaped}"'


def systemd_exec_start(words: list[str]) -> str:
    """ExecStart= for `python -m rocm_dspark ... --state-dir DIR` (the readiness and canary units, aux_units.py)."""
    systemd_path(words[-1], "--state-dir")  # absolute, one line, no backslash
    return " ".join([systemd_executable(words[0], "python"), *(systemd_arg(w, "argument") for w in words[1:])])


def unit_user(name: str) -> str:
    """A User= value systemd accepts without warning; root and numeric ids are refused (the service wants its own user)."""
    if not _UNIT_USER.fullmatch(name):
        raise UsageError(
            f"user name {name!r} is not one systemd accepts strictly: use letters, digits, '_' or '-', "
            "start with a letter or '_', at most 31 characters"
        )
    if name == "root":
        raise UsageError("--user root: run vLLM as a dedicated unprivileged user (e.g. --user vllm)")
    return name
