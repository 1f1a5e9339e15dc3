"""Errors the command line turns into one line and exit status 2."""
from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: printed as ``error: <what>; allowed: <allowed>``.

    Raised anywhere (config, data, resume checks); ``app.cli.main`` catches it, prints one
    line on stderr and returns 2.  No traceback: the user gave us something wrong, the
    program is fine.
    """

    def __init__(self, what: str, allowed: str | None = None):
        self.what = what
        self.allowed = allowed
        super().__init__(self.line())

    def line(self) -> str:
        if self.allowed:
            return f"error: {self.what}; allowed: {self.allowed}"
        return f"error: {self.what}"


class TrainingDiverged(Exception):
    """The loss went non-finite and loss scaling could not recover it (exit status 3)."""


class TrainingInterrupted(Exception):
    """SIGTERM/SIGINT arrived; a checkpoint was saved (exit status 143 / 130)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by signal {signum}")
