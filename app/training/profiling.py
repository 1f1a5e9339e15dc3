"""``--profile-steps A-B``: TensorFlow's profiler around training steps A to B (counted from 1
across epochs), written where the run's TensorBoard logs are (``<run>/tensorboard/plugins/
profile/<time>/``), so TensorBoard's Profile tab lists the run.  Both loops call ``begin`` and
``end`` around each step (``fit``: a callback with batch hooks, added only when profiling;
with --steps-per-execution N one hook covers N steps).  On a GPU without CUPTI's rights the
trace has host events only: the line of ``app.machine.profiler_rights`` says so before it
starts.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

import tensorflow as tf

from app.core.settings import parse_step_range


class StepProfiler:
    def __init__(self, logdir: str, steps: str, has_gpu: bool = False):
        self.logdir = logdir
        self.first, self.last = parse_step_range(steps)
        self.has_gpu = has_gpu
        self.active = self.done = False
        # The custom loop marks each step for the Profile tab's step-time views; Keras' fit
        # marks its own (a "train" trace per step).
        self.mark_steps = True
        self.trace: Optional[tf.profiler.experimental.Trace] = None

    def begin(self, step: int) -> None:
        """Before training step ``step`` (from 1)."""
        if self.done:
            return
        if not self.active and step >= self.first:
            from app.machine import profiler_rights

            line = profiler_rights.check(self.has_gpu)
            if line:
                print(line, file=sys.stderr, flush=True)
            os.makedirs(self.logdir, exist_ok=True)
            tf.profiler.experimental.start(self.logdir)
            self.active = True
            print(f"profiling steps {self.first}-{self.last} into {self.logdir} "
                  "(TensorBoard's Profile tab)", file=sys.stderr, flush=True)
        if self.active and self.mark_steps:
            self.trace = tf.profiler.experimental.Trace("train", step_num=step, _r=1)
            self.trace.__enter__()

    def end(self, step: int) -> None:
        """After training step ``step``."""
        if self.trace is not None:
            self.trace.__exit__(None, None, None)
            self.trace = None
        if self.active and step >= self.last:
            self.stop()

    def stop(self) -> None:
        """Ends a trace still open (the run ended before step B)."""
        if self.trace is not None:
            self.trace.__exit__(None, None, None)
            self.trace = None
        if self.active:
            tf.profiler.experimental.stop()
            self.active, self.done = False, True


class ProfileCallback(tf.keras.callbacks.Callback):
    """``fit``'s side: batch hooks that count steps across epochs."""

    def __init__(self, profiler: StepProfiler, steps_per_execution: int = 1):
        super().__init__()
        self.profiler, self.per_call, self.step = profiler, max(1, steps_per_execution), 0
        profiler.mark_steps = False

    def on_train_batch_begin(self, batch, logs=None):
        self.profiler.begin(self.step + 1)

    def on_train_batch_end(self, batch, logs=None):
        self.step += self.per_call
        self.profiler.end(self.step)

    def on_train_end(self, logs=None):
        self.profiler.stop()


def make(run) -> Optional[StepProfiler]:
    """The run's profiler, or None without --profile-steps (or on a non-chief worker)."""
    cfg = run.config
    if not cfg.profile_steps or not run.dist.is_chief:
        return None
    return StepProfiler(os.path.join(cfg.output, "tensorboard"), cfg.profile_steps,
                        has_gpu=bool(run.hardware.gpus))
