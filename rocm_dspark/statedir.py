"""Where rocm-dspark keeps state (probe records, launcher state, registry answers): a foundation, so the recipe
path, the probe store and the generated launcher (rocm_dspark/launch/launch_facts.py) read one rule."""

# No __future__ annotations: NamedTuple would compile each string annotation at import (benchmarks/recipe_latency.py).
import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from rocm_dspark.errors import UsageError


class StateRoot(NamedTuple):
    variable: str  # the environment variable
    subdir: str  # appended to its value
    absolute_only: bool  # a relative value is ignored


ENV_VAR = "ROCM_DSPARK_STATE_DIR"

# The first of these that is set. XDG values must be absolute, relative ones are ignored
# (https://specifications.freedesktop.org/basedir-spec/latest/).
STATE_ROOTS = (
    StateRoot(ENV_VAR, "", False),
    StateRoot("XDG_STATE_HOME", "rocm-dspark", True),
    StateRoot("HOME", ".local/state/rocm-dspark", False),
)


def _check(value: str, what: str) -> str:
    """A state path as `what` gives it: UTF-8 and printable (as every argument is), else UsageError."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # os.environ keeps undecodable bytes as surrogates
        raise UsageError(f"{what} {ascii(value)} is not valid UTF-8; rocm-dspark takes UTF-8 paths only") from None
    if not value.isprintable():
        raise UsageError(f"{what} {value!r} holds a control character (a newline, a tab); give a path without")
    return value


def state_root(environ: Mapping[str, str] = os.environ) -> str | None:
    """The state root the environment names (STATE_ROOTS, in order), or None when none is set; UsageError for
    a value that is not UTF-8 or holds a control character, and for a relative $ROCM_DSPARK_STATE_DIR (the
    launcher, started elsewhere by systemd, would read it from another directory)."""
    for root in STATE_ROOTS:
        value = environ.get(root.variable, "")
        if value and root.variable == ENV_VAR and not os.path.isabs(os.path.expanduser(value)):
            raise UsageError(f"${ENV_VAR} {value!r} is a relative path; give an absolute one (or --state-dir)")
        if value and (os.path.isabs(value) or not root.absolute_only):
            _check(value, f"${root.variable}")
            return os.path.join(value, root.subdir) if root.subdir else value
    return None


def _expand(raw, what: str) -> Path:
    try:
        return Path(raw).expanduser()
    except RuntimeError:  # "~nosuchuser/..."
        raise UsageError(f"{what} {str(raw)!r}: no such user's home directory; give an absolute path") from None


def state_dir(explicit=None) -> Path:
    """`--state-dir`, else the first STATE_ROOTS entry that is set, else ~/.local/state/rocm-dspark."""
    if explicit:
        return _expand(_check(str(explicit), "--state-dir"), "--state-dir")
    if root := state_root():  # the rule the generated launcher follows too
        return _expand(root, "the state directory")
    try:
        home = Path.home()
    except RuntimeError:
        raise UsageError(f"no home directory for this user; pass --state-dir or set {ENV_VAR}") from None
    return home / ".local" / "state" / "rocm-dspark"
