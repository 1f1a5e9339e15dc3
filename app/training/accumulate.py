"""Gradient accumulation: N micro-batches, one optimizer update (``--accumulate N``).

Every micro-batch's gradients, unscaled (a loss-scaled path divides by the scale they were
computed with) and weighted by the micro-batch's sample count, are added in float32
variables, one per trainable variable.  The N-th micro-batch of a group, or the epoch's
last one (a short group), hands their mean (sum / samples) to the optimizer's own apply
path, once, in the form that path takes (a LossScaleOptimizer's: scaled, for it to unscale
as it unscales a plain step's; ``loss_scale.apply_path``).  A LossScaleOptimizer so sees
one update: when any micro-batch was non-finite the sum is too, and it skips the whole
update and lowers the scale once; its growth counts updates.  Off the update the optimizer is not called at
all, so its iterations (learning-rate schedules), the step statistics, the sentinel's step
and the checkpoints count updates.  No pass over the gradients of ours beyond the add.

Groups never span epochs: ``position`` (micro-batches into the epoch) restarts with every
epoch, and a resumed run starts at the group boundary it was saved at (``start_at``).
BatchNormalization's moving statistics are updated per micro-batch (docs/training.md).

Several replicas: the sums are sync-on-read variables, each replica adding its share of
the global micro-batch (the loss is averaged over the global micro-batch, as in a plain
step); the optimizer's all-reduce at the update sums the shares.  The update is taken in
the cross-replica context, as the sentinel's guarded apply is.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Callable, Optional

import tensorflow as tf

from app.precision import loss_scale
from app.training.config import check_accumulation
from app.training.sentinel import FitView

_ON_READ = tf.VariableSynchronization.ON_READ
_FIRST = tf.VariableAggregation.ONLY_FIRST_REPLICA


def _local(name, value, aggregation=tf.VariableAggregation.SUM):
    return tf.Variable(value, trainable=False, name=name, synchronization=_ON_READ,
                       aggregation=aggregation)


# ---- the run's accumulation (``app.training.job``) --------------------------------------------

def resolve(cfg, dist):
    """``cfg`` with ``accumulate`` and ``global_batch`` resolved for the replicas ``dist``
    (``app.training.distribute.Distribution``) has; UsageError for what cannot be."""
    n = check_accumulation(cfg, dist.replicas)
    return dataclasses.replace(cfg, accumulate=n, global_batch=dist.global_batch * n)


def for_run(run, model, strategy) -> Optional["Accumulator"]:
    """The run's accumulator (None: one batch per update), and the one line about
    BatchNormalization when the model has it.  ``run``: ``app.training.job.Prepared``."""
    n = run.config.accumulate or 1
    if n == 1:
        return None
    from app.task import model_layers

    if any(isinstance(layer, tf.keras.layers.BatchNormalization)
           for _, layer, _ in model_layers.walk(model)):
        print(f"note: --accumulate {n}: BatchNormalization's statistics are computed per "
              f"micro-batch of {run.dist.global_batch}, not over the global batch of "
              f"{run.config.global_batch} (docs/training.md)", file=sys.stderr, flush=True)
    return Accumulator(model.trainable_variables, n, steps_per_epoch(run), strategy,
                       run.dist.replicas)


def steps_per_epoch(run) -> int:
    """Training steps (micro-batches of the global batch) an epoch."""
    return -(-run.bundle.train_samples // run.dist.global_batch)


def trained_in_epoch(run, start: int, step: int, began: Optional[int] = None) -> int:
    """The (micro-)batches of epoch ``start`` that the checkpoint's ``step`` updates already
    trained: a checkpoint saved mid-epoch (an interrupt) continues after them, and one saved
    mid-group at that group's start (a group's sums are not saved).  ``began``: the step
    count the epoch began at, as recorded (None: ``start`` whole epochs of this run's
    updates; an earlier epoch trained at another batch size ends elsewhere).  0 when the
    count does not fit this run's epoch.  The caller makes sure the checkpoint's updates
    are of this run's size (``resuming._resized``)."""
    n = run.config.accumulate or 1
    updates = -(-steps_per_epoch(run) // n)
    done = step - (start * updates if began is None else began)
    return done * n if 0 < done < updates else 0


def batch_samples(batch):
    """The number of samples in a (micro-)batch: the leading dimension of its first tensor."""
    return tf.shape(tf.nest.flatten(batch)[0])[0]


class Accumulator:
    """The sums, the group's sample count and position, in variables the step writes."""

    def __init__(self, variables, every: int, per_epoch: int, strategy, replicas: int = 1):
        self.every, self.per_epoch, self.replicas = int(every), max(1, int(per_epoch)), replicas
        self.fit = FitView()   # fit's batch, for its sample count
        with strategy.scope():
            self.sums = [_local(f"accumulated_grad_{i}", tf.zeros(tuple(v.shape), tf.float32))
                         for i, v in enumerate(variables)]
            self.samples = _local("accumulated_samples", tf.constant(0.0))
            self.bad = _local("accumulated_bad", tf.constant(0.0), _FIRST)
            self.position = _local("accumulated_position", tf.constant(0, tf.int64), _FIRST)

    def updates_per_epoch(self) -> int:
        return -(-self.per_epoch // self.every)

    def start_at(self, micro_batches: int) -> None:
        """A resumed run continues ``micro_batches`` into its epoch (a group boundary)."""
        self.position.assign(int(micro_batches))

    # ---- inside the step --------------------------------------------------------------------
    def step(self, grads, samples, apply: Callable[[list], None],
             scale_in: Optional[Callable] = None, scale_out: Optional[Callable] = None, ok=None):
        """Add one micro-batch; on the group's last, ``apply(mean)``.  ``grads`` are the true
        gradients times ``scale_in()`` (None: 1); ``apply`` takes them times ``scale_out()``.
        ``ok`` (the sentinel's verdict on this micro-batch, same on every replica): a group
        with one that is not ok is not applied.  Returns ``update``, a bool tensor."""
        grads = list(grads)
        dtypes = [None if g is None else g.dtype for g in grads]
        weight = tf.cast(samples, tf.float32) * float(self.replicas)
        factor = weight if scale_in is None else weight / tf.cast(scale_in(), tf.float32)
        for total, g in zip(self.sums, grads):
            if g is not None:
                _add_scaled(total, g, factor)
        self.samples.assign_add(weight, read_value=False)
        if ok is not None:
            self.bad.assign(tf.maximum(self.bad, 1.0 - tf.cast(ok, tf.float32)),
                            read_value=False)
        pos = self.position + 1
        last = pos >= self.per_epoch
        self.position.assign(tf.where(last, tf.zeros_like(pos), pos), read_value=False)
        update = tf.logical_or(tf.equal(tf.math.floormod(pos, self.every), 0), last)
        go = update if ok is None else tf.logical_and(update, tf.equal(self.bad, 0.0))
        replica_cond(go, lambda: apply(self.mean(dtypes, scale_out)))
        return update

    def mean(self, dtypes, scale_out=None) -> list:
        """The group's mean gradients (times ``scale_out()``), cast to ``dtypes`` (None: that
        variable has no gradient)."""
        count = tf.maximum(self.samples.read_value(), 1e-30)
        factor = 1.0 / count if scale_out is None else tf.cast(scale_out(), tf.float32) / count
        return [None if d is None else tf.cast(total * factor, d)
                for total, d in zip(self.sums, dtypes)]

    def reset_if(self, update) -> None:
        """After the update (and the statistics' read of the mean): an empty group."""
        def reset():
            for total in self.sums:
                total.assign(tf.zeros_like(total), read_value=False)
            self.samples.assign(0.0, read_value=False)
            self.bad.assign(0.0, read_value=False)
            return tf.constant(True)
        tf.cond(update, reset, lambda: tf.constant(False))


def _add_scaled(total, grad, factor) -> None:
    """``total += factor * grad`` in one pass: gradient descent's fused kernel with a step of
    -factor (``assign_add(grad * factor)`` makes a product the size of the variable first,
    then adds it: two passes more over every gradient, every micro-batch)."""
    grad = tf.cast(tf.convert_to_tensor(grad), tf.float32)
    tf.raw_ops.ResourceApplyGradientDescent(var=total.handle, alpha=-factor, delta=grad)


def micro_batch(acc: Accumulator, opt, grads, samples, apply, *, scale_in=None, scale_out=None,
                sentinel=None, loss=None, batch=None, record=None):
    """One micro-batch through ``acc`` (behind the sentinel's guard when there is one); then
    ``record(mean_fn, skipped, update)`` (the step statistics) and the reset.  Returns
    (skipped or None, update)."""
    scaled = loss_scale.is_loss_scaled(opt)
    before = loss_scale.current_loss_scale(opt) if scaled else None
    dtypes = [None if g is None else g.dtype for g in grads]

    def run(g, ok=None):
        update = acc.step(g, samples, apply, scale_in, scale_out, ok)
        skipped = (tf.logical_and(update, loss_scale.step_skipped(opt, before)) if scaled
                   else None)
        return skipped, update
    if sentinel is None:
        skipped, update = run(grads)
    else:
        _, skipped, update = sentinel.guard(opt, grads, loss, batch, run, accumulated=True,
                                            position=acc.position.read_value())
    if record is not None:
        record(lambda: acc.mean(dtypes), skipped, update)
    acc.reset_if(update)
    return skipped, update


def replica_cond(ok, fn) -> None:
    """Run ``fn()`` only when ``ok`` (the same on every replica).  Under a strategy (one
    replica or several) the ``cond`` is taken in the cross-replica context, since TensorFlow
    refuses a cond in a replica context whose branch synchronises (the optimizer's
    all-reduce, or Keras 2's merge_call for one replica)."""
    ctx = loss_scale.strategy_replica_context()

    def yes_one():
        fn()
        return tf.constant(True)
    if ctx is None:
        tf.cond(ok, yes_one, lambda: tf.constant(False))
        return

    def cross(distribution, ok):
        def yes():
            distribution.extended.call_for_each_replica(fn)
            return tf.constant(True)
        first = distribution.experimental_local_results(ok)[0]
        return tf.cond(first, yes, lambda: tf.constant(False))
    ctx.merge_call(cross, args=(ok,))
