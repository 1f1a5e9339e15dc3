"""Child processes of this package that run this very package.

``python -m app`` imports the first ``app`` on ``sys.path``, and ``-m`` puts the current
folder first: a user's own ``app.py`` or ``app/`` there would run instead of ours.  So a
child is started with ``-c`` and a two-line boot that replaces that first ``sys.path``
entry with the folder holding this package, then runs the module as ``-m`` would.  The
user's ``MODULE:FUNCTION`` specs still import from the current folder: ``app.task.user_code`` adds
it when it loads them (after this package is imported).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_BOOT = ("import runpy, sys; sys.path[0] = {root!r}; "
         "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


def module_command(module: str, *args: str) -> List[str]:
    """The command that runs ``python -m <module> <args>`` with this package's ``app``."""
    return [sys.executable, "-c", _BOOT.format(root=PACKAGE_ROOT), module, *args]


@contextlib.contextmanager
def sigterm_as_exit():
    """SIGTERM (``docker stop``, a scheduler's kill) unwinds like Ctrl-C in a parent that
    runs children, so the running child is stopped instead of being left as an orphan."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def child_env(base: Optional[Mapping[str, str]] = None,
              without: Sequence[str] = ()) -> Dict[str, str]:
    """The environment of such a child: this package first on PYTHONPATH (for the processes
    the child starts in turn), unbuffered output, TensorFlow's C++ start-up chatter off.
    ``without``: training settings (``app.core.settings`` names) whose ``TFMP_`` variables the
    child must not inherit, because they would make it run something other than asked."""
    from app.core.settings import BY_NAME

    env = dict(os.environ if base is None else base)
    for name in without:
        env.pop(BY_NAME[name].env, None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = PACKAGE_ROOT + (os.pathsep + env["PYTHONPATH"]
                                        if env.get("PYTHONPATH") else "")
    return env


def log_tail(path: str, n: int) -> str:
    """The last ``n`` non-blank lines of a child's log, joined on one line ("" if unreadable):
    what the parent says when a child failed without a result of its own."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = [ln.strip() for ln in fh.read().splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def log_traceback(path: str) -> str:
    """The last Python traceback in a child's log, as it was printed, up to the child's
    ``error:`` line ("" if there is none): a user's code that raised in a child is shown as
    it would be in the parent, which then gives the line."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return ""
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return ""
    lines = text[start:].splitlines()
    # The child's own one-line summary after it is the parent's to give.
    end = next((i for i, ln in enumerate(lines) if ln.startswith("error: ")), len(lines))
    return "\n".join(lines[:end]).rstrip() + "\n"


class ChildFailed(Exception):
    """A child of this package did not give what it was asked for; the message says why."""


def environment_report(timeout: float = 300.0) -> Dict[str, Any]:
    """``tfmp env --json`` in a child, so the caller (the benchmark's and the tuner's parent
    processes) keeps TensorFlow out of its own memory; ``ChildFailed`` says why not."""
    try:
        proc = subprocess.run(module_command("app", "env", "--json"), capture_output=True,
                              text=True, timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired:
        raise ChildFailed("`tfmp env --json` timed out") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise ChildFailed(f"`tfmp env --json` failed: {last}")
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise ChildFailed("`tfmp env --json` printed no JSON") from None
