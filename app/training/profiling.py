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
from app.precision.keras_version import IS_KERAS3
from app.training.accumulate import steps_per_epoch


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

    def start(self) -> None:
        if self.active or self.done:
            return
        from app.machine import profiler_rights

        line = profiler_rights.check(self.has_gpu)
        if line:
            print(line, file=sys.stderr, flush=True)
        os.makedirs(self.logdir, exist_ok=True)
        tf.profiler.experimental.start(self.logdir)
        self.active = True
        print(f"profiling steps {self.first}-{self.last} into {self.logdir} "
              "(TensorBoard's Profile tab)", file=sys.stderr, flush=True)

    def begin(self, step: int) -> None:
        """Before training step ``step`` (from 1): the custom loop."""
        if self.done:
            return
        if not self.active and step >= self.first:
            self.start()
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
    """``fit``'s side.  Keras 2 wraps each step, its batch hooks included, in a "train" trace
    (the Profile tab's step marker), so there the profiler starts after step A-1's hooks
    (before step A's trace opens) and stops at step B+1's first hook or the end of the epoch
    (after step B's trace closed).  Keras 3 marks no steps: the hooks mark them, as the custom
    loop does."""

    def __init__(self, profiler: StepProfiler, steps_per_execution: int = 1):
        super().__init__()
        self.profiler, self.per_call, self.step = profiler, max(1, steps_per_execution), 0
        profiler.mark_steps = IS_KERAS3
        self.stop_next = False

    def on_train_begin(self, logs=None):
        if self.profiler.first == 1 and not IS_KERAS3:
            self.profiler.start()

    def on_train_batch_begin(self, batch, logs=None):
        if self.stop_next:
            self.profiler.stop()
        if IS_KERAS3:
            self.profiler.begin(self.step + 1)

    def on_train_batch_end(self, batch, logs=None):
        if self.profiler.trace is not None:
            self.profiler.trace.__exit__(None, None, None)
            self.profiler.trace = None
        self.step += self.per_call
        if not IS_KERAS3 and self.step + 1 >= self.profiler.first:
            self.profiler.start()
        if self.step >= self.profiler.last and self.profiler.active:
            self.stop_next = True

    def on_epoch_end(self, epoch, logs=None):
        if self.stop_next:
            self.profiler.stop()

    def on_train_end(self, logs=None):
        self.profiler.stop()


def past_the_end(run) -> Optional[str]:
    """A note when --profile-steps begins after the run's last training step (steps count
    from 1 over the whole run, a resumed one too): the run would end with no profile and
    no word of why."""
    cfg = run.config
    samples = run.bundle.train_samples
    if not cfg.profile_steps or not samples or not run.dist.is_chief:
        return None
    first, _ = parse_step_range(cfg.profile_steps)
    per_epoch = steps_per_epoch(run)
    last = per_epoch * cfg.epochs
    if first <= last:
        return None
    return (f"--profile-steps {cfg.profile_steps} begins after this run's last step, {last} "
            f"({cfg.epochs} epoch(s) of {per_epoch}): nothing will be profiled; a range within "
            f"1-{last} profiles this run")


def make(run) -> Optional[StepProfiler]:
    """The run's profiler, or None without --profile-steps (or on a non-chief worker)."""
    cfg = run.config
    if not cfg.profile_steps or not run.dist.is_chief:
        return None
    return StepProfiler(os.path.join(cfg.output, "tensorboard"), cfg.profile_steps,
                        has_gpu=bool(run.hardware.gpus))
