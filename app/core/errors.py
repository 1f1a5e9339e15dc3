"""The errors the command line turns into one line and an exit status (app/core/exit_codes.py):
``UsageError`` 2 (``PrecisionUnsupported`` among them), ``UserCodeError`` and
``MixedPrecisionClash`` 1; ``TrainingDiverged`` (3)
and ``TrainingInterrupted`` (130/143) end a run and are recorded in its metrics.json."""
from __future__ import annotations

import sys

from app.core.exit_codes import EXIT_FAILED, EXIT_USAGE


class ReportedError(Exception):
    """An error the command line reports as ``line()`` on stderr, exiting ``exit_status``
    (``report``).  Subclasses anywhere in the package (``OutputFault`` in run_folder) are
    reported the same way without the command line knowing them."""

    exit_status = EXIT_FAILED

    def line(self) -> str:
        return f"error: {self}"

    def _render_traceback_(self) -> list:
        """What IPython (a notebook's kernel, the ``ipython`` shell) shows for this error in
        place of its traceback: the one line the command line prints.  The error is the
        user's input, not a fault of the package, so a traceback through the package's
        internals only buries the line that says what to change.  Plain Python ignores this
        method, and ``str()`` stays the line."""
        return self.line().splitlines()


class UsageError(ReportedError):
    """Bad input from the user: printed as ``error: <what>; allowed: <allowed>``.

    Raised anywhere (config, data, resume checks); ``app.cli.main`` catches it, prints one
    line on stderr and returns 2.  No traceback: the user gave us something wrong, the
    program is fine.
    """

    exit_status = EXIT_USAGE

    def __init__(self, what: str, allowed: str | None = None):
        self.what = what
        self.allowed = allowed
        super().__init__(self.line())

    def line(self) -> str:
        if self.allowed:
            return f"error: {self.what}; allowed: {self.allowed}"
        return f"error: {self.what}"


class PrecisionUnsupported(UsageError):
    """A policy this TensorFlow cannot run here for the model's layer kinds (``app.machine.kernels``):
    one line naming the cause (TensorFlow's version, the CPU, the layer type) and what works,
    exit status 2.  ``check`` reports it as a finding; ``benchmark`` and ``tune`` leave the
    policy out with it and go on with the others."""

    def __init__(self, policy: str, what: str, allowed: str, kinds=()):
        self.policy, self.kinds = policy, tuple(kinds)
        super().__init__(what, allowed)


class TrainingDiverged(Exception):
    """The loss went non-finite and loss scaling could not recover it (exit status 3)."""


class NumericsFault(TrainingDiverged):
    """The numerics sentinel found a fault (``app.numerics.rules.Fault`` in ``fault``); the
    run replays the failing batch and reports where it began (exit status 3)."""

    def __init__(self, fault):
        self.fault = fault
        super().__init__(fault.headline)


class TrainingInterrupted(Exception):
    """SIGTERM/SIGINT arrived; a checkpoint was saved (exit status 143 / 130)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by signal {signum}")


USER_CODE_RAISED = "your code raised"   # how UserCodeError's line begins, after "error: "


class UserCodeError(ReportedError):
    """The user's own code (a ``--model``/``--dataset``/``--loss`` function, or their layer)
    raised.  The original exception is kept with its traceback: it is their bug and they
    need the line.  The command line prints that traceback, then ``line()``, exit status 1."""

    def __init__(self, spec: str, during: str, original: BaseException):
        self.spec, self.during, self.original = spec, during, original
        super().__init__(self.line())

    def _render_traceback_(self) -> list:
        # As report() prints it: the user's own traceback names their line, then ours.
        import traceback

        lines = traceback.format_exception(type(self.original), self.original,
                                           self.original.__traceback__)
        return "".join(lines).splitlines() + self.line().splitlines()

    def line(self) -> str:
        first = (str(self.original).strip().splitlines() or [""])[0][:200]
        return (f"error: {USER_CODE_RAISED} {type(self.original).__name__} while {self.during} "
                f"({self.spec}): {first} (the traceback above points at the line)")


class MixedPrecisionClash(ReportedError):
    """A layer failed under a mixed policy because of a dtype clash (e.g. a float32 constant
    added to a float16 tensor inside ``call``); ``line()`` names the layer and the fix."""

    def __init__(self, diagnosis: str):
        self.diagnosis = diagnosis
        super().__init__(diagnosis)

    def line(self) -> str:
        return f"error: {self.diagnosis}"


def unprefixed(line) -> str:
    """A reported line (``error: ...``) without its prefix, to quote inside another message
    or record as a reason."""
    text = (line or "").strip()
    return text[len("error:"):].strip() if text.startswith("error:") else text


def report(exc: ReportedError) -> int:
    """Say what went wrong in one line (after the user's own traceback when it is their
    code that raised: it names their line); return the exit status."""
    if isinstance(exc, UserCodeError):
        import traceback

        traceback.print_exception(type(exc.original), exc.original, exc.original.__traceback__)
    sys.stderr.write(exc.line() + "\n")
    return exc.exit_status
