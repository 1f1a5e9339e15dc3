"""argparse with the package's one-line usage errors (exit status 2), for ``tfmp`` and the
programs the image runs (the GPU banner)."""
from __future__ import annotations

import argparse
import sys

from app.core.exit_codes import EXIT_USAGE


# What argparse's own type errors allow, in the words of the package's other lines.
_ALLOWED = (("invalid int value", "an integer"), ("invalid float value", "a number"),
            ("expected one argument", "a value after the flag (one that starts with '-' "
                                      "goes as --flag=VALUE)"),
            (": is empty", "a value, or leave the flag out for its default"))


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage block on a bad flag; we print one line, exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        allowed = next((f"; allowed: {what}" for said, what in _ALLOWED if said in message), "")
        sys.stderr.write(f"error: {message}{allowed}; see: {self.prog} --help\n")
        raise SystemExit(EXIT_USAGE)
