"""argparse with the package's one-line usage errors (exit status 2), for ``tfmp`` and the
programs the image runs (the GPU banner)."""
from __future__ import annotations

import argparse
import sys

from app.core.exit_codes import EXIT_USAGE


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage block on a bad flag; we print one line, exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        sys.stderr.write(f"error: {message}; see: {self.prog} --help\n")
        raise SystemExit(EXIT_USAGE)
