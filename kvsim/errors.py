"""Exceptions the CLI turns into one red line and exit code 2, and the interrupt it turns into
one line and exit code 128 + the signal."""


class KvsimError(Exception):
    """Base class for user-facing errors (bad input, bad options)."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived (raised by the CLI's signal handler). A BaseException, like
    KeyboardInterrupt, so that only cleanup code (``finally``, ``except BaseException``) sees
    it on its way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
