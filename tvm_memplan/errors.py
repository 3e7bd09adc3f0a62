"""Errors that the CLI reports as one line and exit code 2 instead of a traceback."""


class UserError(Exception):
    """Bad input from the user: a missing file, malformed model, unsupported operator, bad option."""
