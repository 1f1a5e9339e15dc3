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
    parser.commands = {}
    for name in COMMANDS:
        module = importlib.import_module(f"app.commands.{name}")
        sp = module.add_parser(sub)
        sp.set_defaults(_run=module.run)
        parser.commands[sp.prog.split()[-1]] = sp
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Quiet TensorFlow's C++ start-up chatter unless the user asked for it; must be set
    # before TensorFlow is imported (the commands import it lazily).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:   # named with the command's own help, which lists its flags
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args._run(args))
    except ReportedError as exc:
        return report(exc)
