"""The Keras 2 / Keras 3 loss-scaling seam, exercised through its own functions."""
import numpy as np
import pytest
import tensorflow as tf

from app import loss_scale, precision
from app.models import build_model


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_no_loss_scaling_without_float16(policy):
    opt = loss_scale.wrap_optimizer(tf.keras.optimizers.Adam(), policy)
    assert not loss_scale.is_loss_scaled(opt)
    assert float(loss_scale.current_loss_scale(opt)) == 1.0
    assert float(loss_scale.scale_loss(opt, tf.constant(2.0))) == 2.0


def test_float16_is_wrapped_with_a_dynamic_scale():
    opt = loss_scale.wrap_optimizer(tf.keras.optimizers.Adam(), "mixed_float16", initial_scale=1024)
    assert loss_scale.is_loss_scaled(opt)
    assert float(loss_scale.current_loss_scale(opt)) == 1024.0
    assert float(loss_scale.scale_loss(opt, tf.constant(2.0))) == 2048.0


def test_overflow_lowers_the_scale_skips_the_step_then_recovers():
    """A huge first scale overflows float16 gradients: the step is skipped (weights
    unchanged), the scale falls, and once it is low enough the weights move again."""
    precision.apply_policy("mixed_float16")
    model = build_model("mlp", (16,), 3)
    opt = loss_scale.wrap_optimizer(tf.keras.optimizers.SGD(0.1), "mixed_float16",
                                    initial_scale=2.0 ** 40)
    loss_scale.build_optimizer(opt, model.trainable_variables)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
    x = tf.constant(np.random.default_rng(0).uniform(size=(8, 16)), tf.float32)
    y = tf.constant([0, 1, 2, 0, 1, 2, 0, 1])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            scaled = loss_scale.scale_loss(opt, loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        _, finite = loss_scale.unscale_and_apply(opt, grads, model.trainable_variables)
        return finite

    before = model.get_layer("logits").kernel.numpy().copy()
    assert not bool(step())                                  # overflow
    assert np.array_equal(before, model.get_layer("logits").kernel.numpy())  # skipped
    assert float(loss_scale.current_loss_scale(opt)) == 2.0 ** 39          # halved
    finites = [bool(step()) for _ in range(40)]
    assert finites[-1]                                       # recovered
    assert float(loss_scale.current_loss_scale(opt)) < 2.0 ** 20
    assert not np.array_equal(before, model.get_layer("logits").kernel.numpy())


def test_step_stats_see_fit_gradients():
    precision.apply_policy("float32")
    model = build_model("mlp", (16,), 3)
    opt = tf.keras.optimizers.Adam()
    probe = loss_scale.StepStats()
    probe.attach_to(opt)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    x = np.random.default_rng(0).uniform(size=(32, 16)).astype("float32")
    model.fit(x, np.arange(32) % 3, epochs=1, batch_size=16, verbose=0)
    assert float(probe.grad_norm.numpy()) > 0
    assert int(probe.nonfinite_total.numpy()) == 0
    assert int(probe.steps.numpy()) == 2
