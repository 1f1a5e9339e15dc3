import os
import signal

from app.cli import main
from app.core.exit_codes import EXIT_SIGINT

code = main()
# The status is decided.  A Ctrl-C while the interpreter tears down (TensorFlow's teardown
# takes a moment) ends the process at once with Ctrl-C's status, as a second Ctrl-C does
# while a command runs; Python's own handler made it a KeyboardInterrupt and a death by
# SIGINT (-2) after a run had saved and announced its checkpoint.
signal.signal(signal.SIGINT, lambda signum, frame: os._exit(EXIT_SIGINT))
raise SystemExit(code)
