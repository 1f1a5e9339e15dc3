"""A few training steps from the same weights under float32 and under the policy.

Each run: the loss on a fixed batch (inference mode) before the steps, ``steps`` optimizer
steps (loss scaling through ``app.precision.loss_scale`` under mixed_float16, exactly as ``train``
does), then the loss on the same batch again.  The difference at the start is the
precision of the forward pass; the difference at the end adds what the steps drifted apart.
"""
from __future__ import annotations

from typing import Optional

from app.doctor.probe import finite_float

# Relative loss difference above which the runs disagree more than rounding explains.
START_TOLERANCE = {"mixed_float16": 0.02, "mixed_bfloat16": 0.05}
END_TOLERANCE = {"mixed_float16": 0.10, "mixed_bfloat16": 0.15}


def eval_loss(model, loss_fn, x, y) -> Optional[float]:
    import tensorflow as tf

    return finite_float(tf.reduce_mean(loss_fn(y, model(x, training=False))))


def train_steps(model, loss_fn, optimizer, step, batches, policy: str, x_eval, y_eval) -> dict:
    """Run ``len(batches)`` steps on ``batches`` ((x, y) or (x, y, sample_weight));
    ``step(x, y, scale[, sample_weight])`` -> (loss, gradients of loss*scale).

    Watched as the sentinel watches training (``app.numerics.rules``): a step whose loss is
    not finite, or without loss scaling whose gradients are not, or ``FLOOR_PATIENCE``
    skipped in a row at the loss scale's floor, stops the run before it reaches the
    weights; ``fault`` then holds the rule's fault and the batch, for the replay."""
    import tensorflow as tf

    from app.core.signals import interrupt_point
    from app.numerics import rules
    from app.precision import loss_scale

    if not loss_scale.is_loss_scaled(optimizer):
        optimizer = loss_scale.wrap_optimizer(optimizer, policy)
    variables = model.trainable_variables
    loss_scale.build_optimizer(optimizer, variables)
    start = eval_loss(model, loss_fn, x_eval, y_eval)
    losses, skipped, at_floor, run_start, fault = [], 0, 0, 0, None
    previous_skipped = False
    for i, batch in enumerate(batches, start=1):
        interrupt_point()   # a Ctrl-C held while the last step ran the model's Python code
        # The scale from the optimizer's own scaling call (1 x the scale): Keras 2's
        # LossScaleOptimizer then knows the loss was scaled, where it warned "You forgot to
        # call LossScaleOptimizer.get_scaled_loss()" at every apply of `check --steps`.
        scaled_one = loss_scale.scale_loss(optimizer, tf.constant(1.0))
        scale = float(scaled_one)
        loss, grads = step(*batch[:2], scaled_one, *batch[2:])
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        kind = _faulty(loss, [g for g, _ in pairs], optimizer)
        if kind is not None:
            fault = {"fault": rules.Fault(kind, i, rules.headline(
                kind, policy=policy, loss_scaled=loss_scale.is_loss_scaled(optimizer)), scale),
                     "batch": batch}
            losses.append(finite_float(loss))
            break
        applied = loss_scale.unscale_and_apply(optimizer, [g for g, _ in pairs],
                                               [v for _, v in pairs])
        was_skipped = applied.skipped is not None and bool(applied.skipped)
        skipped += int(was_skipped)
        if was_skipped and not previous_skipped:
            run_start = i
        previous_skipped = was_skipped
        at_floor = at_floor + 1 if was_skipped and scale <= rules.FLOOR else 0
        losses.append(finite_float(loss))
        if at_floor >= rules.FLOOR_PATIENCE:
            fault = {"fault": rules.Fault("floor", i, rules.headline("floor", run_start=run_start),
                                          scale), "batch": batch}
            break
    end = eval_loss(model, loss_fn, x_eval, y_eval)
    return {"start": start, "end": end, "train_losses": losses, "skipped_steps": skipped,
            "fault": fault}


def _faulty(loss, grads, optimizer) -> Optional[str]:
    from app.doctor.probe import grads_are_finite
    from app.precision import loss_scale

    if finite_float(loss) is None:
        return "forward"
    if not loss_scale.is_loss_scaled(optimizer) and not grads_are_finite(grads):
        return "gradients"
    return None



def relative(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None:
        return None
    return abs(a - b) / max(abs(a), 1e-6)
