"""Exceptions the CLI turns into one red line and exit code 2."""


class KvsimError(Exception):
    """Base class for user-facing errors (bad input, bad options)."""
