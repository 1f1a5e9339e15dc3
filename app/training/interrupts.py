"""SIGTERM/SIGINT during training: finish the running step, save a checkpoint, stop.

From the command line a second SIGTERM/SIGINT stops the process at once, without that
checkpoint (the newest one saved is kept and ``--resume`` continues from it): the way out
of a step that never ends, as ``docker compose`` and most servers treat a second Ctrl-C.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
from typing import Callable, Optional

from app.core.errors import TrainingInterrupted
from app.core.signals import STOPPING, SecondSignalExits, say


def first_signal_line(signum: int, repeat_exits: bool) -> str:
    line = f"received signal {signum}: saving a checkpoint and stopping after this step"
    if repeat_exits:
        line += " (send it again to stop at once, without that checkpoint)"
    return line


class StopFlag:
    """SIGTERM/SIGINT set a flag and ``model.stop_training``: Keras' fit ends the epoch
    after the running batch (it checks that attribute after every batch, no callback of
    ours runs per step), and the next hook (``on_test_begin``/``on_epoch_end``) raises
    ``TrainingInterrupted``; the custom loop checks the flag after every step."""

    def __init__(self):
        self.signum: int | None = None
        self.model = None          # set once built: the model whose fit to stop
        self.repeat_exits = False  # a second signal ends the process (app.core.signals)
        self.output: str | None = None   # the run folder, to name the checkpoint left
        # The recorder's, once metrics.json exists: its status when a second signal ends the
        # process at once, ``(signum, the checkpoint --resume continues from or None)``.
        self.on_stop_at_once: Optional[Callable[[int, Optional[str]], None]] = None
        self._announced = False
        self._announcing = threading.Lock()

    def announce(self, signum: int, write=None) -> None:
        """The first signal's line, once, whichever sees it first: this handler or the
        watch thread (``write``: its way to stderr)."""
        with self._announcing:
            if self._announced:
                return
            self._announced = True
        line = "\n" + first_signal_line(signum, self.repeat_exits)
        if write is None:
            print(line, file=sys.stderr, flush=True)
        else:
            write(line)

    def __call__(self, signum, frame):
        self.announce(signum)
        self.signum = signum
        if self.model is not None:
            self.model.stop_training = True

    def check(self):
        if self.signum is not None:
            raise TrainingInterrupted(self.signum)

    def stopping_at_once(self, signum: int) -> None:
        """The second signal's record (the watch thread, before the process ends)."""
        if self.on_stop_at_once is not None:
            self.on_stop_at_once(signum, newest_checkpoint(self.output))


def resume_advice(output: str, output_given: bool, command_line: bool) -> str:
    """How to continue an interrupted run, in the words of what started it: ``tfmp train``
    takes ``--resume``, ``app.train`` (a notebook, a script) the keyword ``resume=True``.
    A run folder the user did not name (its time is in it) is named: ``--resume`` without
    ``--output`` has no run to continue."""
    if command_line:
        folder = "" if output_given else f" --output {shlex.quote(output)}"
        return f"run the same command with --resume{folder} to finish"
    folder = "" if output_given else f", output={output!r}"
    return f"call app.train again with the same arguments and resume=True{folder} to finish"


def stopped_before_start(config, command_line: bool) -> dict:
    """The result of a run a Ctrl-C (a notebook's Interrupt) stopped while it was being
    prepared (its checks, the data loading), before its signal handlers were set: the shape
    of an interrupted run's metrics, with no epochs, and one line saying so, where a
    KeyboardInterrupt went up through the package and TensorFlow (a 13-frame traceback in a
    notebook).  Nothing of the run was written then: no metrics.json, no folder made, an
    existing one as it was (``config``: the run's TrainConfig; None before it was made)."""
    folder = ("" if config is None else f" ({config.output} is as it was)" if config.output
              else " (no run folder was made)")
    again = "run the same command again" if command_line else "call app.train again"
    goal = "continue" if config is not None and config.resume else "start"
    line = (f"interrupted (signal {signal.SIGINT.value}) before training started, while the "
            f"run was being prepared: nothing was written{folder}; {again} to {goal} it")
    print(f"\n{line}", file=sys.stderr, flush=True)
    return {"status": "interrupted", "signal": signal.SIGINT.value,
            "config": None if config is None else config.to_dict(), "epochs": [],
            "steps": [], "model_path": None, "diagnosis": line}


def newest_checkpoint(output: str | None) -> str | None:
    """The checkpoint --resume would continue from (the newest complete one), or None."""
    if not output:
        return None
    from app.run_folder.checkpoints import CHECKPOINT_DIR, newest_complete

    return newest_complete(os.path.join(output, CHECKPOINT_DIR))


def forced_stop_line(signum: int, output: str | None) -> str:
    """What the second signal's stop leaves: the newest complete checkpoint, or none."""
    newest = newest_checkpoint(output)
    left = (f"--resume continues from {newest}" if newest else
            "no checkpoint had been saved, so a rerun starts from the beginning")
    return f"received signal {signum} again: stopping now, without saving; {left}"


@contextlib.contextmanager
def signal_handlers(flag: StopFlag, repeat_exits: bool = False):
    """``flag`` handles SIGTERM and SIGINT while the block runs (main thread only: Python
    delivers signals there; a run in another thread keeps the process' handlers).

    ``repeat_exits``: a second signal ends the process at once (the command line's
    ``tfmp train``; never a notebook's kernel, whose user interrupts a cell, not the
    process, and would lose every variable)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    flag.repeat_exits = repeat_exits
    old = {s: signal.signal(s, flag) for s in STOPPING}
    try:
        watch = (SecondSignalExits(lambda signum: forced_stop_line(signum, flag.output),
                                   on_first=lambda signum: flag.announce(signum, write=say),
                                   before_exit=flag.stopping_at_once)
                 if repeat_exits else contextlib.nullcontext())
        with watch:
            yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
