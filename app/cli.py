"""``tfmp``: registers the subcommands and turns bad input into exit status 2."""
from __future__ import annotations

import importlib
import os
from typing import Sequence

from app.commands import COMMANDS
from app.core.args import OneLineParser
from app.core.errors import ReportedError, report


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="tfmp",
                           description="Mixed-precision TensorFlow training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"app.commands.{name}")
        sp = module.add_parser(sub)
        sp.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Quiet TensorFlow's C++ start-up chatter unless the user asked for it; must be set
    # before TensorFlow is imported (the commands import it lazily).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args))
    except ReportedError as exc:
        return report(exc)
