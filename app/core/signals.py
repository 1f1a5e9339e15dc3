"""A second SIGTERM/SIGINT ends the process at once, also while the main thread is stuck.

Python runs a signal's handler (and raises ``KeyboardInterrupt`` for Ctrl-C) on the main
thread between two bytecodes, so while that thread waits inside a TensorFlow op that never
returns (a kernel deadlocked at a barrier, a collective whose peer is gone) nothing Python
does on a signal happens.  CPython's C-level handler does run at once, and writes the
signal's number to the file descriptor given to ``signal.set_wakeup_fd``: a thread reading
that descriptor sees every signal the moment it arrives, and on the second ends the process
with ``os._exit`` (status 128 + the signal), as a ``kill -9`` would, after what the command
asked to record first (``before_exit``: a run's status in metrics.json, given two seconds at
most) and one line saying what is left.  Docker Compose and most servers treat a second Ctrl-C the same way.

Only signals with a Python-level handler reach the descriptor (Ctrl-C's default handler is
one; SIGTERM's default, which ends the process anyway, is not).  Watches nest: an inner one
takes the descriptor for its block and gives it back.

Ctrl-C's KeyboardInterrupt must not be raised inside Python code that TensorFlow's C++
called (``tf.py_function``, ``tf.numpy_function``, a model's layer or loss that uses them):
TF 2.9 then aborts the whole process (``py_func.cc: Check failed: ctx != nullptr``), a newer
TensorFlow turns it into an error of the user's code.  ``interrupts_outside_tensorflow``
holds such a Ctrl-C until the step that ran that code returns, where ``interrupt_point``
(called between steps) or the block's end raises it.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from typing import Callable, Optional

STOPPING = (signal.SIGTERM, signal.SIGINT)

# How long after a first signal the process may still be running, unanswered, before the
# plain watch says how to stop it at once: a command that stops in time says nothing more.
HINT_AFTER_SECONDS = 2.0
# The most the second signal's last record (``before_exit``) may delay the exit: it runs
# beside a main thread that may be stuck, and may meet a hung disk.
BEFORE_EXIT_SECONDS = 2.0


def say(line: str) -> None:
    """One line to stderr from a watch thread: straight to the descriptor, so that Python's
    buffered stream, which the stuck main thread may hold, cannot hold it up."""
    os.write(2, (line + "\n").encode())


class SecondSignalExits:
    """While the block runs, a second SIGTERM/SIGINT ends the process at once.

    ``on_first(signum)``: called (on the watch's thread) when the first one arrives; None
    says, if the process is still running ``HINT_AFTER_SECONDS`` later, that a second one
    stops it at once.  ``last_words(signum)``: the line said before the process ends.
    ``before_exit(signum)``: what to record first (a run's status), given at most
    ``BEFORE_EXIT_SECONDS``; it must not wait on the main thread or on TensorFlow."""

    def __init__(self, last_words: Callable[[int], str],
                 on_first: Optional[Callable[[int], None]] = None,
                 before_exit: Optional[Callable[[int], None]] = None):
        self.last_words = last_words
        self.on_first = on_first
        self.before_exit = before_exit
        self.read_end, self.write_end = socket.socketpair()
        self.write_end.setblocking(False)
        self.thread = threading.Thread(target=self._watch, name="tfmp-signal-watch", daemon=True)
        self.previous_fd = -1

    def __enter__(self):
        self.previous_fd = signal.set_wakeup_fd(self.write_end.fileno(), warn_on_full_buffer=False)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        signal.set_wakeup_fd(self.previous_fd)
        self.write_end.close()       # the watch reads end-of-file and ends
        self.thread.join(timeout=5)
        self.read_end.close()

    def _watch(self):
        first = None
        while True:
            try:
                data = self.read_end.recv(64)
            except socket.timeout:   # the first signal went unanswered for a while
                self.read_end.settimeout(None)
                say(f"received signal {first}: stopping (send it again to stop at once)")
                continue
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum not in STOPPING:
                    continue
                if first is not None:
                    self._record_before_exit(signum)
                    say(self.last_words(signum))
                    os._exit(128 + signum)
                first = signum
                if self.on_first is not None:
                    self.on_first(signum)
                else:
                    self.read_end.settimeout(HINT_AFTER_SECONDS)

    def _record_before_exit(self, signum: int) -> None:
        """``before_exit`` on a thread of its own, waited for a bounded time: a write that
        hangs (a dead network mount) must not keep the process from ending."""
        if self.before_exit is None:
            return

        def record():
            try:
                self.before_exit(signum)
            except Exception as exc:   # best effort: the process ends either way
                say(f"note: could not record the stop: {type(exc).__name__}: {exc}")

        writer = threading.Thread(target=record, name="tfmp-last-record", daemon=True)
        writer.start()
        writer.join(BEFORE_EXIT_SECONDS)


# Where TensorFlow's C++ calls back into Python on the thread that runs the op (eager
# ``tf.py_function``/``tf.numpy_function`` and their graph forms): tensorflow/python/ops/.
_TENSORFLOW_CALLBACKS = os.path.join("tensorflow", "python", "ops", "script_ops.py")
_held: list = []   # the Ctrl-C held while TensorFlow ran the model's Python code


def _inside_tensorflow_callback(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.endswith(_TENSORFLOW_CALLBACKS):
            return True
        frame = frame.f_back
    return False


def _on_ctrl_c(signum, frame):
    if _inside_tensorflow_callback(frame):
        _held.append(signum)   # raised by interrupt_point once the step has returned
        return
    raise KeyboardInterrupt


def interrupt_point() -> None:
    """Raise the KeyboardInterrupt of a Ctrl-C held while TensorFlow ran Python code: call
    it where stopping is safe, between two steps."""
    if _held:
        _held.clear()
        raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_outside_tensorflow():
    """While the block runs, Ctrl-C raises KeyboardInterrupt at once, as Python's default
    handler does, except inside Python code TensorFlow's C++ called: there it is held until
    ``interrupt_point`` or the block's end.  Only on the main thread (where Python runs
    handlers) and only over the default handler: a block that handles SIGINT itself (train's
    stop flag, a notebook kernel's own handler) keeps its way."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    signal.signal(signal.SIGINT, _on_ctrl_c)
    try:
        yield
        interrupt_point()   # held to the end: still answered, not lost
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _held.clear()
