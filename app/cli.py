"""``tfmp``: registers the subcommands and turns bad input into exit status 2."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from app.commands import COMMANDS
from app.core.errors import MixedPrecisionClash, UsageError, UserCodeError
from app.core.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_OUTPUT_FAULT, EXIT_USAGE  # noqa: F401
from app.run_folder.write_faults import OutputFault


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage block on a bad flag; we print one line, exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        sys.stderr.write(f"error: {message}; see: {self.prog} --help\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="tfmp",
                            description="Mixed-precision TensorFlow training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_OneLineParser)
    sub.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"app.commands.{name}")
        sp = module.add_parser(sub)
        sp.set_defaults(_run=module.run)
    return parser


# The errors a command turns into one line on stderr, and the exit status of each.
REPORTED = ((UsageError, EXIT_USAGE), (UserCodeError, EXIT_FAILED),
            (MixedPrecisionClash, EXIT_FAILED),
            # Disk full, read-only, quota: the last good checkpoint is intact.
            (OutputFault, EXIT_OUTPUT_FAULT))


def report(exc: Exception) -> int:
    """Say what went wrong in one line (after the user's own traceback when it is their
    code that raised: it names their line); return the exit status."""
    if isinstance(exc, UserCodeError):
        import traceback

        traceback.print_exception(type(exc.original), exc.original, exc.original.__traceback__)
    sys.stderr.write(exc.line() + "\n")
    return next(status for kind, status in REPORTED if isinstance(exc, kind))


def main(argv: Sequence[str] | None = None) -> int:
    # Quiet TensorFlow's C++ start-up chatter unless the user asked for it; must be set
    # before TensorFlow is imported (the commands import it lazily).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args))
    except tuple(kind for kind, _ in REPORTED) as exc:
        return report(exc)
