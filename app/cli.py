"""``tfmp``: registers the subcommands and turns bad input into exit status 2."""
from __future__ import annotations

import importlib
import os
import sys
from typing import Sequence

from app.commands import COMMANDS
from app.core import shadowing
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
    _command_first(parser, sys.argv[1:] if argv is None else list(argv))
    args, unknown = parser.parse_known_args(argv)
    if unknown:   # named with the command's own help, which lists its flags
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        shadowing.refuse_namesakes(shadowing.user_folder())
        return int(args._run(args))
    except ReportedError as exc:
        return report(exc)


def _command_first(parser: OneLineParser, argv: list) -> None:
    """A flag before the command (``tfmp --epochs 3 train``) is named as such: argparse
    would take the flag's value for the command and say "invalid choice: '3'"."""
    for arg in argv:
        if not arg.startswith("-"):
            return
        if arg not in ("-h", "--help"):
            parser.error(f"{arg.split('=')[0]} comes before the command; allowed: "
                         f"tfmp COMMAND [FLAGS], the command one of {', '.join(parser.commands)}")
