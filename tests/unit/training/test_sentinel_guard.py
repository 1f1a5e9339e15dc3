"""The unscaled guard (float32) step by step: a fault never reaches the weights, nor does any
update after it, and the latch and the stash keep the first fault's step, kind and batch."""
import numpy as np
import tensorflow as tf

from app.training.sentinel import SentinelState
from app.training.step_stats import StepStats


def _guarded():
    w = tf.Variable([1.0, 2.0])
    opt = tf.keras.optimizers.SGD(0.5)
    stats = StepStats()
    spec = (tf.TensorSpec([2], tf.float32), tf.TensorSpec([2], tf.float32))
    state = SentinelState(stats, spec, batch_size=2)

    @tf.function
    def step(x, grad, loss):
        state.guard(opt, [grad], loss, (x, grad), lambda g: opt.apply_gradients(zip(g, [w])))
        stats.steps.assign_add(1)
    return w, state, step


def _run(step, x, grad, loss):
    step(tf.constant(x, tf.float32), tf.constant(grad, tf.float32), tf.constant(loss, tf.float32))


def test_a_nan_gradient_is_latched_and_no_update_lands_after_it():
    w, state, step = _guarded()
    _run(step, [1, 1], [1, 1], 0.5)                    # step 1: applied
    np.testing.assert_allclose(w.numpy(), [0.5, 1.5])
    _run(step, [2, 2], [np.nan, 1], 0.5)               # step 2: a gradient's fault
    _run(step, [3, 3], [1, 1], 0.5)                    # step 3: finite, and skipped
    np.testing.assert_allclose(w.numpy(), [0.5, 1.5])
    assert state.latched()
    c = state.counters()
    assert (c.fault_step, c.fault_code) == (2, 2)
    (x, g), = state.batches()                          # the fault's batch, not a later one
    np.testing.assert_array_equal(x.numpy(), [2, 2])


def test_a_non_finite_loss_is_a_forward_fault_even_with_finite_gradients():
    w, state, step = _guarded()
    _run(step, [4, 4], [1, 1], np.inf)
    np.testing.assert_allclose(w.numpy(), [1.0, 2.0])
    c = state.counters()
    assert (c.fault_step, c.fault_code) == (1, 1)
    np.testing.assert_array_equal(state.batches()[0][0].numpy(), [4, 4])


def test_ordinary_steps_latch_and_stash_nothing():
    w, state, step = _guarded()
    for _ in range(3):
        _run(step, [1, 1], [0.1, 0.1], 0.5)
    np.testing.assert_allclose(w.numpy(), [0.85, 1.85], rtol=1e-6)
    assert not state.latched() and state.batches() == []
