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
    """Run ``len(batches)`` steps; ``step(x, y, scale)`` -> (loss, gradients of loss*scale)."""
    from app.precision import loss_scale

    if not loss_scale.is_loss_scaled(optimizer):
        optimizer = loss_scale.wrap_optimizer(optimizer, policy)
    variables = model.trainable_variables
    loss_scale.build_optimizer(optimizer, variables)
    start = eval_loss(model, loss_fn, x_eval, y_eval)
    losses, skipped = [], 0
    for x, y in batches:
        scale = loss_scale.current_loss_scale(optimizer)
        loss, grads = step(x, y, scale)
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        applied = loss_scale.unscale_and_apply(optimizer, [g for g, _ in pairs],
                                               [v for _, v in pairs])
        skipped += int(applied.skipped is not None and bool(applied.skipped))
        losses.append(finite_float(loss))
    end = eval_loss(model, loss_fn, x_eval, y_eval)
    return {"start": start, "end": end, "train_losses": losses, "skipped_steps": skipped}


def relative(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None:
        return None
    return abs(a - b) / max(abs(a), 1e-6)
