"""The Keras 2 / Keras 3 loss-scaling seam, exercised through its own functions."""
import numpy as np
import pytest
import tensorflow as tf

from app.precision import loss_scale
from app.precision import policy as precision
from app.task.models import build_model
from app.training import step_stats


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
        return loss_scale.unscale_and_apply(opt, grads, model.trainable_variables).skipped

    before = model.get_layer("logits").kernel.numpy().copy()
    assert bool(step())                                      # overflow: skipped
    assert np.array_equal(before, model.get_layer("logits").kernel.numpy())  # weights kept
    assert float(loss_scale.current_loss_scale(opt)) == 2.0 ** 39          # halved
    skips = [bool(step()) for _ in range(40)]
    assert not skips[-1]                                     # recovered
    # every skip halved the scale once, and nothing else changed it (growth needs 2000)
    assert float(loss_scale.current_loss_scale(opt)) == 2.0 ** (39 - sum(skips))
    assert float(loss_scale.current_loss_scale(opt)) < 2.0 ** 20
    assert not np.array_equal(before, model.get_layer("logits").kernel.numpy())


def test_step_stats_see_fit_gradients():
    precision.apply_policy("float32")
    model = build_model("mlp", (16,), 3)
    opt = tf.keras.optimizers.Adam()
    probe = step_stats.StepStats()
    probe.attach_to(opt)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    x = np.random.default_rng(0).uniform(size=(32, 16)).astype("float32")
    model.fit(x, np.arange(32) % 3, epochs=1, batch_size=16, verbose=0)
    assert float(probe.grad_norm.numpy()) > 0
    assert int(probe.nonfinite_total.numpy()) == 0
    assert int(probe.steps.numpy()) == 2


def test_step_stats_log_a_row_every_n_steps_into_a_ring():
    stats = step_stats.StepStats(log_every=2, capacity=3)
    grads = [tf.constant([1.0, 2.0]), tf.constant([2.0])]          # global norm 3

    @tf.function
    def step():
        stats.record(grads, loss=lambda: tf.constant(0.5), loss_scale=lambda: tf.constant(4.0))

    for _ in range(5):
        step()
    rows, count, lost = stats.read_log(0)
    assert (count, lost) == (2, 0) and [r["step"] for r in rows] == [2, 4]
    assert rows[0] == {"step": 2, "loss": 0.5, "grad_norm": pytest.approx(3.0),
                       "loss_scale": 4.0, "skipped_steps": 0}
    assert int(stats.steps.numpy()) == 5
    for _ in range(5):                      # steps 6..10: three more rows, the ring is full
        step()
    rows, count, lost = stats.read_log(2)
    assert (count, lost) == (5, 0) and [r["step"] for r in rows] == [6, 8, 10]
    for _ in range(8):                      # four more rows: the oldest unread one is gone
        step()
    rows, count, lost = stats.read_log(5)
    assert (count, lost) == (9, 1) and [r["step"] for r in rows] == [14, 16, 18]


def test_step_stats_count_skipped_steps_every_step():
    stats = step_stats.StepStats(log_every=100)
    grads = [tf.constant([1.0, 2.0])]
    for skipped in (True, True, False, True):
        stats.record(grads, skipped=tf.constant(skipped))
    assert int(stats.nonfinite_total.numpy()) == 3
    assert int(stats.consecutive.numpy()) == 1 and int(stats.max_consecutive.numpy()) == 2
    assert int(stats.log_count.numpy()) == 0             # no logging step yet


@pytest.mark.parametrize("bad", ["norm", "loss"])
def test_without_loss_scaling_a_logging_step_counts_a_non_finite_norm_or_loss(bad):
    """Nothing is skipped without loss scaling, and ordinary steps look at nothing; a
    logging step whose gradient norm or running loss is non-finite counts once."""
    stats = step_stats.StepStats(log_every=2)
    fine, nan = [tf.constant([3.0, 4.0])], [tf.constant([1.0, float("nan")])]
    loss = [0.5]
    for _ in range(2):
        stats.record(fine, loss=lambda: tf.constant(loss[0]))
    assert int(stats.nonfinite_total.numpy()) == 0
    stats.record(nan if bad == "norm" else fine, loss=lambda: tf.constant(loss[0]))
    assert int(stats.nonfinite_total.numpy()) == 0         # not a logging step: not looked at
    if bad == "loss":
        loss[0] = float("inf")
    stats.record(nan if bad == "norm" else fine, loss=lambda: tf.constant(loss[0]))
    assert int(stats.nonfinite_total.numpy()) == 1
    rows, _, _ = stats.read_log(0)
    assert [r["skipped_steps"] for r in rows] == [0, 1]


def test_step_skipped_reads_the_optimizer_decision_in_fit():
    """Under mixed_float16, fit's LossScaleOptimizer skips overflowing steps; the stats
    attached to it count exactly the steps that halved the scale."""
    precision.apply_policy("mixed_float16")
    try:
        model = build_model("mlp", (16,), 3)
        opt = loss_scale.wrap_optimizer(tf.keras.optimizers.SGD(0.01), "mixed_float16",
                                        initial_scale=2.0 ** 24)
        loss_scale.build_optimizer(opt, model.trainable_variables)
        stats = step_stats.StepStats(log_every=4)
        stats.attach_to(opt)
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
        x = np.random.default_rng(0).uniform(size=(320, 16)).astype("float32")
        model.fit(x, np.arange(320) % 3, epochs=1, batch_size=8, verbose=0)
    finally:
        precision.apply_policy("float32")
    skipped = int(stats.nonfinite_total.numpy())
    assert 1 <= skipped < 40 and int(stats.steps.numpy()) == 40
    assert float(loss_scale.current_loss_scale(opt)) == 2.0 ** (24 - skipped)
