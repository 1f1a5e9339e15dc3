"""SIGTERM/SIGINT during training: finish the running step, save a checkpoint, stop."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

from app.core.errors import TrainingInterrupted


class StopFlag:
    """SIGTERM/SIGINT set a flag and ``model.stop_training``: Keras' fit ends the epoch
    after the running batch (it checks that attribute after every batch, no callback of
    ours runs per step), and the next hook (``on_test_begin``/``on_epoch_end``) raises
    ``TrainingInterrupted``; the custom loop checks the flag after every step."""

    def __init__(self):
        self.signum: int | None = None
        self.model = None          # set once built: the model whose fit to stop

    def __call__(self, signum, frame):
        if self.signum is None:
            print(f"\nreceived signal {signum}: saving a checkpoint and stopping after this step",
                  file=sys.stderr, flush=True)
        self.signum = signum
        if self.model is not None:
            self.model.stop_training = True

    def check(self):
        if self.signum is not None:
            raise TrainingInterrupted(self.signum)


@contextlib.contextmanager
def signal_handlers(flag: StopFlag):
    """``flag`` handles SIGTERM and SIGINT while the block runs (main thread only: Python
    delivers signals there; a run in another thread keeps the process' handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, flag) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
