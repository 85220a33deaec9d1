"""The two error types the CLI turns into one line: bad input (exit 2) and a failing environment (exit 3)."""


class UsageError(Exception):
    """Bad input: the message says what is wrong and how to fix it, in one line."""


class EnvironmentFailure(Exception):
    """The environment failed under us (a server died or stopped answering, a counter reset): the input
    was fine, so this is not a UsageError. The CLI prints it as one line and exits 3."""


# The CLI's exit statuses (documented in the README): a check that ran and failed, bad usage, a failing
# environment. 0 is success.
EXIT_FAILED_CHECK = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
