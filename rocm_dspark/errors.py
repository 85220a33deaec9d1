"""One exception type for every problem a user can fix; the CLI prints it as one line and exits 2."""


class UsageError(Exception):
    """Bad input: the message says what is wrong and how to fix it, in one line."""
