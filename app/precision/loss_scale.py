"""The one compatibility seam between Keras 2 (TF 2.9-2.15) and Keras 3 (TF 2.16+) for loss scaling.

Keras 2: ``tf.keras.mixed_precision.LossScaleOptimizer`` with ``get_scaled_loss`` /
``get_unscaled_gradients``; ``apply_gradients`` takes *unscaled* gradients, skips the step
and halves the scale when they are not finite; the scale is ``opt.loss_scale``.

Keras 3: ``keras.optimizers.LossScaleOptimizer`` with ``scale_loss``; ``apply`` takes the
*scaled* gradients and unscales them itself, skipping non-finite steps; the scale is
``opt.dynamic_scale``.

Nothing outside this module asks which Keras is running.  Skipped steps are counted by us
(``StepStats``), because neither optimizer exposes a counter: ``step_skipped`` reads each
step's decision from the optimizer's loss-scale state.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import tensorflow as tf

from app.core.catalog import DEFAULT_INITIAL_LOSS_SCALE

KERAS_MAJOR = int(str(getattr(tf.keras, "__version__", "2")).split(".")[0])
IS_KERAS3 = KERAS_MAJOR >= 3

DEFAULT_INITIAL_SCALE = DEFAULT_INITIAL_LOSS_SCALE
DEFAULT_GROWTH_STEPS = 2000


def needs_loss_scaling(policy: str) -> bool:
    """Only float16 needs it: bfloat16 has float32's exponent range, float32 needs nothing."""
    return policy == "mixed_float16"


def _lso_class():
    if IS_KERAS3:
        return tf.keras.optimizers.LossScaleOptimizer
    return tf.keras.mixed_precision.LossScaleOptimizer


def is_loss_scaled(opt) -> bool:
    return isinstance(opt, _lso_class())


def wrap_optimizer(opt, policy: str, initial_scale: float = DEFAULT_INITIAL_SCALE,
                   growth_steps: int = DEFAULT_GROWTH_STEPS):
    """Wrap ``opt`` in a dynamic LossScaleOptimizer when ``policy`` is mixed_float16."""
    if not needs_loss_scaling(policy):
        return opt
    cls = _lso_class()
    if IS_KERAS3:
        return cls(opt, initial_scale=initial_scale, dynamic_growth_steps=growth_steps)
    return cls(opt, dynamic=True, initial_scale=initial_scale, dynamic_growth_steps=growth_steps)


def build_optimizer(opt, variables) -> None:
    """Create optimizer (and loss-scale) variables now, so a checkpoint can restore into them
    and a tf.function does not create variables while tracing.  Keras 2 restores slots
    lazily and creates them on first apply, so it needs nothing here."""
    if IS_KERAS3 and not opt.built:
        opt.build(variables)


def scale_loss(opt, loss):
    if not is_loss_scaled(opt):
        return loss
    if IS_KERAS3:
        return opt.scale_loss(loss)
    return opt.get_scaled_loss(loss)


def current_loss_scale(opt):
    """The loss scale as a float32 tensor (1.0 without loss scaling)."""
    if not is_loss_scaled(opt):
        return tf.constant(1.0, tf.float32)
    if IS_KERAS3:
        if not opt.built:  # the scale variable is created in build()
            return tf.constant(float(opt.initial_scale), tf.float32)
        return tf.cast(tf.convert_to_tensor(opt.dynamic_scale), tf.float32)
    return tf.cast(opt.loss_scale, tf.float32)


def all_finite(grads) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads if g is not None])


def _multi_replica_context():
    """The replica context when several replicas train in sync, else None."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return None
    return ctx


def agree_on_nonfinite(grads):
    """Several replicas: if any replica's gradients are non-finite, make every replica's
    non-finite, so that all of them skip the step together.

    Keras 3's LossScaleOptimizer (TF backend) checks each replica's *own* gradients before
    the all-reduce, so without this one replica could apply a step that another skips (a
    hang in the all-reduce, or NaN weights).  Keras 2's aggregates first.  Costs one scalar
    all-reduce per step."""
    ctx = _multi_replica_context()
    if ctx is None:
        return grads
    bad = ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                         tf.cast(tf.logical_not(all_finite(grads)), tf.float32))
    poison = tf.where(bad > 0, tf.constant(float("nan")), tf.constant(0.0))
    return [g if g is None else g + tf.cast(poison, g.dtype) for g in grads]


def step_skipped(opt, scale_before):
    """Right after ``opt`` (a dynamic LossScaleOptimizer) applied a step: did it skip it?

    Read from the optimizer's own state instead of another pass over every gradient (the
    optimizer has just made that pass): a skipped step resets the counter to 0 and halves
    the scale (Keras 2: not below 1); the only other reset, growth after
    ``dynamic_growth_steps`` finite steps, raises the scale.  (Growth that would overflow
    float32 leaves the scale as it is, and would read as a skip: that needs the scale at
    2**127, ~110 growth periods without one overflow.)"""
    # The counter of finite steps since the scale last changed.
    counter = opt.step_counter if IS_KERAS3 else opt.dynamic_counter
    return tf.logical_and(tf.equal(tf.cast(counter, tf.int64), 0),
                          current_loss_scale(opt) <= scale_before)


class Applied(NamedTuple):
    """What ``unscale_and_apply`` did: ``grads`` divided by ``divide_by`` (a float32 tensor,
    or None when ``grads`` are already unscaled) are the true gradients; ``skipped`` is a
    bool tensor, True when the LossScaleOptimizer skipped the step for non-finite gradients
    (it lowered the scale too), and None without loss scaling, where nothing is skipped."""
    grads: list
    divide_by: Optional[tf.Tensor]
    skipped: Optional[tf.Tensor]

    def grad_norm(self) -> tf.Tensor:
        """Global norm of the true gradients: a pass over all of them, so log it every N
        steps rather than every step."""
        n = global_norm(self.grads)
        return n if self.divide_by is None else n / self.divide_by


def unscale_and_apply(opt, scaled_grads, variables) -> Applied:
    """Apply gradients of the *scaled* loss; nothing here passes over the gradients beyond
    what the optimizer itself does (no unscaling for a norm, no finiteness check of ours)."""
    scaled_grads = list(scaled_grads)
    if not is_loss_scaled(opt):
        opt.apply_gradients(zip(scaled_grads, variables))
        return Applied(scaled_grads, None, None)
    before = current_loss_scale(opt)
    if IS_KERAS3:
        scaled_grads = agree_on_nonfinite(scaled_grads)
        opt.apply(scaled_grads, variables)  # unscales inside; skips if non-finite
        return Applied(scaled_grads, before, step_skipped(opt, before))
    unscaled = opt.get_unscaled_gradients(scaled_grads)
    opt.apply_gradients(zip(unscaled, variables))  # skips and lowers the scale if non-finite
    return Applied(unscaled, None, step_skipped(opt, before))


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


def global_norm(grads) -> tf.Tensor:
    grads = [tf.cast(g, tf.float32) for g in grads if g is not None]
    return tf.linalg.global_norm(grads)


# Columns of StepStats.log_rows, one row per logging step.
LOG_COLUMNS = ("step", "loss", "grad_norm", "loss_scale", "skipped_steps")


class StepStats:
    """Per-step statistics, kept in variables so the training step never waits for Python.

    Every step: the step count, and under loss scaling whether the optimizer skipped the
    step (in total, in a row, the longest run), read from the optimizer's own state
    (``step_skipped``).  Every ``log_every``-th step (``steps`` a multiple of it): a log row
    - step, running loss, global norm of the gradients, loss scale, skipped steps so far -
    written into a ring of ``capacity`` rows that Python reads whenever it likes
    (``read_log``), without a per-step hook.

    Nothing here passes over the gradients on ordinary steps: the norm is computed in the
    logging branch only (``tf.cond``).  Without loss scaling nothing is skipped: a
    non-finite gradient is applied, poisons the weights, and from then on the loss is
    non-finite too, so a logging step that sees a non-finite loss or norm counts one in
    ``nonfinite_total``, which the training loops treat as divergence.
    """

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

    def record(self, grads, skipped=None, scale=None, loss=None, loss_scale=None):
        """Record one step (inside the tf.function), after the optimizer applied it.
        ``skipped``: the bool tensor from ``step_skipped`` under loss scaling, else None.
        ``scale``: divide the norm by it when ``grads`` are still multiplied by the loss
        scale.  ``loss`` and ``loss_scale``: zero-argument callables giving the running
        loss and the loss scale for the log row (traced into the logging branch only)."""
        grads = [g for g in grads if g is not None]

        def norm():
            n = global_norm(grads)
            return n / tf.cast(scale, tf.float32) if scale is not None else n
        ctx = _multi_replica_context()
        if ctx is None:
            self._write(norm, skipped, loss, loss_scale)
            return
        # Several replicas: the optimizer's skip decision is the same on all of them (it
        # looks at the all-reduced gradients), and only the first replica of each worker
        # writes these per-process variables, once per step.  grad_norm is then that
        # replica's own contribution, not the norm of the all-reduced gradient.
        local = len(tf.distribute.get_strategy().extended.worker_devices)
        first = tf.equal(tf.math.floormod(
            tf.cast(ctx.replica_id_in_sync_group, tf.int32), local), 0)
        tf.cond(first, lambda: self._write(norm, skipped, loss, loss_scale),
                lambda: tf.constant(False))

    def _write(self, norm, skipped, loss, loss_scale):
        if skipped is not None:
            in_a_row = tf.where(skipped, self.consecutive + 1, tf.constant(0, tf.int64))
            self.nonfinite_total.assign_add(tf.cast(skipped, tf.int64))
            self.consecutive.assign(in_a_row)
            self.max_consecutive.assign(tf.maximum(self.max_consecutive, in_a_row))
        step = self.steps.assign_add(1)

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
        is_log = tf.equal(tf.math.floormod(step, self.log_every), 0)
        tf.cond(is_log, log_row, lambda: tf.constant(False))
        return tf.constant(True)

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

    def attach_to(self, opt, loss=None) -> None:
        """Record the gradients ``Model.fit`` hands ``opt`` (``attach_stats_to_optimizer``)."""
        attach_stats_to_optimizer(self, opt, loss)


def attach_stats_to_optimizer(stats: StepStats, opt, loss=None) -> None:
    """Record into ``stats`` the gradients ``Model.fit`` hands ``opt``; ``loss``: a zero-argument
    callable giving the running loss (read on logging steps only).

    fit computes gradients inside Keras' own train step, out of our reach, so this wraps
    the optimizer's apply method on this one instance.
    """
    if IS_KERAS3:
        # Keras 3's train step calls optimizer.apply(grads, vars); an LSO gets scaled grads.
        original = opt.apply
        scaled = is_loss_scaled(opt)

        def apply(grads, trainable_variables=None):
            grads = list(grads)
            if scaled:
                grads = agree_on_nonfinite(grads)  # all replicas skip together
            scale = current_loss_scale(opt) if scaled else None  # before apply changes it
            result = original(grads, trainable_variables)
            stats.record(grads, step_skipped(opt, scale) if scaled else None, scale, loss,
                        lambda: current_loss_scale(opt))
            return result

        object.__setattr__(opt, "apply", apply)
    else:
        # Keras 2's minimize calls apply_gradients with unscaled grads (LSO unscales first).
        original = opt.apply_gradients
        scaled = is_loss_scaled(opt)

        def apply_gradients(grads_and_vars, *args, **kwargs):
            grads_and_vars = list(grads_and_vars)
            before = current_loss_scale(opt) if scaled else None
            result = original(grads_and_vars, *args, **kwargs)
            stats.record([g for g, _ in grads_and_vars],
                        step_skipped(opt, before) if scaled else None, None, loss,
                        lambda: current_loss_scale(opt))
            return result

        object.__setattr__(opt, "apply_gradients", apply_gradients)
