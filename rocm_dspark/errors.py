"""The two error types the CLI turns into one line: bad input (exit 2) and a failing environment (exit 3)."""


class UsageError(Exception):
    """Bad input: the message says what is wrong and how to fix it, in one line."""


def did_you_mean(word: str, names) -> str:
    """ " (did you mean X?)" for the known name(s) closest to a mistyped one (difflib ratio >= 0.8, ties all
    named, case-insensitive), else ""."""
    import difflib  # only on the error path

    by_lower = {n.lower(): n for n in names}
    wanted = str(word).strip().lower()
    scored = sorted(((difflib.SequenceMatcher(None, wanted, n).ratio(), n) for n in by_lower), reverse=True)
    best = [n for r, n in scored if r >= 0.8 and r == scored[0][0]]
    return f" (did you mean {' or '.join(by_lower[n] for n in sorted(best))}?)" if best else ""


class EnvironmentFailure(Exception):
    """The environment failed under us (a server died or stopped answering, a counter reset): the input
    was fine, so this is not a UsageError. The CLI prints it as one line and exits 3."""


# The CLI's exit statuses (docs/cli.md, "Exit statuses"): a check that ran and failed, bad usage, a failing
# environment. 0 is success.
EXIT_FAILED_CHECK = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3


# Warnings the library raises while a command runs, printed by the CLI once the command has succeeded: a
# command that then fails prints its one error line alone (docs/cli.md, "Bad input"), never a warning before it.
PENDING_WARNINGS: list[str] = []


def warn(message: str) -> None:
    """Queue `message` (without the "rocm-dspark: warning: " prefix) for the CLI to print on success."""
    if message not in PENDING_WARNINGS:
        PENDING_WARNINGS.append(message)
