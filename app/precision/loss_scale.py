"""The one compatibility seam between Keras 2 (TF 2.9-2.15) and Keras 3 (TF 2.16+) for loss scaling.

Keras 2: ``tf.keras.mixed_precision.LossScaleOptimizer`` with ``get_scaled_loss`` /
``get_unscaled_gradients``; ``apply_gradients`` takes *unscaled* gradients, skips the step
and halves the scale when they are not finite; the scale is ``opt.loss_scale``.

Keras 3: ``keras.optimizers.LossScaleOptimizer`` with ``scale_loss``; ``apply`` takes the
*scaled* gradients and unscales them itself, skipping non-finite steps; the scale is
``opt.dynamic_scale``.

Every difference in loss scaling between the two Kerases is handled here; which Keras runs
is read in one place, ``app.precision.keras_version``.  Neither optimizer counts the steps
it skipped: ``step_skipped`` reads each step's decision from its loss-scale state, and the
step statistics (``app.training.step_stats``) count them.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import tensorflow as tf

from app.core.catalog import DEFAULT_INITIAL_LOSS_SCALE
from app.precision import finite
from app.precision.keras_version import IS_KERAS3, KERAS_MAJOR  # noqa: F401  (re-exported)

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


def wrap_optimizer(opt, policy: str, initial_scale: float = DEFAULT_INITIAL_LOSS_SCALE,
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


def set_loss_scale(opt, value: float) -> None:
    """Set a dynamic LossScaleOptimizer's scale to ``value`` and its count of finite steps
    to 0 (as a step that changed the scale leaves it): the sentinel puts back the scale a
    faulty step ran with, which the poisoned steps after it halved
    (``app.training.sentinel``).  Between steps, outside any tf.function."""
    if IS_KERAS3:
        scale, counter = opt.dynamic_scale, opt.step_counter
    else:   # Keras 2: the scale's variable lives in its dynamic loss-scale state
        scale, counter = opt._loss_scale.current_loss_scale, opt.dynamic_counter
    scale.assign(tf.cast(value, scale.dtype))
    counter.assign(tf.zeros_like(tf.convert_to_tensor(counter)))


def multi_replica_context():
    """The replica context when several replicas train in sync, else None."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return None
    return ctx


def strategy_replica_context():
    """The replica context of a distribution strategy, with one replica or several (a
    MirroredStrategy over one device; a MultiWorkerMirroredStrategy of one worker); None
    outside one.  Under such a strategy Keras 2's ``apply_gradients`` synchronises
    (``merge_call``) even for one replica, which TensorFlow refuses inside a replica's
    ``tf.cond``: an update behind a cond is taken in the cross-replica context there."""
    if not tf.distribute.has_strategy():
        return None
    return tf.distribute.get_replica_context()


def agreed(ok):
    """Several replicas: True only where every replica's ``ok`` is (one scalar all-reduce);
    ``ok`` itself with one replica."""
    return agreed_all(ok)[0]


def agreed_all(*oks) -> list:
    """Several replicas: each of ``oks`` True only where it is on every replica, all in one
    all-reduce of a vector (a collective is a sync point between the replicas: one a step,
    not one per value); ``oks`` themselves with one replica."""
    ctx = multi_replica_context()
    if ctx is None:
        return list(oks)
    bad = ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                         tf.cast(tf.logical_not(tf.stack(oks)), tf.float32))
    return tf.unstack(tf.equal(bad, 0.0), num=len(oks))


def poisoned(grads, poison):
    """``grads`` with NaN in one dense gradient when ``poison``: a LossScaleOptimizer, which
    checks every gradient, then skips the step (and lowers the scale).  The smallest dense
    gradient takes it (a bias, usually): one small op, not a pass over a kernel's gradient
    on the way to the update."""
    dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
    if not dense:
        return list(grads)
    target = min(dense, key=lambda i: _static_size(grads[i]))
    out = list(grads)
    g = out[target]
    out[target] = g + tf.cast(tf.where(poison, float("nan"), 0.0), g.dtype)
    return out


def _static_size(t) -> float:
    """Elements of ``t`` as far as its static shape tells (unknown: the largest)."""
    shape = t.shape
    if shape.rank is None or not shape.is_fully_defined():
        return float("inf")
    return float(shape.num_elements())


def agree_on_nonfinite(grads):
    """Several replicas: if any replica's gradients are non-finite, make every replica's
    non-finite, so that all of them skip the step together.

    Keras 3's LossScaleOptimizer (TF backend) checks each replica's *own* gradients before
    the all-reduce, so without this one replica could apply a step that another skips (a
    hang in the all-reduce, or NaN weights).  Keras 2's aggregates first.  Costs one sum of
    the gradients (``sum_finite``) and one scalar all-reduce per step."""
    if multi_replica_context() is None:
        return grads
    return poisoned(grads, tf.logical_not(agreed(finite.sum_finite(grads))))


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


def global_norm(grads) -> tf.Tensor:
    grads = [tf.cast(g, tf.float32) for g in grads if g is not None]
    return tf.linalg.global_norm(grads)


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


def apply_path(opt, variables):
    """How the custom step hands ``opt`` one update of gradients it accumulated
    (``app.training.accumulate``): (``apply(grads)``, ``scale_in``, ``scale_out``), the
    gradients of the scaled loss being the true ones times ``scale_in()`` and ``apply``
    taking them times ``scale_out()`` (None: 1).

    A LossScaleOptimizer takes the group's mean scaled, and unscales it by its own path, as
    it would a plain step's gradients: Keras 3's ``apply`` unscales inside; Keras 2's
    ``apply_gradients`` takes unscaled gradients, made by its ``get_unscaled_gradients``.
    Keras 2 records that call, and an ``apply_gradients`` traced after ``get_scaled_loss``
    without it logs "You forgot to call LossScaleOptimizer.get_unscaled_gradients()" (the
    accumulation's own division by the scale misled it so).  A scale that is a power of two
    (the default initial scale, 2**15, halved or doubled) scales the mean up and down again
    without changing a bit; another initial scale may move its last bit, as Keras' own
    unscaling of a plain step does."""
    variables = list(variables)
    if not is_loss_scaled(opt):
        return (lambda g: opt.apply_gradients(zip(g, variables))), None, None

    def scale():
        return current_loss_scale(opt)
    if IS_KERAS3:
        return (lambda g: opt.apply(agree_on_nonfinite(g), variables)), scale, scale

    def apply_unscaled(scaled_grads):
        opt.apply_gradients(zip(opt.get_unscaled_gradients(scaled_grads), variables))
    return apply_unscaled, scale, scale
