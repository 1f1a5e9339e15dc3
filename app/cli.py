"""``tfmp``: registers the subcommands and turns bad input into exit status 2."""
from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
from typing import NoReturn, Sequence

from app import __version__
from app.commands import COMMANDS
from app.core import shadowing, variables
from app.core.args import OneLineParser
from app.core.errors import ReportedError, report
from app.core.exit_codes import EXIT_SIGINT, EXIT_SIGPIPE
from app.core.signals import SecondSignalExits, interrupts_outside_tensorflow


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="tfmp",
                           description="Mixed-precision TensorFlow training.")
    # app.__version__, not the installed distribution's metadata: the image runs the package
    # from /opt/tfmp/src without installing it (tests check it is pyproject.toml's).
    parser.add_argument("--version", action="version", version=f"tfmp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    parser.commands = {}
    for name in COMMANDS:
        module = importlib.import_module(f"app.commands.{name}")
        sp = module.add_parser(sub)
        sp.set_defaults(_run=module.run)
        parser.commands[sp.prog.split()[-1]] = sp
    return parser


def program() -> NoReturn:
    """The process's entry point: ``tfmp`` (pip's script and the image's) and ``python -m app``.

    Once the status is decided, a Ctrl-C changes nothing: it is ignored while the
    interpreter and TensorFlow tear down (a moment), and the process ends with that status.
    Python's own handler made it a KeyboardInterrupt, and a handler of ours is no better:
    the interpreter's finalization resets every Python-level handler to the default, and a
    Ctrl-C after that (TensorFlow's teardown) killed the process by SIGINT (-2) after a run
    had saved and announced its checkpoint.  An ignored signal is left ignored.  Not in
    main(): tests and notebooks call that in their own process, whose Ctrl-C is theirs."""
    status = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise SystemExit(status)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """stdout's reader stopped reading (``tfmp notebooks | head -1``): end quietly, as
    coreutils do, with a shell's status for a process SIGPIPE ended (Python ignores SIGPIPE,
    so the write raised instead).  stdout goes to /dev/null first: Python flushes it once
    more at exit, and that would print "Exception ignored ... BrokenPipeError"."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    # Quiet TensorFlow's C++ start-up chatter unless the user asked for it; must be set
    # before TensorFlow is imported (the commands import it lazily).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _whole_lines()
    parser = build_parser()
    _command_first(parser, sys.argv[1:] if argv is None else list(argv))
    args, unknown = parser.parse_known_args(argv)
    if unknown:   # named with the command's own help, which lists its flags
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        with _second_signal_exits(), interrupts_outside_tensorflow():
            shadowing.refuse_namesakes(shadowing.user_folder())
            variables.warn_of_misspellings()   # a misspelled setting trained the default
            status = int(args._run(args))
            sys.stdout.flush()   # the last output out here, where main sees a closed pipe
            return status
    except ReportedError as exc:
        return report(exc)
    except KeyboardInterrupt:
        # Ctrl-C, answered once the running step returned: one line, not a traceback.
        sys.stderr.write(f"\ninterrupted (Ctrl-C): tfmp {args.command} stopped\n")
        return EXIT_SIGINT


def _whole_lines() -> None:
    """Each line out in one write.  Unbuffered, as the image runs Python
    (PYTHONUNBUFFERED=1), ``print`` writes a line's text and its newline apart, and where
    stdout and stderr meet (``docker run ... 2>&1``, a job's log) a line of the other stream
    lands between them: "precision: ...strategy: ...".  Line-buffered, a line goes whole.
    Progress bars flush their partial lines themselves."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):   # a test's or a notebook's stand-in may not
            stream.reconfigure(line_buffering=True, write_through=False)


def _second_signal_exits():
    """A second Ctrl-C (or SIGTERM where a command handles it) ends any command at once:
    the way out of a step that never returns, where Python cannot raise the first one's
    KeyboardInterrupt (app/core/signals.py).  ``tfmp train`` says more while it trains."""
    if threading.current_thread() is not threading.main_thread():
        return contextlib.nullcontext()
    return SecondSignalExits(lambda signum: f"received signal {signum} again: stopping now")


def _command_first(parser: OneLineParser, argv: list) -> None:
    """A flag before the command (``tfmp --epochs 3 train``) is named as such: argparse
    would take the flag's value for the command and say "invalid choice: '3'"."""
    for arg in argv:
        if not arg.startswith("-"):
            return
        if arg not in ("-h", "--help", "--version"):
            parser.error(f"{arg.split('=')[0]} comes before the command; allowed: "
                         f"tfmp COMMAND [FLAGS], the command one of {', '.join(parser.commands)}")
