"""The step statistics: per-step counts and a ring of log rows kept in variables, so the
training step never waits for Python (``StepStats``), and how ``Model.fit``'s own step feeds
them (``attach_stats_to_optimizer``).

Every step: the step count, and under loss scaling whether the optimizer skipped the step
(in total, in a row, the longest run), read from the optimizer's own state
(``step_skipped``).  Every ``log_every``-th step (``steps`` a multiple of it): a log row -
step, running loss, global norm of the gradients, loss scale, skipped steps so far - written
into a ring of ``capacity`` rows that Python reads whenever it likes (``read_log``), without
a per-step hook.

Nothing here passes over the gradients on ordinary steps: the norm is computed in the
logging branch only (``tf.cond``).  Without loss scaling nothing is skipped: a non-finite
gradient is applied, poisons the weights, and from then on the loss is non-finite too, so a
logging step that sees a non-finite loss or norm counts one in ``nonfinite_total``, which
the training loops treat as divergence.
"""
from __future__ import annotations

import tensorflow as tf

from app.precision.keras_version import IS_KERAS3
from app.precision.loss_scale import (agree_on_nonfinite, current_loss_scale, global_norm,
                                      is_loss_scaled, multi_replica_context, step_skipped)


def metric_mean(metric):
    """A Keras ``Mean`` metric's value, read from its variables.

    Inside a replica context (MirroredStrategy), Keras 2's ``Metric.result()`` calls
    ``merge_call``, which TensorFlow refuses inside the ``tf.cond`` of a logging step;
    reading the sync-on-read variables there gives this replica's running mean instead,
    which is what a step log needs."""
    total, count = getattr(metric, "total", None), getattr(metric, "count", None)
    if total is None or count is None:
        return metric.result()
    return tf.math.divide_no_nan(tf.cast(total, tf.float32), tf.cast(count, tf.float32))


# Columns of StepStats.log_rows, one row per logging step.
LOG_COLUMNS = ("step", "loss", "grad_norm", "loss_scale", "skipped_steps")


class StepStats:
    """Per-step statistics in variables (the module's docstring says what and why)."""

    def __init__(self, log_every: int = 1, capacity: int = 1024):
        def var(name, dtype, shape=()):
            return tf.Variable(tf.zeros(shape, dtype), trainable=False, name=name)
        self.log_every = max(1, int(log_every))
        self.capacity = int(capacity)
        self.grad_norm = var("stats_grad_norm", tf.float32)   # as of the last logging step
        self.nonfinite_total = var("stats_nonfinite_total", tf.int64)
        self.consecutive = var("stats_nonfinite_in_a_row", tf.int64)
        self.max_consecutive = var("stats_max_nonfinite_in_a_row", tf.int64)
        self.steps = var("stats_steps", tf.int64)
        self.log_rows = var("stats_log_rows", tf.float64, (self.capacity, len(LOG_COLUMNS)))
        self.log_count = var("stats_log_count", tf.int64)   # rows ever written

    def record(self, grads, skipped=None, scale=None, loss=None, loss_scale=None, update=None):
        """Record one step (inside the tf.function), after the optimizer applied it.
        ``grads``: a list, or a zero-argument callable giving it (read in the logging
        branch only).  ``skipped``: the bool tensor from ``step_skipped`` under loss
        scaling, else None.  ``scale``: divide the norm by it when ``grads`` are still
        multiplied by the loss scale.  ``loss`` and ``loss_scale``: zero-argument callables
        giving the running loss and the loss scale for the log row (traced into the logging
        branch only).  ``update``: with gradient accumulation, a bool tensor, True on the
        micro-batch that updated (only those count as steps)."""
        def norm():
            gs = [g for g in (grads() if callable(grads) else grads) if g is not None]
            n = global_norm(gs)
            return n / tf.cast(scale, tf.float32) if scale is not None else n
        ctx = multi_replica_context()
        if ctx is None:
            self._write(norm, skipped, loss, loss_scale, update)
            return
        # Several replicas: the optimizer's skip decision is the same on all of them (it
        # looks at the all-reduced gradients), and only the first replica of each worker
        # writes these per-process variables, once per step.  grad_norm is then that
        # replica's own contribution, not the norm of the all-reduced gradient.
        local = len(tf.distribute.get_strategy().extended.worker_devices)
        first = tf.equal(tf.math.floormod(
            tf.cast(ctx.replica_id_in_sync_group, tf.int32), local), 0)
        tf.cond(first, lambda: self._write(norm, skipped, loss, loss_scale, update),
                lambda: tf.constant(False))

    def _write(self, norm, skipped, loss, loss_scale, update=None):
        if skipped is not None:
            in_a_row = tf.where(skipped, self.consecutive + 1, tf.constant(0, tf.int64))
            if update is not None:   # a micro-batch that did not update leaves the run as is
                in_a_row = tf.where(update, in_a_row, self.consecutive)
            self.nonfinite_total.assign_add(tf.cast(skipped, tf.int64))
            self.consecutive.assign(in_a_row)
            self.max_consecutive.assign(tf.maximum(self.max_consecutive, in_a_row))
        step = self.steps.assign_add(1 if update is None else tf.cast(update, tf.int64))
        log_row = self._log_row(norm, skipped, loss, loss_scale, step)
        is_log = tf.equal(tf.math.floormod(step, self.log_every), 0)
        if update is not None:
            is_log = tf.logical_and(is_log, update)
        tf.cond(is_log, log_row, lambda: tf.constant(False))
        return tf.constant(True)

    def _log_row(self, norm, skipped, loss, loss_scale, step):
        def log_row():
            n = norm()
            self.grad_norm.assign(n)
            value = (tf.cast(loss(), tf.float32) if loss is not None
                     else tf.constant(float("nan")))
            if skipped is None:   # no loss scaling: a non-finite value means divergence
                ok = tf.math.is_finite(n)
                if loss is not None:
                    ok = tf.logical_and(ok, tf.math.is_finite(value))
                self.nonfinite_total.assign_add(tf.cast(tf.logical_not(ok), tf.int64))
            row = tf.stack([tf.cast(step, tf.float64), tf.cast(value, tf.float64),
                            tf.cast(n, tf.float64),
                            tf.cast(loss_scale() if loss_scale is not None else 1.0, tf.float64),
                            tf.cast(self.nonfinite_total, tf.float64)])
            slot = tf.math.floormod(self.log_count, self.capacity)
            written = self.log_rows.scatter_nd_update(tf.reshape(slot, (1, 1)), row[None])
            # The count moves only after the row is in place: a reader never sees a row
            # counted before it is written.
            with tf.control_dependencies([written]):
                self.log_count.assign_add(1)
            return tf.constant(True)
        return log_row

    def read_log(self, seen: int):
        """(rows written since the first ``seen``, new count, rows lost to the ring) from
        Python, any thread: each row a dict of LOG_COLUMNS."""
        count = int(self.log_count.numpy())
        if count <= seen:
            return [], count, 0
        rows = self.log_rows.numpy()
        # Row i lives in slot i % capacity until row i + capacity is written: keep only the
        # rows no write (up to the count read *after* the copy) can have replaced.
        oldest = max(seen, int(self.log_count.numpy()) - self.capacity)
        out = [dict(zip(LOG_COLUMNS, (float(v) for v in rows[i % self.capacity])))
               for i in range(oldest, count)]
        return out, count, oldest - seen

    def attach_to(self, opt, loss=None, sentinel=None, accumulator=None) -> None:
        """Record the gradients ``Model.fit`` hands ``opt`` (``attach_stats_to_optimizer``)."""
        attach_stats_to_optimizer(self, opt, loss, sentinel, accumulator)


def attach_stats_to_optimizer(stats: StepStats, opt, loss=None, sentinel=None,
                              accumulator=None) -> None:
    """Record into ``stats`` the gradients ``Model.fit`` hands ``opt``; ``loss``: a zero-argument
    callable giving the running loss (read on logging steps only).  ``sentinel``: an
    ``app.training.sentinel.SentinelState`` whose guard the update goes through.
    ``accumulator``: an ``app.training.accumulate.Accumulator``: fit's steps are its
    micro-batches, the optimizer is called once a group.

    fit computes gradients inside Keras' own train step, out of our reach, so this wraps
    the optimizer's apply method on this one instance.
    """
    scaled = is_loss_scaled(opt)

    def scale_now():
        return current_loss_scale(opt)
    if IS_KERAS3:
        # Keras 3's train step calls optimizer.apply(grads, vars); an LSO gets scaled grads.
        original = opt.apply

        def apply(grads, trainable_variables=None):
            grads = list(grads)
            if accumulator is not None:
                def apply_mean(g):
                    original(agree_on_nonfinite(g) if scaled else g, trainable_variables)
                _accumulated(stats, accumulator, opt, grads, apply_mean, sentinel, loss,
                             scale_now if scaled else None)
                return
            if scaled:
                grads = agree_on_nonfinite(grads)  # all replicas skip together
            scale = current_loss_scale(opt) if scaled else None  # before apply changes it

            def run(g):
                original(g, trainable_variables)
                return step_skipped(opt, scale) if scaled else None
            grads, skipped = _applied(sentinel, opt, grads, run)
            stats.record(grads, skipped, scale, loss, scale_now)

        object.__setattr__(opt, "apply", apply)
    else:
        # Keras 2's minimize calls apply_gradients with unscaled grads (LSO unscales first).
        original = opt.apply_gradients

        def apply_gradients(grads_and_vars, *args, **kwargs):
            grads_and_vars = list(grads_and_vars)
            variables = [v for _, v in grads_and_vars]
            grads = [g for g, _ in grads_and_vars]
            if accumulator is not None:
                def apply_mean(g):
                    original(list(zip(g, variables)), *args, **kwargs)
                _accumulated(stats, accumulator, opt, grads, apply_mean, sentinel, loss, None)
                return
            before = current_loss_scale(opt) if scaled else None

            def run(g):
                original(list(zip(g, variables)), *args, **kwargs)
                return step_skipped(opt, before) if scaled else None
            grads, skipped = _applied(sentinel, opt, grads, run)
            stats.record(grads, skipped, None, loss, scale_now)

        object.__setattr__(opt, "apply_gradients", apply_gradients)


def _applied(sentinel, opt, grads, run):
    """(gradients as applied, skipped or None): ``run(grads)`` itself, or behind the
    sentinel's guard with the batch and loss of fit's step."""
    if sentinel is None:
        return grads, run(grads)
    loss, batch = sentinel.fit.step()
    # fit's update in a tf.cond, not behind the custom loop's pivot: in Keras 2's fit the
    # pivot measured 2 points slower than the cond (mlp, float32, 36 pairs, both ways round;
    # docs/numerics-cost-record.md), where in the custom loop it is 1 point faster.
    grads, skipped, _ = sentinel.guard(opt, grads, loss, batch, run, pivot=False)
    return grads, skipped


def _accumulated(stats, acc, opt, grads, apply, sentinel, loss, scale) -> None:
    """fit's step as one micro-batch of ``acc`` (``app.training.accumulate.micro_batch``):
    ``grads`` are as fit hands them (times ``scale()`` on Keras 3 under loss scaling)."""
    from app.training.accumulate import batch_samples, micro_batch

    _, batch = acc.fit.step()
    fit_loss = sentinel.fit.step()[0] if sentinel is not None else None

    def record(mean, skipped, update):
        stats.record(mean, skipped, None, loss, lambda: current_loss_scale(opt), update=update)
    micro_batch(acc, opt, grads, batch_samples(batch), apply, scale_in=scale, scale_out=scale,
                sentinel=sentinel, loss=fit_loss, batch=batch, record=record)
