"""One real forward and backward step on one batch under the policy.

``capture`` records each layer's output dtype (and whether it is finite) during an eager
forward pass, for every model form: functional, Sequential, subclassed and nested, through
the sentinel's tap (``app.numerics.tap``), which leaves the model as it was.

``gradient_fn`` computes the loss and the gradients of ``loss * scale``.  On a machine
without a GPU, float16 gradients of convolutions are about 100 times slower in TensorFlow's
CPU kernels than in float32 (measured here: 90 s for one step of the built-in residual CNN
at batch 32), so there the step is compiled with XLA (under a second); a model XLA cannot
compile falls back to plain TensorFlow.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, Optional

from app.doctor.layers import dtype_name
from app.core.catalog import DEFAULT_INITIAL_LOSS_SCALE

MAX_HALVINGS = 10


@contextlib.contextmanager
def capture(entries):
    """Yields {id(layer): {"dtype", "finite", "order", "path"}}, filled from the numerics
    tap (``app.numerics.tap``, the sentinel's) when the forward passes inside are done."""
    import tensorflow as tf

    from app.numerics.tap import Tap

    captured: Dict[int, dict] = {}
    with Tap(entries) as tap, tap.recording() as calls:
        try:
            yield captured
        finally:
            for c in calls:
                if id(c.layer) in captured:
                    continue
                finite = None
                if c.outputs and all(hasattr(t, "numpy") for t in c.outputs):   # eager values
                    finite = bool(all(bool(tf.reduce_all(tf.math.is_finite(t)))
                                      for t in c.outputs))
                captured[id(c.layer)] = {"path": c.path, "order": len(captured),
                                         "dtype": _first_dtype(c), "finite": finite}


def _first_dtype(call) -> Optional[str]:
    return dtype_name(getattr(call.outputs[0], "dtype", None)) if call.outputs else None


def model_outputs(model, prediction, captured, entries) -> List[tuple]:
    """[(dtype name, producing layer or None)] for each output of the model."""
    import tensorflow as tf

    outs = []
    symbolic = None
    try:
        symbolic = list(model.outputs) if getattr(model, "outputs", None) else None
    except (AttributeError, ValueError):
        symbolic = None
    if symbolic:
        # The dtypes of the real call: the symbolic outputs keep those of the layers as
        # built, before --float32-layers set some of them to float32.
        real = tf.nest.flatten(prediction) if prediction is not None else []
        if len(real) != len(symbolic):
            real = [None] * len(symbolic)
        for t, r in zip(symbolic, real):
            history = getattr(t, "_keras_history", None)
            layer = history[0] if history else None
            outs.append((dtype_name(getattr(r, "dtype", None) or t.dtype), layer))
        return outs
    by_id = {id(l): l for _, l, _ in entries}
    last = max(captured.items(), key=lambda kv: kv[1]["order"], default=None)
    # The layer that returned last is (nearly always) the one whose result the model returns.
    last_layer = by_id.get(last[0]) if last else None
    if prediction is None:
        return outs
    for t in tf.nest.flatten(prediction):
        outs.append((dtype_name(t.dtype), last_layer))
    return outs


def gradient_fn(model, loss_fn, jit: bool):
    """(x, y, scale[, sample_weight]) -> (loss, gradients of loss*scale) for the trainable
    variables: training's own forward and backward (``app.training.step``) at a scale the
    probe chooses."""
    import tensorflow as tf

    from app.training.step import forward_backward

    def grads(x, y, scale, sample_weight=None):
        out = forward_backward(model, loss_fn, x, y, lambda loss: loss * tf.cast(scale, loss.dtype),
                               sample_weight)
        return out.loss, out.grads
    if not jit:
        return grads
    compiled = tf.function(grads, jit_compile=True)
    state = {"fn": compiled}

    def call(x, y, scale, sample_weight=None):
        try:
            return state["fn"](x, y, scale, sample_weight)
        except Exception as exc:
            if state["fn"] is grads or _is_python_error(exc):
                raise
            state["fn"] = grads   # XLA cannot compile this model: plain TensorFlow
            return grads(x, y, scale, sample_weight)
    call.fallback = lambda: state["fn"] is grads
    return call


def _is_python_error(exc) -> bool:
    """A TypeError/ValueError raised while tracing is the user's code (or a dtype clash),
    not XLA refusing an op; it must surface, not be retried."""
    return type(exc).__name__ in ("TypeError", "ValueError", "AttributeError", "NameError")


def grads_are_finite(grads) -> bool:
    """Every gradient finite, as a Python bool (eager; ``finite.all_finite`` is the
    in-graph tensor)."""
    import tensorflow as tf

    return all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in grads if g is not None)


def zero_share(grads) -> Optional[float]:
    import numpy as np

    total = zeros = 0
    for g in grads:
        if g is None:
            continue
        a = np.asarray(g)
        total += a.size
        zeros += int(np.count_nonzero(a == 0))
    return zeros / total if total else None


def nonfinite_variable_owner(grads, variables, entries) -> Optional[str]:
    """The layer owning the first variable whose gradient is not finite."""
    import tensorflow as tf

    owner = {}
    for path, layer, _ in entries:
        for w in getattr(layer, "weights", []) or []:
            owner.setdefault(id(w), path)
    for g, v in zip(grads, variables):
        if g is not None and not bool(tf.reduce_all(tf.math.is_finite(g))):
            return owner.get(id(v), getattr(v, "name", None))
    return None


def probe_gradients(step, x, y, policy: str) -> dict:
    """Unscaled gradients, then (mixed_float16) scaled ones from 2**15, halving on overflow
    as the dynamic LossScaleOptimizer does.  Returns the numbers and the gradients."""
    import tensorflow as tf

    loss, g1 = step(x, y, tf.constant(1.0))
    out = {"loss_in_step": finite_float(loss), "zero_share_unscaled": None, "zero_share_scaled": None,
           "loss_scale": None, "unscaled_finite": grads_are_finite(g1), "scaled_finite": None,
           "grads": g1}
    if policy != "mixed_float16":
        out["gradients_finite"] = out["unscaled_finite"]
        return out
    out["zero_share_unscaled"] = zero_share(g1)
    scale = DEFAULT_INITIAL_LOSS_SCALE   # what train's LossScaleOptimizer starts with
    for _ in range(MAX_HALVINGS + 1):
        _, gs = step(x, y, tf.constant(scale))
        if grads_are_finite(gs):
            out.update(scaled_finite=True, loss_scale=scale, zero_share_scaled=zero_share(gs))
            break
        scale /= 2.0
    else:
        out.update(scaled_finite=False, loss_scale=scale * 2.0)
    out["gradients_finite"] = bool(out["unscaled_finite"] or out["scaled_finite"])
    return out


def finite_float(v) -> Optional[float]:
    import math

    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None
