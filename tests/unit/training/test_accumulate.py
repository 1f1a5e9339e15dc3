"""Gradient accumulation (app/training/accumulate.py) through the steps both loops run:
the custom loop's ``accumulated_train_step`` and fit's optimizer wrapper
(``step_stats.attach_stats_to_optimizer``), on host Keras 3 and the image's Keras 2.

Equivalence: N micro-batches of b give the update one batch of all their samples gives.
Stated tolerance: weights equal within rtol 1e-5, atol 1e-6 (float32 sums in another order).
"""
import logging

import numpy as np
import pytest
import tensorflow as tf

from app.precision import loss_scale
from app.precision import policy as precision
from app.training import step
from app.training.accumulate import Accumulator
from app.training.step_stats import StepStats

RTOL, ATOL = 1e-5, 1e-6
MICRO, SAMPLES = 8, 20          # micro-batches of 8, 8 and 4: an uneven last group of 3


def _data(n=SAMPLES, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype("float32"), (np.arange(n) % 3).astype("int32")


def _model():
    tf.keras.utils.set_random_seed(1)
    inputs = tf.keras.Input(shape=(6,))
    x = tf.keras.layers.Dense(16, activation="tanh")(inputs)
    out = tf.keras.layers.Activation("softmax", dtype="float32")(tf.keras.layers.Dense(3)(x))
    return tf.keras.Model(inputs, out)


def _per_example(y, p):
    return tf.keras.losses.sparse_categorical_crossentropy(y, p)


def _optimizer(kind, policy="float32", **lso):
    # Adam's first update is lr * g / (|g| + epsilon): a large epsilon keeps it sensitive to
    # the gradient's size, not only its sign.
    opt = (tf.keras.optimizers.SGD(0.5) if kind == "sgd"
           else tf.keras.optimizers.Adam(0.05, epsilon=0.05))
    return loss_scale.wrap_optimizer(opt, policy, **lso)


def _custom_steps(model, opt, n, per_epoch):
    loss_scale.build_optimizer(opt, model.trainable_variables)
    acc = Accumulator(model.trainable_variables, n, per_epoch, tf.distribute.get_strategy())
    stats = StepStats()

    @tf.function
    def micro(x, y):
        def record(grads, skipped, update):
            stats.record(grads, skipped, None, update=update)
        step.accumulated_train_step(model, _per_example, opt, x, y, acc, record=record)
    return micro, stats


def _custom_accumulated(kind, n=3):
    x, y = _data()
    model, opt = _model(), _optimizer(kind)
    micro, stats = _custom_steps(model, opt, n, -(-SAMPLES // MICRO))
    for i in range(0, SAMPLES, MICRO):
        micro(x[i:i + MICRO], y[i:i + MICRO])
    assert int(stats.steps.numpy()) == 1 and int(opt.iterations.numpy()) == 1
    return model.get_weights()


def _custom_plain(kind):
    x, y = _data()
    model, opt = _model(), _optimizer(kind)
    loss_scale.build_optimizer(opt, model.trainable_variables)
    tf.function(lambda a, b: step.train_step(model, _per_example, opt, a, b)[0].loss)(x, y)
    return model.get_weights()


def _fit(kind, batch, accumulate=None, per_call=1, jit=False):
    x, y = _data()
    model, opt = _model(), _optimizer(kind)
    stats = StepStats()
    if accumulate:
        acc = Accumulator(model.trainable_variables, accumulate, -(-SAMPLES // batch),
                          tf.distribute.get_strategy())
        stats.attach_to(opt, accumulator=acc)
        acc.fit.attach(model)
    extra = {"jit_compile": True} if jit else {}
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy",
                  steps_per_execution=per_call, **extra)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    assert int(opt.iterations.numpy()) == 1
    return model.get_weights()


def _close(a, b):
    return all(np.allclose(u, v, rtol=RTOL, atol=ATOL) for u, v in zip(a, b))


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_custom_loop_micro_batches_equal_one_batch(kind):
    precision.apply_policy("float32")
    assert _close(_custom_accumulated(kind), _custom_plain(kind))


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_fit_micro_batches_equal_one_batch(kind):
    precision.apply_policy("float32")
    assert _close(_fit(kind, MICRO, accumulate=3), _fit(kind, SAMPLES))


@pytest.mark.parametrize("per_call, jit", [(3, False), (1, True)])
def test_fit_a_group_in_one_call_or_under_xla_equals_one_batch(per_call, jit):
    """As train runs fit under --accumulate on one replica (the group's micro-batches in one
    call of the train function, ``step.fit_steps_per_execution``), and under --jit."""
    precision.apply_policy("float32")
    assert _close(_fit("adam", MICRO, accumulate=3, per_call=per_call, jit=jit),
                  _fit("adam", SAMPLES))


def test_fit_runs_a_group_per_call_on_one_replica_only():
    from app.training.config import TrainConfig

    cfg = TrainConfig(accumulate=4)
    assert step.fit_steps_per_execution(cfg, 1) == 4
    assert step.fit_steps_per_execution(cfg, 2) == 1
    assert step.fit_steps_per_execution(TrainConfig(accumulate=4, steps_per_execution=8), 2) == 8
    assert step.fit_steps_per_execution(TrainConfig(), 1) == 1


def test_the_short_group_is_weighted_by_its_samples():
    """The equivalence above can fail: the unweighted mean of the three micro-batches'
    gradients (the usual hand-written accumulation) gives other weights."""
    precision.apply_policy("float32")
    x, y = _data()
    model = _model()
    grads = []
    for i in range(0, SAMPLES, MICRO):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(_per_example(y[i:i + MICRO], model(x[i:i + MICRO])))
        grads.append(tape.gradient(loss, model.trainable_variables))
    naive = [w - 0.5 * np.mean([g[j].numpy() for g in grads], axis=0)
             for j, w in enumerate(model.get_weights())]
    assert not _close(_custom_accumulated("sgd"), naive)


def _float16_groups():
    """Three groups of two micro-batches of 4; the first group's second holds a NaN."""
    x, y = _data(24, seed=3)
    x[5, 2] = np.nan
    return [[(x[i:i + 4], y[i:i + 4]) for i in (g, g + 4)] for g in (0, 8, 16)]


def _float16_runner(loop, model, opt):
    """A function training one group (two micro-batches) and its step statistics."""
    if loop == "custom":
        micro, stats = _custom_steps(model, opt, 2, 6)
        return (lambda group: [micro(x, y) for x, y in group]), stats
    stats = StepStats()
    acc = Accumulator(model.trainable_variables, 2, 2, tf.distribute.get_strategy())
    stats.attach_to(opt, accumulator=acc)
    acc.fit.attach(model)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")

    def group(batches):
        x = np.concatenate([b[0] for b in batches])
        y = np.concatenate([b[1] for b in batches])
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    return group, stats


class _Warnings(logging.Handler):
    """The warnings TensorFlow's logger gives while it is attached (that logger does not
    propagate to caplog's)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def tf_warnings():
    seen = _Warnings()
    tf.get_logger().addHandler(seen)
    try:
        yield seen.messages
    finally:
        tf.get_logger().removeHandler(seen)


@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_float16_a_non_finite_micro_batch_skips_the_whole_update(loop, tf_warnings):
    """mixed_float16: the group with a NaN micro-batch is not applied at all (its finite
    micro-batch neither), the scale falls once (not per micro-batch), and it rises again
    after the optimizer's growth steps (2 here) counted in updates, not micro-batches.
    Keras 2's LossScaleOptimizer does not warn that the gradients it applies were not
    unscaled (``get_unscaled_gradients``): they are, through its own path."""
    precision.apply_policy("mixed_float16")
    model = _model()
    opt = _optimizer("sgd", "mixed_float16", initial_scale=2.0 ** 10, growth_steps=2)
    train_group, stats = _float16_runner(loop, model, opt)
    groups = _float16_groups()
    before = [w.copy() for w in model.get_weights()]

    train_group(groups[0])
    assert not [m for m in tf_warnings if "LossScaleOptimizer" in m], tf_warnings
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert float(loss_scale.current_loss_scale(opt)) == 2.0 ** 9     # lowered once
    assert int(stats.steps.numpy()) == 1 and int(stats.nonfinite_total.numpy()) == 1

    train_group(groups[1])      # one good update: four good micro-batches would have grown it
    assert float(loss_scale.current_loss_scale(opt)) == 2.0 ** 9
    assert not any(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    train_group(groups[2])      # the second good update: the optimizer's rule raises it
    assert float(loss_scale.current_loss_scale(opt)) == 2.0 ** 10
    assert int(stats.steps.numpy()) == 3 and int(stats.nonfinite_total.numpy()) == 1
    assert all(np.isfinite(w).all() for w in model.get_weights())


def _checkpoint_values(run_dir):
    path = tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
    reader = tf.train.load_checkpoint(path)
    # Every value saved (weights, optimizer state, epoch and step) but the save count.
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)
            if "save_counter" not in name and "_CHECKPOINTABLE_OBJECT_GRAPH" not in name}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One uninterrupted run of --accumulate 2 that the resumed runs must reach."""
    from app.training.config import TrainConfig
    from app.training.job import train

    out = tmp_path_factory.mktemp("accumulate-uninterrupted")
    cfg = dict(model="mlp", dataset="synthetic", precision="float32", loop="custom", epochs=2,
               batch_size=16, max_train_samples=120, max_val_samples=32, log_every=1,
               workspace=str(out / "ws"), progress="lines", offline=True, save_model=False,
               accumulate=2)
    m = train(TrainConfig(output=str(out / "run"), **cfg))
    assert m["status"] == "completed" and m["steps"][-1]["step"] == 8   # 8 micro-batches: 4 updates
    assert m["accumulation"] == {"micro_batch": 16, "accumulate": 2, "global_batch": 32}
    return cfg, _checkpoint_values(out / "run")


@pytest.mark.parametrize("resumed_loop", ["custom", "fit"])
def test_resume_mid_group_reaches_the_uninterrupted_weights(uninterrupted, tmp_path, resumed_loop,
                                                            capsys):
    """Interrupted after the first micro-batch of the third group (epoch 1): the checkpoint
    holds two updates; --resume continues at the group's start (its sums are not saved),
    in the custom loop or in fit, and ends where the uninterrupted run ended."""
    import os
    import signal

    from app.training.config import TrainConfig
    from app.training.job import train

    cfg, expected = uninterrupted

    def stop_after_second_update(row):
        if row["step"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)   # the next micro-batch ends the run
    first = train(TrainConfig(output=str(tmp_path / "run"), **cfg),
                  on_step=stop_after_second_update)
    assert first["status"] == "interrupted"
    again = train(TrainConfig(output=str(tmp_path / "run"), resume=True,
                              **dict(cfg, loop=resumed_loop)))
    assert again["status"] == "completed"
    said = capsys.readouterr()
    assert "after 4 batch(es) of epoch 1" in said.err
    # Epoch 1's record is of its last 4 micro-batches of 8 (56 of 120 samples), and says so.
    resumed = again["epochs"][0]
    assert resumed["resumed"] == {"after_batches": 4, "batches": 8, "train_samples": 56}
    assert resumed["samples_per_second"] == pytest.approx(56 / resumed["train_seconds"], rel=0.01)
    assert "resumed" not in again["epochs"][1]
    assert ("(resumed after 4 of 8 batches: loss, metrics and samples/s are of the last 4 (56 "
            "samples))") in said.out
    got = _checkpoint_values(tmp_path / "run")
    assert set(got) == set(expected)
    exact = resumed_loop == "custom"   # fit's loss is the same mean in another op order
    for name, value in expected.items():
        if exact:
            assert np.array_equal(got[name], value), name
        else:
            assert np.allclose(got[name], value, rtol=1e-4, atol=1e-5), name


def test_batchnormalization_is_said_once_and_groups_follow_the_epoch(capsys):
    """BatchNormalization's statistics stay per micro-batch: one console line says so (none
    for a model without it); 100 samples in micro-batches of 32 are 4, one update of 4."""
    from types import SimpleNamespace

    from app.training import accumulate

    def model(bn):
        inputs = tf.keras.Input((4,))
        x = tf.keras.layers.BatchNormalization()(inputs) if bn else inputs
        return tf.keras.Model(inputs, tf.keras.layers.Dense(2)(x))
    run = SimpleNamespace(config=SimpleNamespace(accumulate=4, global_batch=128),
                          dist=SimpleNamespace(global_batch=32, replicas=1),
                          bundle=SimpleNamespace(train_samples=100))
    acc = accumulate.for_run(run, model(True), tf.distribute.get_strategy())
    err = capsys.readouterr().err
    assert err.count("BatchNormalization") == 1
    assert "per micro-batch of 32, not over the global batch of 128" in err
    assert (acc.every, acc.per_epoch, acc.updates_per_epoch()) == (4, 4, 1)
    accumulate.for_run(run, model(False), tf.distribute.get_strategy())
    assert "BatchNormalization" not in capsys.readouterr().err
    assert accumulate.trained_in_epoch(run, 0, 0) == 0
