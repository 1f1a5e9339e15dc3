"""Watching the steps of both loops, off the per-step path: step records, skipped steps,
divergence.

The train step itself writes a log row every ``log_every`` steps into ``StepStats`` (in
the graph).  ``drain()`` turns new rows into step records and hands them to ``emit`` (the
recorder: console lines, TensorBoard, the user's ``on_step``); ``check()`` also counts
skipped steps and stops a run whose gradients stay non-finite.  In ``--loop fit`` a small
thread (``polling``) drains every ``poll_seconds`` while Keras trains; on a divergence it
sets ``model.stop_training`` and the error is raised at the next hook in the main thread
(``raise_pending``).  The custom loop calls ``tick()`` after every step: a flag test and a
counter, with a drain every ``log_every`` steps.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Callable


from app.numerics import rules
from app.precision import loss_scale
from app.training import step_stats
from app.precision import policy as prec
from app.core.errors import TrainingDiverged, TrainingInterrupted
from app.training.interrupts import StopFlag
from app.core.files import finite_or_none


class StepMonitor:
    poll_seconds = 0.25

    def __init__(self, log_every: int, max_skipped_steps: int, loss_scaled: bool, optimizer,
                 stats: step_stats.StepStats, stop: StopFlag, emit: Callable[[dict], None],
                 watch=None):
        # watch: the sentinel (app.training.sentinel_watch.SentinelWatch), or None when off.
        self.watch = watch
        self.log_every, self.max_skipped_steps = log_every, max_skipped_steps
        self.loss_scaled, self.opt, self.stats, self.stop, self.emit = (
            loss_scaled, optimizer, stats, stop, emit)
        self.calls = 0
        self.skipped_seen = 0
        self.skipped_epoch = 0
        self.epoch = 0
        self.rows_seen = int(stats.log_count.numpy())
        self.lock = threading.RLock()
        self.pending: BaseException | None = None
        if watch is not None:   # metrics.json's numerics.skipped_steps, before an epoch ends
            watch.unrecorded_skips = self.skipped_unrecorded

    # every step of the custom loop
    def tick(self, epoch: int):
        if self.stop.signum is not None:
            raise TrainingInterrupted(self.stop.signum)
        self.calls += 1
        if self.calls % self.log_every == 0:
            self.check(epoch, log=True)

    def begin_epoch(self, epoch: int):
        with self.lock:   # rows not yet drained belong to the epoch that just ended
            self.epoch = epoch
            if self.watch is not None:
                self.watch.begin_epoch(int(self.stats.steps.numpy()))

    def take_skipped_epoch(self) -> int:
        """Steps skipped since the last call (one epoch's, called at its end)."""
        skipped, self.skipped_epoch = self.skipped_epoch, 0
        return skipped

    def skipped_unrecorded(self) -> int:
        """Steps skipped since the last epoch's record (``take_skipped_epoch``): those of
        an epoch a fault or a signal ended, which no epoch's row holds."""
        return self.skipped_epoch + int(self.stats.nonfinite_total.numpy()) - self.skipped_seen

    def check(self, epoch: int, log: bool = False, epoch_loss=None, model=None):
        """Skipped steps and divergence (raises TrainingDiverged); with ``log``, the step
        records written since the last drain.  Main thread, between steps.  At the end of
        an epoch, ``epoch_loss`` (its running loss) and ``model``: without loss scaling a
        non-finite loss, or weights that a step with a finite loss but non-finite gradients
        poisoned, is divergence even when no logging step came after it (with loss
        scaling, skipped steps' losses are non-finite by design and weights stay clean)."""
        st = self.stats
        if log:
            self.drain()
        if self.watch is not None:   # the sentinel owns the rules: every fault is latched
            self.watch.raise_fault(self.opt, model)
        elif not self.loss_scaled and ((epoch_loss is not None
                                        and finite_or_none(epoch_loss) is None)
                                       or (model is not None and not _weights_finite(model))):
            st.nonfinite_total.assign_add(1)
        total = int(st.nonfinite_total.numpy())
        self.skipped_epoch += total - self.skipped_seen
        self.skipped_seen = total
        problem = self._divergence(epoch, total, int(st.consecutive.numpy()))
        st.max_consecutive.assign(st.consecutive)
        if problem:
            raise TrainingDiverged(problem)

    def _divergence(self, epoch: int, total: int, in_a_row: int) -> str | None:
        if self.watch is not None:
            return None
        return divergence(int(self.stats.steps.numpy()), epoch, total, in_a_row,
                          self.loss_scaled, self.max_skipped_steps,
                          lambda: float(loss_scale.current_loss_scale(self.opt)),
                          command_line=self.stop.repeat_exits)

    def drain(self):
        with self.lock:
            rows, self.rows_seen, lost = self.stats.read_log(self.rows_seen)
            if lost:
                print(f"note: {lost} step log record(s) were overwritten before they were read",
                      file=sys.stderr, flush=True)
            for row in rows:
                self.emit(step_record(row, self.epoch))

    # --loop fit: a thread instead of a per-batch hook
    def polling(self, model):
        """While Keras trains: drain and check every ``poll_seconds`` in a thread."""
        return _polling(self, model)

    def raise_pending(self):
        """In the main thread, at a hook: a stop the signal handler or the thread asked for."""
        if self.pending is not None:
            raise self.pending
        self.stop.check()


@contextlib.contextmanager
def _polling(monitor: StepMonitor, model):
    """``StepMonitor.polling``: on a divergence (or the user's on_step raising) the thread sets
    ``model.stop_training``; the error is raised at the next hook (``raise_pending``)."""
    done = threading.Event()

    def poll():
        while not done.wait(monitor.poll_seconds):
            try:
                monitor.drain()
                if monitor.watch is not None:
                    monitor.watch.raise_fault(monitor.opt)
                st = monitor.stats
                problem = monitor._divergence(monitor.epoch, int(st.nonfinite_total.numpy()),
                                              int(st.consecutive.numpy()))
            except BaseException as exc:  # e.g. the user's on_step raised
                problem = exc
            if problem:
                monitor.pending = (problem if isinstance(problem, BaseException)
                                else TrainingDiverged(problem))
                model.stop_training = True
                return
    thread = threading.Thread(target=poll, name="tfmp-step-log", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def divergence(step: int, epoch: int, total: int, in_a_row: int, loss_scaled: bool,
               max_skipped_steps: int, loss_scale_now: Callable[[], float],
               command_line: bool = True) -> str | None:
    """Why training diverged at ``step`` of ``epoch`` (0-based), or None: the rules without
    the sentinel.  ``total``: non-finite steps so far; ``in_a_row``: the steps skipped in a
    row up to now.  Under loss scaling a skipped step is how it works: a run of them above
    the floor is the scale coming down, and one that ended is the scale recovered; only a
    run still going at the floor, longer than ``max_skipped_steps``, is divergence
    (``app.numerics.rules.stuck_at_floor``).  Without loss scaling a single non-finite step
    is.  ``command_line``: name the setting as ``tfmp train`` takes it, else as
    ``app.train`` does."""
    where = f"step {step} (epoch {epoch + 1})"
    if total and not loss_scaled:
        return (f"{where}: non-finite loss/gradients under {prec.global_policy_name()}, "
                "which has no loss scaling to recover with")
    if not (loss_scaled and in_a_row > max_skipped_steps):
        return None
    if not rules.stuck_at_floor(in_a_row, loss_scale_now(), max_skipped_steps):
        return None
    return f"{where}: " + rules.skipped_headline(step - in_a_row + 1, in_a_row,
                                                 max_skipped_steps, command_line)


def step_record(row: dict, epoch: int) -> dict:
    """A step log row (``StepStats.read_log``) as the record the callbacks and
    metrics.json get (JSON has no NaN: a non-finite loss or norm is None)."""
    return {"step": int(row["step"]), "epoch": epoch + 1,
            "loss": finite_or_none(row["loss"]), "grad_norm": finite_or_none(row["grad_norm"]),
            "loss_scale": float(row["loss_scale"]), "skipped_steps": int(row["skipped_steps"])}


def _weights_finite(model) -> bool:
    """One pass over the trainable weights, once an epoch."""
    from app.numerics.replay import nonfinite_weights

    return not nonfinite_weights(model.trainable_variables)
