"""The sentinel's replay leaves the model's state as the fault left it."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from app.numerics import replay, rules
from app.precision import policy as precision
from app.task import model_layers


def test_the_replay_puts_back_the_batchnorm_statistics_it_moved():
    """Both passes run with training=True; an overflowing batch would write inf and NaN
    into BatchNormalization's moving statistics, and the model the user examines after
    the report would no longer be the one that failed."""
    precision.apply_policy("mixed_float16")
    try:
        inputs = tf.keras.Input((8,))
        x = tf.keras.layers.Dense(16, name="wide")(inputs)
        x = tf.keras.layers.BatchNormalization(name="norm")(x)
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(3, dtype="float32")(x))
        before = [v.numpy().copy() for v in model.non_trainable_variables]
        x = np.full((4, 8), 1e6, np.float32)   # 'wide' overflows float16, not float32
        y = np.zeros((4,), np.int64)
        fault = rules.Fault("forward", 1, "the loss was not finite", 32768.0)
        diag = replay.diagnose(model, tf.keras.losses.SparseCategoricalCrossentropy(
                                   from_logits=True, reduction="none"),
                               model_layers.walk(model), (x, y),
                               replay.FailedStep(fault, 1, 0, "mixed_float16", "default"))
    finally:
        precision.apply_policy("float32")
    assert diag.verdict == "precision" and "wide" in diag.where.text()
    assert len(before) == 2   # the moving mean and variance
    for kept, var in zip(before, model.non_trainable_variables):
        np.testing.assert_array_equal(var.numpy(), kept)
