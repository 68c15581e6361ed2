"""User-facing errors: the CLI prints their message as one line and exits 1 (2 for usage)."""


class UserError(Exception):
    """A mistake the user can fix (bad path, prompt too long); exit code 1, never a traceback."""

    exit_code = 1


class UsageError(UserError):
    """A bad flag, setting or profile value; exit code 2."""

    exit_code = 2
