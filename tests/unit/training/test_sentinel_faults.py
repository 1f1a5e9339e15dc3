"""The numerics sentinel's catalog of faults: each stays hidden at step 1 and shows later, and
the sentinel must name where it began (the exact layer, the input samples, the loss or the
optimizer) and whether float32 would fail too.  Tiny models, in-process ``app.train``, both
loops; runs on the host (Keras 3) and in the image's self-test (TF 2.9, Keras 2), where
mixed_float16 runs on the CPU (slowly: hence the tiny models).  docs/numerics.md."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import app
from tests.unit.helpers import ONCE_IN_THE_IMAGE

N, FEATURES = 512, 8
LOOPS = ["fit", "custom"]


# ---- the faults' layers ------------------------------------------------------------------

class Amplify(tf.keras.layers.Layer):
    """Multiplies by ``start`` times a factor that grows by ``rate`` with every training
    call, up to ``most``: an activation that grows during training past float16's limit
    (after ~29 calls), then stays where float32 holds it and float16 gradients can follow."""

    def __init__(self, rate=1.25, start=100.0, most=2000.0, **kwargs):
        super().__init__(**kwargs)
        self.rate, self.start, self.most = rate, start, most

    def build(self, shape):
        self.k = self.add_weight(name="k", shape=(), trainable=False,
                                 initializer=tf.keras.initializers.Constant(1.0))

    def call(self, x, training=None):
        if training:
            self.k.assign(tf.minimum(tf.cast(self.k, tf.float32) * self.rate, self.most))
        return x * tf.cast(tf.cast(self.k, tf.float32) * self.start, x.dtype)


class RMSNorm(tf.keras.layers.Layer):
    """x / sqrt(mean(x^2) + epsilon): epsilon 1e-12 is 0 in float16, so a blank sample is 0/0."""

    def __init__(self, epsilon=1e-12, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def call(self, x):
        mean_square = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True)
        return x / tf.sqrt(mean_square + tf.cast(self.epsilon, x.dtype))


class CenteredNorm(tf.keras.layers.Layer):
    """(x - mean) / sqrt(var + 1e-8), the epsilon written inline: 0 in float16, so a blank
    sample is 0/0 while every value going in is modest."""

    def call(self, x):
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        var = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
        return (x - mean) / tf.sqrt(var + self.eps(x.dtype))

    def eps(self, dtype):
        return tf.cast(1e-8, dtype)


class CenteredNormAttribute(CenteredNorm):
    """The same, its epsilon an attribute."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = 1e-8

    def eps(self, dtype):
        return tf.cast(self.epsilon, dtype)


class ExpFeatures(tf.keras.layers.Layer):
    def call(self, x):
        return tf.exp(x)


class GrowingDense(tf.keras.layers.Dense):
    """A Dense whose kernel is scaled by a factor that grows with every training call: logits
    that grow until a softmax computed in 16 bits sees inf."""

    def build(self, shape):
        super().build(shape)
        self.k = self.add_weight(name="growth", shape=(), trainable=False,
                                 initializer=tf.keras.initializers.Constant(1.0))

    def call(self, x, training=None):
        if training:
            self.k.assign(tf.cast(self.k, tf.float32) * 1.3)
        return self.activation(tf.matmul(x, tf.cast(self.kernel, x.dtype)
                                         * tf.cast(tf.cast(self.k, tf.float32) * 50.0, x.dtype)))


class Boost(tf.keras.layers.Layer):
    """Identity forward; its backward multiplies the gradient by 9e8, which no float16 can
    hold even unscaled: the loss scale goes down to its floor and stays skipped there."""

    def call(self, x):
        @tf.custom_gradient
        def boost(v):
            def grad(dy):
                c = tf.constant(3e4, dy.dtype)
                return dy * c * c
            return tf.identity(v), grad
        return boost(x)


class Block(tf.keras.layers.Layer):
    """A layer of a layer: the fault is in its inner ``amp``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner_dense = tf.keras.layers.Dense(16, activation="relu", name="inner_dense")
        self.amp = Amplify(name="amp")

    def call(self, x, training=None):
        return self.amp(self.inner_dense(x), training=training)


# ---- models and data ---------------------------------------------------------------------

def _model(*middle, head=None):
    def build(input_shape, num_classes):
        inp = tf.keras.Input(input_shape)
        h = inp
        for layer in middle:
            h = layer()(h)
        out = (head() if head else tf.keras.layers.Dense(
            num_classes, activation="softmax", dtype="float32", name="predictions"))(h)
        return tf.keras.Model(inp, out)
    return build


def _data(x=None, y=None):
    rng = np.random.default_rng(0)
    x = rng.random((N, FEATURES)).astype("float32") if x is None else x
    y = (x[:, :4].sum(axis=1) > x[:, 4:].sum(axis=1)).astype("int32") if y is None else y
    return (x, y), (x[:64], y[:64])


def _dense(units=16, name="hidden"):
    return lambda: tf.keras.layers.Dense(units, activation="relu", name=name)


def _train(tmp_path, build, data, loop, precision="mixed_float16", **settings):
    settings = {"epochs": 2, "batch_size": 16, "log_every": 4, "numerics_every": 8,
                "progress": "lines", "save_model": False, "seed": 0, **settings}
    return app.train(build, data, precision=precision, loop=loop,
                     output=str(tmp_path / f"run-{loop}"), **settings)


def _fault(m) -> dict:
    assert m["status"] == "diverged", m.get("diagnosis")
    fault = m["numerics"]["fault"]
    assert fault["step"] > 1, fault       # hidden at step 1
    return fault


def _with_rows(x, rows, value):
    x = x.copy()
    x[rows] = value
    return x


def _rng_x():
    return np.random.default_rng(0).random((N, FEATURES)).astype("float32")


# ---- the catalog -------------------------------------------------------------------------

@pytest.mark.parametrize("loop", LOOPS)
def test_an_activation_that_grows_past_float16(tmp_path, loop):
    m = _train(tmp_path, _model(_dense(), lambda: Amplify(name="amplify")), _data(), loop)
    f = _fault(m)
    assert f["kind"] == "forward" and f["where"]["kind"] == "layer"
    assert f["where"]["name"] == "amplify" and f["where"]["phase"] == "forward"
    assert f["verdict"] == "precision" and f["float32_finite"] is True
    assert f["flag"] == "--float32-layers amplify"
    assert f["float32_largest"] > 65504 and f["largest_before"] < 65504
    assert f["headline"].endswith("which loss scaling cannot help)"), f["headline"]
    if loop == "custom":   # probed at the step logs: warned once, before the fault
        warned = [w for w in m["numerics"]["warnings"] if w.startswith("layer 'amplify'")]
        # in app.train's words, as the fault's fix (it named the flag)
        assert len(warned) == 1 and 'float32_layers=["amplify"]' in warned[0], warned
        assert m["numerics"]["headroom"]["amplify"]["least_bits"] < 2


@pytest.mark.parametrize("loop", LOOPS)
def test_an_epsilon_that_is_zero_in_float16_meets_blank_samples(tmp_path, loop):
    x = _with_rows(_rng_x(), [200, 330, 470], 0.0)
    m = _train(tmp_path, _model(lambda: RMSNorm(name="rms_norm"), _dense()), _data(x), loop)
    f = _fault(m)
    assert f["where"]["name"] == "rms_norm" and f["verdict"] == "precision"
    assert "epsilon=1e-12 is 0 in float16" in f["fix"] and 'float32_layers=["rms_norm"]' in f["fix"]
    assert f["cause"] == "underflow"


@pytest.mark.parametrize("norm,named", [(CenteredNorm, "the constant 1e-08 in its call (an epsilon?)"),
                                        (CenteredNormAttribute, "its epsilon=1e-08")])
def test_an_epsilon_that_is_zero_in_float16_is_an_underflow_not_an_overflow(tmp_path, capsys,
                                                                           norm, named):
    """The QA pass: an inline epsilon of 1e-8 met a blank row and the report said 'values:
    ... (4.41e-05x float16's largest, 65504)' and 'keep its output in range: clip it': the
    fix for an overflow, for a 0/0."""
    x = _with_rows(_rng_x(), [200, 330, 470], 0.0)
    m = _train(tmp_path, _model(lambda: norm(name="norm"), _dense()), _data(x), "custom")
    f = _fault(m)
    assert f["where"]["name"] == "norm" and f["verdict"] == "precision"
    assert f["cause"] == "underflow" and f["inside_op"] == "RealDiv", f
    assert f["fix"].startswith(f"{named} is 0 in float16 (float16's smallest normal is "
                               "6.1e-05, its smallest subnormal 6e-08)"), f["fix"]
    # app.train's words, as its then: line's (resume=True): the keyword, not the flag
    assert 'float32_layers=["norm"]' in f["fix"] and "--float32-layers" not in f["fix"], f["fix"]
    assert "clip" not in f["fix"] and f["flag"] == "--float32-layers norm"
    err = capsys.readouterr().err
    assert '  fix: ' + f["fix"] in err and "with resume=True continues" in err
    values = next(line for line in err.splitlines() if line.startswith("  values: "))
    assert "not an overflow, but a division (RealDiv) by a value that is 0 in float16" in values
    assert "x float16's largest" not in values


@pytest.mark.parametrize("loop", LOOPS)
def test_exp_in_a_custom_layer_overflows_on_a_few_samples(tmp_path, loop):
    x = _rng_x()
    x[[150, 151, 400], 0] = 12.0          # exp(12) = 162755: past float16's 65504
    m = _train(tmp_path, _model(lambda: ExpFeatures(name="exp_features"), _dense()), _data(x), loop)
    f = _fault(m)
    assert f["where"]["name"] == "exp_features" and f["verdict"] == "precision"
    assert 1.6e5 < f["float32_largest"] < 1.7e5 and f["cause"] == "overflow"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_softmax_over_growing_logits_computed_in_16_bit(tmp_path, loop):
    head = lambda: GrowingDense(2, activation="softmax", name="predictions")  # noqa: E731
    m = _train(tmp_path, _model(_dense(), head=head), _data(), loop)
    f = _fault(m)
    assert f["where"]["name"] == "predictions" and f["where"]["dtype"] == "float16"
    assert f["verdict"] == "precision" and f["layers"] == ["predictions"]
    # its output stays under 1 in float32, what goes in is modest: the ops inside tell the
    # overflow of its matmul from a 0/0
    assert f["cause"] == "overflow" and "clip it" in f["fix"], f


class ManualSoftmax(tf.keras.layers.Layer):
    """exp(x) / sum(exp(x)) written out: its exp overflows float16 while its output stays
    under 1."""

    def call(self, x):
        e = tf.exp(x)
        return e / tf.reduce_sum(e, -1, keepdims=True)


def test_an_overflow_inside_a_layer_names_its_op_and_the_value(tmp_path, capsys):
    """The QA pass: metrics.json said cause overflow, inside_op Exp, but the values line said
    neither, and gave a ratio of the layer's output (0.25) to float16's largest."""
    def build(input_shape, num_classes):
        inp = tf.keras.Input(input_shape)
        h = tf.keras.layers.Dense(num_classes, name="logits",
                                  kernel_initializer=tf.keras.initializers.Constant(3.0))(inp)
        out = ManualSoftmax(name="smax")(h)
        return tf.keras.Model(inp, tf.keras.layers.Activation("linear", dtype="float32",
                                                              name="out")(out))
    m = _train(tmp_path, build, _data(), "fit", epochs=1)
    f = m["numerics"]["fault"]
    assert f["where"]["name"] == "smax" and f["verdict"] == "precision", f
    assert f["cause"] == "overflow" and f["inside_op"] == "Exp", f
    largest = float(np.exp(3.0 * _rng_x().sum(axis=1)).max())
    assert f["inside_float32_largest"] > 65504, f
    assert f["inside_float32_largest"] <= largest * 1.01
    values = next(line for line in capsys.readouterr().err.splitlines()
                  if line.startswith("  values: "))
    assert ("; inside the layer, Exp overflows float16: in float32 its value reaches "
            f"{f['inside_float32_largest']:.4g} (") in values, values
    assert "x float16's largest, 65504), though the layer's output in float32 reaches only " \
        in values, values


@pytest.mark.parametrize("loop", LOOPS)
def test_nan_in_a_few_samples_of_the_data(tmp_path, loop):
    x = _with_rows(_rng_x(), [97, 301], np.nan)
    m = _train(tmp_path, _model(_dense()), _data(x), loop, precision="float32")
    f = _fault(m)
    assert f["where"]["kind"] == "input samples" and f["verdict"] == "data"
    first = (f["step"] - 1 - 32 * (f["epoch"] - 1)) * 16      # the failing batch's first position
    assert f["where"]["samples"] and all(first <= s < first + 16 for s in f["where"]["samples"])
    # The rows of the user's x_train, not the shuffled positions: the samples' own (rows 97
    # and 301 are identical, all NaN with label 0, so a sample of either is both), and all.
    where = f["where"]
    assert where["data"] == "x_train" and where["rows"] == [97, 301], where
    assert (where["bad_rows"], where["bad_rows_total"]) == ([97, 301], 2)
    assert f["fix"].startswith("repair or drop rows 97, 301 of x_train: 2 of the 512 "
                               "training rows hold NaN or inf;"), f["fix"]
    assert "rows 97, 301 of x_train" in m["diagnosis"].split("; fix:")[0], m["diagnosis"]


def test_nan_in_a_tf_data_dataset_names_its_elements(tmp_path):
    """A user's own tf.data pipeline has no rows (the app shuffles it in a buffer): its
    elements that hold NaN, found in the pass that counts it at load, are named by their
    place in it."""
    x = _with_rows(_rng_x(), [97, 301], np.nan)
    (xt, yt), (xv, yv) = _data(x)
    data = (tf.data.Dataset.from_tensor_slices((xt, yt)), tf.data.Dataset.from_tensor_slices((xv, yv)))
    m = _train(tmp_path, _model(_dense()), data, "custom", precision="float32")
    f = _fault(m)
    assert f["where"]["kind"] == "input samples" and f["verdict"] == "data"
    assert (f["where"]["data"], f["where"]["rows"]) == ("the training dataset", [])
    assert (f["where"]["bad_rows"], f["where"]["bad_rows_total"]) == ([97, 301], 2)
    assert f["fix"].startswith("repair or drop elements 97, 301 of the training dataset: 2 of "
                               "the 512 training elements hold NaN or inf;"), f["fix"]


def test_nan_in_the_data_with_several_steps_a_call(tmp_path):
    """fit with --steps-per-execution 4: the skipped step's update, dead behind its pivot
    inside Keras' loop of steps, stops neither that loop nor the latch, and the report is
    the one a step a call gives."""
    x = _with_rows(_rng_x(), [97, 301], np.nan)
    m = _train(tmp_path, _model(_dense()), _data(x), "fit", precision="float32",
               steps_per_execution=4)
    f = _fault(m)
    assert f["where"]["kind"] == "input samples" and f["verdict"] == "data"
    first = (f["step"] - 1 - 32 * (f["epoch"] - 1)) * 16      # the failing batch's first position
    assert f["where"]["samples"] and all(first <= s < first + 16 for s in f["where"]["samples"])


@pytest.mark.parametrize("loop", LOOPS)
def test_nan_in_the_data_under_accumulation_names_the_update_and_its_micro_batch(tmp_path, loop):
    """--accumulate 2: the fault is latched on the update the faulty micro-batch belongs to
    (steps count updates: 16 an epoch), and the replay names samples of that micro-batch."""
    x = _with_rows(_rng_x(), [97, 301], np.nan)
    m = _train(tmp_path, _model(_dense()), _data(x), loop, precision="float32", accumulate=2)
    f = _fault(m)
    assert f["where"]["kind"] == "input samples" and f["verdict"] == "data"
    group = (f["step"] - 1 - 16 * (f["epoch"] - 1)) * 32    # the failing update's first sample
    # The epoch's order (app/task/data.py's permutation): where rows 97 and 301 came.
    keys = tf.random.stateless_uniform([N], seed=tf.constant([0, f["epoch"]], tf.int64))
    where = {int(row): p for p, row in enumerate(tf.argsort(keys, stable=True).numpy())}
    first = min(where[97], where[301])
    assert group <= first < group + 32, (f["step"], first)
    micro = [where[r] for r in (97, 301) if where[r] // 16 == first // 16]
    assert sorted(f["where"]["samples"]) == sorted(micro), (f, where[97], where[301])


def _sgd_model(lr):
    """Plain SGD on a linear hidden layer: each update multiplies the weights' scale, until
    the logits pass float32's largest value a few steps in."""
    def build(input_shape, num_classes):
        linear = lambda: tf.keras.layers.Dense(16, name="hidden")  # noqa: E731
        model = _model(linear)(input_shape, num_classes)
        model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=lr),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model
    return build


@pytest.mark.parametrize("loop", LOOPS)
def test_a_learning_rate_that_sends_the_weights_to_inf(tmp_path, loop, capsys):
    m = _train(tmp_path, _sgd_model(1e4), _data(), loop, precision="float32")
    f = _fault(m)
    assert f["verdict"] == "optimizer" and "lower --learning-rate" in f["fix"]
    assert f["float32_finite"] is False
    # The checkpoint at the fault holds the weights that grew: no resume from it.
    then = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  then:")]
    assert then == [f"  then: start the run again with the fix, with a new output= or after "
                    f"removing {str(tmp_path / f'run-{loop}')!r}: the checkpoint saved at the "
                    "fault holds the weights that grew, and resume=True would continue from "
                    "them (docs/numerics.md)"], then


def test_a_resume_from_weights_that_grew_is_the_optimizer_verdict_naming_them(tmp_path,
                                                                               capsys):
    """The QA pass: a run at learning rate 1e30 stops at the optimizer's verdict, and its
    checkpoint holds weights of 1e30; resumed at 1e-3 it failed at once, and the report
    blamed layer 'logits' (verdict model: "look in it for log(0)").  Those weights are the
    cause, whatever this run's learning rate: the optimizer's verdict, naming their size
    when the run began and as the model was built."""
    m = _train(tmp_path, _model(_dense(), head=_dense(2, "logits")), _data(), "custom",
               precision="float32", learning_rate=1e30)
    assert _fault(m)["verdict"] == "optimizer", m["numerics"]["fault"]
    capsys.readouterr()
    again = _train(tmp_path, _model(_dense(), head=_dense(2, "logits")), _data(), "custom",
                   precision="float32", learning_rate=1e-3, resume=True)
    f = _fault(again)
    assert f["verdict"] == "optimizer", f
    assert f["fix"].startswith("the weights were 1e+30 when this run began, from the "
                               "checkpoint it resumed ("), f["fix"]
    assert "no learning rate brings them back" in f["fix"], f["fix"]
    assert "start the run again with the fix" in capsys.readouterr().err


def log_weighted_ce(y_true, y_pred):
    """A class weight of log(label): log(0) = -inf for the rare class 0."""
    ce = tf.keras.losses.sparse_categorical_crossentropy(y_true, y_pred)
    weight = tf.math.log(tf.cast(tf.reshape(y_true, tf.shape(ce)), tf.float32))
    return ce * (1.0 + weight)


def _compiled_with(loss):
    def build(input_shape, num_classes):
        model = _model(_dense())(input_shape, num_classes)
        model.compile(optimizer="adam", loss=loss)
        return model
    return build


@pytest.mark.parametrize("loop,given", [("fit", "keyword"), ("custom", "compiled")])
def test_log_of_zero_in_a_custom_loss(tmp_path, loop, given, capsys):
    """The loss given as app.train's loss=, or compiled into the model: named by its name
    either way (the compiled one was "None", the QA pass's "the loss (None)")."""
    x = _rng_x()
    y = np.where(x[:, 0] > 0.5, 1, 2).astype("int32")
    y[[250, 420]] = 0
    if given == "keyword":
        m = _train(tmp_path, _model(_dense()), _data(x, y), loop, loss=log_weighted_ce,
                   num_classes=3)
    else:
        m = _train(tmp_path, _compiled_with(log_weighted_ce), _data(x, y), loop, num_classes=3)
    f = _fault(m)
    assert f["where"]["kind"] == "loss" and f["verdict"] == "model"
    assert f["where"]["name"] == "log_weighted_ce", f["where"]
    assert "  where it began: the loss (log_weighted_ce): non-finite for " in \
        capsys.readouterr().err
    assert f["float32_finite"] is False and f["where"]["samples"]
    # the samples whose loss is not finite, as rows of the data: the ones labelled 0
    assert f["where"]["data"] == "x_train" and f["where"]["rows"], f["where"]
    assert set(f["where"]["rows"]) <= {250, 420} and f["where"]["bad_rows_total"] is None


def log_weighted_ce_mean(y_true, y_pred):
    """The same, reduced by the loss itself to one value for the batch (valid Keras)."""
    return tf.reduce_mean(log_weighted_ce(y_true, y_pred))


def test_log_of_zero_in_a_loss_that_returns_a_scalar(tmp_path, capsys):
    """The QA pass: a loss that reduces itself to a scalar crashed the replay (a reshape by
    the batch's first dimension of a 0-d tensor): exit 1, a traceback, no metrics.json.  The
    loss is named as a whole: it has no per-sample values to name a sample by.  (fit only:
    the custom loop's step takes per-sample losses, tf.nn.compute_average_loss.)"""
    loop = "fit"
    x = _rng_x()
    y = np.where(x[:, 0] > 0.5, 1, 2).astype("int32")
    y[[250, 420]] = 0
    m = _train(tmp_path, _model(_dense()), _data(x, y), loop, precision="float32",
               loss=log_weighted_ce_mean, num_classes=3)
    f = _fault(m)
    assert f["where"]["kind"] == "loss" and f["verdict"] == "model", f
    assert f["where"]["name"] == "log_weighted_ce_mean" and f["where"]["whole"] is True
    # float32 has no loss scaling: no word of it
    assert f["headline"] == "the loss was not finite (a non-finite value in the forward pass)"
    assert f["where"]["samples"] == [] and f["where"]["rows"] == [], f["where"]
    err = capsys.readouterr().err
    assert ("  where it began: the loss (log_weighted_ce_mean): non-finite as a whole (it "
            "returns one value for the batch, so no sample can be named) while every layer's "
            "output is finite") in err, err[-2000:]
    assert "  fix: the loss is non-finite in float32 too" in err and "those samples" not in err
    assert (tmp_path / f"run-{loop}" / "metrics.json").exists()


def test_check_names_a_loss_that_returns_a_scalar_as_a_whole():
    """`tfmp check` replays the same way: a blocker, not a traceback."""
    def nan_mean(y_true, y_pred):
        return tf.reduce_mean(tf.math.log(y_pred * 0.0))
    report = app.check(model=_model(_dense()), data=_data(), loss=nan_mean, precision="float32",
                       steps=4, batch_size=16, verbose=False)
    blockers = [f for f in report["findings"] if f["severity"] == "blocker"]
    assert [f["check"] for f in blockers] == ["nonfinite"], report["findings"]
    assert "the loss (nan_mean): non-finite as a whole" in blockers[0]["what"], blockers[0]
    assert report["numerics"]["where"]["whole"] is True and report["numerics"]["verdict"] == "model"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_loss_scale_driven_to_its_floor(tmp_path, loop):
    m = _train(tmp_path, _model(_dense(), lambda: Boost(name="boost")), _data(), loop,
               epochs=1, max_skipped_steps=40)
    f = _fault(m)
    assert f["kind"] == "floor"
    assert "the loss scale reached its floor" in f["headline"] and "every step since step 1" in f["headline"]
    assert f["where"]["name"] == "boost" and f["where"]["phase"] == "backward"
    assert f["verdict"] == "precision" and f["flag"] == "--float32-layers boost"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_fault_inside_a_nested_layer(tmp_path, loop):
    m = _train(tmp_path, _model(lambda: Block(name="block")), _data(), loop)
    f = _fault(m)
    assert f["where"]["name"] == "block/amp" and f["verdict"] == "precision"
    assert f["flag"] == "--float32-layers block/amp"


def test_under_xla_the_step_is_guarded_and_the_fault_named(tmp_path):
    """--jit: the guard compiles with the step (no check_numerics ops, which XLA refuses)."""
    m = _train(tmp_path, _model(_dense(), lambda: Amplify(name="amplify")), _data(), "custom",
               jit=True)
    f = _fault(m)
    assert f["where"]["name"] == "amplify" and f["verdict"] == "precision"


MIRRORED_FAULT = '''
import numpy as np
import tensorflow as tf


def build(input_shape, num_classes):
    inp = tf.keras.Input(input_shape)
    h = tf.keras.layers.Dense(16, activation="relu", name="hidden")(inp)
    out = tf.keras.layers.Dense(num_classes, activation="softmax", dtype="float32",
                                name="predictions")(h)
    return tf.keras.Model(inp, out)


def load():
    rng = np.random.default_rng(0)
    x = rng.random((512, 8)).astype("float32")
    y = (x[:, :4].sum(axis=1) > x[:, 4:].sum(axis=1)).astype("int32")
    x[[205, 333]] = np.nan
    return (x, y), (x[:64], y[:64])
'''


@pytest.mark.slow
def test_under_mirrored_strategy_the_report_names_the_replica(tmp_path):
    """Two logical CPU devices (TFMP_LOGICAL_CPUS, a fresh process): the replicas agree on
    skipping, each stashes its own half of the batch, and the one holding the NaN sample is
    named."""
    import json
    import os
    import subprocess
    import sys

    from tests.paths import ROOT

    # Keras 3 runs its custom loop over replicas, Keras 2 its fit (as test_distribute_runs).
    loop = "custom" if int(tf.keras.__version__.split(".")[0]) >= 3 else "fit"
    (tmp_path / "faulty.py").write_text(MIRRORED_FAULT)
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFMP_")}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), TFMP_LOGICAL_CPUS="2",
               TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "app", "train", "--model", f"{tmp_path / 'faulty.py'}:build",
         "--dataset", f"{tmp_path / 'faulty.py'}:load", "--strategy", "mirrored", "--loop", loop,
         "--precision", "float32", "--batch-size", "8", "--epochs", "1", "--log-every", "4",
         "--progress", "lines", "--no-save-model", "--output", str(out)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 3, proc.stderr[-3000:]
    f = json.loads((out / "metrics.json").read_text())["numerics"]["fault"]
    assert f["where"]["kind"] == "input samples" and f["verdict"] == "data"
    assert f["replica"] in (0, 1)
    assert f"(replica {f['replica']})" in proc.stderr
    first = (f["step"] - 1) * 16 + f["replica"] * 8     # this replica's part of the global batch
    assert f["where"]["samples"] and all(first <= s < first + 8 for s in f["where"]["samples"])


@ONCE_IN_THE_IMAGE
@pytest.mark.slow
def test_in_a_two_worker_job_every_worker_names_the_worker_whose_batch_failed(tmp_path):
    """A real MultiWorkerMirroredStrategy job, two workers on localhost ports (the custom
    loop, on both Kerases).  Worker 1 reads a copy of the data with NaN in samples 200..259
    (one corrupt file, read by one worker); worker 0's copy is clean.  Both stop at the same
    step with exit 3, each replays its own share of the batch, and both (the chief's
    metrics.json too) name worker 1, samples in its share, and the data verdict."""
    import json
    import os
    import subprocess
    import sys

    from tests.paths import ROOT
    from tests.unit.helpers import free_ports, tf_config

    (tmp_path / "faulty.py").write_text(MIRRORED_FAULT.replace(
        "    x[[205, 333]] = np.nan\n",
        "    import json, os\n"
        "    if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1:\n"
        "        x[200:260] = np.nan\n"))
    out, ports = tmp_path / "run", free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFMP_")}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2")
    args = [sys.executable, "-m", "app", "train", "--model", f"{tmp_path / 'faulty.py'}:build",
            "--dataset", f"{tmp_path / 'faulty.py'}:load", "--loop", "custom",
            "--precision", "float32", "--batch-size", "8", "--epochs", "1", "--log-every", "4",
            "--progress", "lines", "--no-save-model", "--output", str(out)]
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    procs = [subprocess.Popen(args, stdout=open(logs[i], "w"), stderr=subprocess.STDOUT,
                              env={**env, "TF_CONFIG": tf_config(ports, i)}, cwd=ROOT)
             for i in range(2)]
    try:
        codes = [p.wait(timeout=400) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    texts = [log.read_text() for log in logs]
    assert codes == [3, 3], "\n=====\n".join(t[-2500:] for t in texts)
    f = json.loads((out / "metrics.json").read_text())["numerics"]["fault"]
    assert (f["worker"], f["where"]["kind"], f["verdict"]) == (1, "input samples", "data")
    first = (f["step"] - 1) * 16 + 8      # worker 1's share: the second 8 of the global 16
    assert f["where"]["samples"] and all(first <= s < first + 8 for s in f["where"]["samples"])
    # worker 1's own copy of the data: its 60 bad rows, the samples' among them
    assert f["where"]["bad_rows"] == list(range(200, 260)) and f["where"]["bad_rows_total"] == 60
    assert set(f["where"]["rows"]) <= set(range(200, 260)) and f["where"]["rows"]
    assert "rows 200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211 and 48 more of " \
           "x_train: 60 of the 512 training rows hold NaN or inf; the JSON report's " \
           "where.bad_rows lists them" in f["fix"], f["fix"]
    for text in texts:
        assert f"error: training diverged at step {f['step']} (epoch 1) (worker 1):" in text, \
            text[-2500:]
        samples = f["where"]["samples"]
        named = (f"the sample at position {samples[0]} " if len(samples) == 1 else
                 f"samples at positions {', '.join(map(str, samples))} ")
        assert named + "of the epoch" in text, text[-2500:]


def test_check_watches_its_steps_and_names_the_fault_with_the_flag():
    """`tfmp check --steps N`: the fault that needs ~30 steps is found before a long run, by
    the same replay, with the exact flag."""
    report = app.check(model=_model(_dense(), lambda: Amplify(name="amplify")), data=_data(),
                       steps=48, batch_size=16)
    blockers = [f for f in report["findings"] if f["severity"] == "blocker"]
    assert [f["check"] for f in blockers] == ["nonfinite"], report["findings"]
    assert blockers[0]["layer"] == "amplify" and "--float32-layers amplify" in blockers[0]["fix"]
    assert "finite in float32 (a precision problem)" in blockers[0]["what"]
    assert report["numerics"]["verdict"] == "precision"
    assert 1 < report["comparison"]["stopped_at_step"] <= 48


def test_check_under_float32_watches_its_steps_too():
    """Nothing runs in 16 bits, but a NaN in the data or a learning rate that sends the
    weights to inf is still found by `check --precision float32 --steps N`, and named."""
    nan_x = _with_rows(_rng_x(), [97, 301], np.nan)
    report = app.check(model=_model(_dense()), data=_data(nan_x), precision="float32",
                       steps=40, batch_size=16)
    (data, blocker) = [f for f in report["findings"] if f["severity"] == "blocker"]
    # the data read once, before any step: every bad row; then the step that met one
    assert data["check"] == "data" and data["what"] == (
        "2 of the 512 training rows hold NaN or inf: rows 97, 301 of x_train"), data
    assert report["data"]["nonfinite_rows"] == [97, 301]
    assert "the input batch: the sample at position" in blocker["what"], blocker
    assert report["numerics"]["verdict"] == "data"
    assert report["numerics"]["where"]["bad_rows"] == [97, 301], report["numerics"]
    assert blocker["fix"].startswith("repair or drop rows 97, 301 of x_train"), blocker
    assert 1 < report["comparison"]["stopped_at_step"] <= 40
    report = app.check(model=_sgd_model(1e4), data=_data(), precision="float32", steps=40,
                       batch_size=16)
    assert report["numerics"]["verdict"] == "optimizer", report["findings"]
    # A clean float32 model: its steps are watched and nothing is compared.
    report = app.check(model=_model(_dense()), data=_data(), precision="float32", steps=5,
                       batch_size=16)
    comp = report["comparison"]
    assert (comp["ran"], comp["compared"], comp["steps"]) == (True, False, 5), comp
    assert report["verdict"] == "ready" and comp["policy_end"] < comp["policy_start"], report


def test_resume_after_the_fix_continues_from_the_checkpoint_saved_at_the_fault(tmp_path):
    """The fault keeps the state that failed as a checkpoint; with the data repaired the same
    run continues from it (no epoch was complete) and finishes."""
    nan_x = _with_rows(_rng_x(), [97, 301], np.nan)
    m = _train(tmp_path, _model(_dense()), _data(nan_x), "custom", precision="float32")
    f = _fault(m)
    assert m["numerics"]["checkpoint"] and f["verdict"] == "data"
    again = _train(tmp_path, _model(_dense()), _data(), "custom", precision="float32",
                   resume=True)
    assert again["status"] == "completed" and len(again["epochs"]) == 2
    assert again["numerics"]["fault"] is None


def test_resume_with_the_flag_the_sentinel_printed_finishes_the_run(tmp_path):
    """The fix without editing the model: the report's --float32-layers, then --resume."""
    build = _model(_dense(), lambda: Amplify(name="amplify"))
    m = _train(tmp_path, build, _data(), "fit", epochs=1)
    f = _fault(m)
    assert f["flag"] == "--float32-layers amplify"
    again = _train(tmp_path, build, _data(), "fit", epochs=1, resume=True,
                   float32_layers=f["layers"])
    assert again["status"] == "completed", again.get("diagnosis")
    assert again["numerics"]["fault"] is None
    assert again["numerics"]["headroom"]["amplify"]["dtype"] == "float32"


class Grow(tf.keras.layers.Layer):
    """exp(12 x): past float16's 65504 where x is near 1."""

    def call(self, x):
        return tf.exp(x * 12.0)


def _grow_then_head(input_shape, num_classes):
    """'grow' overflows float16; run in float32, its output (~1.6e5) makes the float16 'head'
    after it overflow in turn."""
    inp = tf.keras.Input(input_shape)
    h = tf.keras.layers.Dense(16, name="d1", kernel_initializer="ones")(inp)
    h = Grow(name="grow")(tf.keras.layers.Activation("tanh", name="t")(h))
    h = tf.keras.layers.Dense(num_classes, name="head")(h)
    return tf.keras.Model(inp, tf.keras.layers.Activation("linear", dtype="float32",
                                                          name="out")(h))


def test_a_fault_after_the_float32_layers_fix_names_them_with_the_new_one(tmp_path):
    """The QA pass: after a resume with --float32-layers grow the next fault's fix said
    --float32-layers head, and the flag replaces the run's float32 layers: pasted, it put
    grow back in float16, and so on back and forth.  The fix names the whole set."""
    m = _train(tmp_path, _grow_then_head, _data(), "fit", epochs=1)
    f = m["numerics"]["fault"]
    assert f["where"]["name"] == "grow" and f["layers"] == ["grow"], f
    again = _train(tmp_path, _grow_then_head, _data(), "fit", epochs=1, resume=True,
                   float32_layers=f["layers"])
    f = again["numerics"]["fault"]
    assert f["where"]["name"] == "head" and f["verdict"] == "precision", f
    assert f["layers"] == ["grow", "head"] and f["flag"] == "--float32-layers grow,head", f
    assert 'float32_layers=["grow", "head"]' in f["fix"], f["fix"]   # app.train's words
    # `check` of the same model, as that run trains it: the blocker's fix names both too.
    report = app.check(model=_grow_then_head, data=_data(), float32_layers=["grow"], steps=2,
                       batch_size=16, verbose=False)
    (blocker,) = [f for f in report["findings"] if f["severity"] == "blocker"]
    assert blocker["layer"] == "head" and "--float32-layers grow,head" in blocker["fix"], blocker
    assert report["numerics"]["layers"] == ["grow", "head"]


def test_a_float32_layers_output_too_large_for_the_next_16_bit_layer_is_named_so(tmp_path,
                                                                                 capsys):
    """The QA pass: with grow in float32 the float16 head after it took inf from Keras' cast
    of grow's output, and the values line said 'the largest finite magnitude going in was 0'
    (the tap sees the inputs after the cast)."""
    m = _train(tmp_path, _grow_then_head, _data(), "fit", epochs=1, float32_layers=["grow"])
    f = m["numerics"]["fault"]
    assert f["where"]["name"] == "head" and f["verdict"] == "precision", f
    assert f["cause"] == "overflow" and f["cast_input_from"] == "grow", f
    assert 1.5e5 < f["cast_input_largest"] < 1.7e5, f   # exp(12 tanh(~4))
    values = next(line for line in capsys.readouterr().err.splitlines()
                  if line.startswith("  values: "))
    assert values.startswith(
        f"  values: what goes in (the output of layer 'grow', in float32) reaches "
        f"{f['cast_input_largest']:.4g}, too large to cast to float16 ("), values
    assert "going in was 0" not in values
    assert f["fix"].startswith('run this layer in float32 too: float32_layers=["grow", "head"] '
                               "(or dtype='float32' on it); or keep the output of 'grow' under "
                               "float16's largest (65504"), f["fix"]


# ---- the checkpoint at a fault, and the resume from it -----------------------------------

class Spike(tf.keras.layers.Layer):
    """``x * f / f`` with ``f = exp(c)``, ``c`` growing by 0.5 a training call up to 11.5:
    the identity in float32, but in float16 ``f`` passes 65504 at the 23rd call (and the
    product sooner, where |x| > 1), so the forward pass goes non-finite a score of steps in.
    In float32 (``--float32-layers spike``) the model is a plain MLP that learns."""

    def build(self, shape):
        self.c = self.add_weight(name="c", shape=(), trainable=False,
                                 initializer=tf.keras.initializers.Constant(0.0))

    def call(self, x, training=None):
        if training:
            self.c.assign(tf.minimum(tf.cast(self.c, tf.float32) + 0.5, 11.5))
        f = tf.cast(tf.exp(tf.cast(self.c, tf.float32)), x.dtype)
        return (x * f) / f


def _classes(n, seed):
    """Three Gaussian classes in 8 features, scaled by 5: easy to learn."""
    centers = np.random.default_rng(0).normal(size=(3, FEATURES)).astype("float32")
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n).astype("int32")
    x = (centers[y] + 0.3 * rng.normal(size=(n, FEATURES))).astype("float32") * 5
    return x, y


def _checkpoint_state(path) -> dict:
    """The step, loss scale and optimizer iterations a checkpoint holds (Keras 2 and 3 name
    them differently: Keras 2 ``loss_scale/current_loss_scale`` and ``iter``, Keras 3
    ``dynamic_scale`` and ``inner_optimizer/_iterations``)."""
    names = [name for name, _ in tf.train.list_variables(path)]

    def value(name):
        return tf.train.load_variable(path, name)
    scale = [value(n) for n in names if n.startswith("optimizer/") and
             ("current_loss_scale" in n or "dynamic_scale" in n)]
    iterations = [int(value(n)) for n in names if n.startswith("optimizer/") and
                  (n.endswith("/iter/.ATTRIBUTES/VARIABLE_VALUE") or
                   n.endswith("/_iterations/.ATTRIBUTES/VARIABLE_VALUE"))]
    assert len(scale) == 1 and iterations, names
    return {"step": int(value("step/.ATTRIBUTES/VARIABLE_VALUE")), "scale": float(scale[0]),
            "iterations": max(iterations)}


@pytest.mark.parametrize("loop", LOOPS)
def test_the_checkpoint_at_a_fault_holds_the_state_before_it_and_the_resume_trains(
        tmp_path, loop, capsys):
    """The monitor notices the latch a while after the fault (the custom loop at its next
    check, here the epoch's end; fit at its next poll); the steps in between counted and,
    handed to the LossScaleOptimizer poisoned, halved its scale each time (Keras 3 took it
    to 1e-26 in a longer run, and the resume then trained nothing).  The checkpoint holds
    the state the faulty step began from: the step count before it, the scale it ran with,
    the optimizer's iterations then; the resume with the report's flag trains from the
    failing batch on, at that scale, and says nothing of an epoch starting over."""
    build = _model(_dense(name="d1"), _dense(name="d2"), lambda: Spike(name="spike"))
    data = (_classes(768, 1), _classes(192, 2))   # 48 steps an epoch
    # log_every 1000: the custom loop checks at the epoch's end only; fit logs every step
    # (its poll notices the latch within 0.25 s, a few steps after the fault at most in
    # the image, dozens on the host).
    m = _train(tmp_path, build, data, loop, log_every=1 if loop == "fit" else 1000)
    f = _fault(m)
    step = f["step"]
    assert f["kind"] == "forward" and f["flag"] == "--float32-layers spike" and step < 48, f
    if loop == "custom":
        assert m["steps"] == [], m["steps"]   # nothing logged: the steps ran on to step 48
    state = _checkpoint_state(m["numerics"]["checkpoint"])
    assert state["step"] == step - 1, (step, state)
    # The scale the failing step ran with: fit's log row of the step before it says which
    # (Keras 2 skips a few of the first steps, 32768 -> 8192; Keras 3 none); the ~30
    # poisoned steps after it took Keras 2's to its floor, 1, and Keras 3's to 1e-5.
    before = [r["loss_scale"] for r in m["steps"] if r["step"] == step - 1]
    assert before in ([], [state["scale"]]) and 2.0 ** 10 <= state["scale"] <= 2.0 ** 15, \
        (m["steps"], state)
    # Keras 2 counts a skipped step as an iteration, Keras 3 does not.
    assert 0 < state["iterations"] <= step - 1, (step, state)
    capsys.readouterr()

    again = _train(tmp_path, build, data, loop, resume=True, float32_layers=f["layers"])
    err = capsys.readouterr().err
    assert again["status"] == "completed", again.get("diagnosis")
    assert f"after {step - 1} batch(es) of epoch 1" in err, err
    assert "starts over" not in err, err
    assert again["numerics"]["fault"] is None and again["numerics"]["skipped_steps"] == 0
    # It trains: every step applied at the scale the fault had, the loss falls, and the
    # three classes are told apart.
    rows = [r for r in again["steps"] if r["step"] >= step]   # the resume's own
    assert rows[0]["step"] < step + 4 and rows[-1]["step"] == 96, rows
    assert {r["loss_scale"] for r in rows} == {state["scale"]}, rows
    assert all(r["grad_norm"] > 0 for r in rows), rows
    assert rows[-1]["loss"] < rows[0]["loss"] / 2, rows
    assert again["epochs"][-1]["val_accuracy"] >= 0.95, again["epochs"]


def test_the_epoch_starts_over_note_blames_the_batch_size_only_when_it_changed(capsys):
    """``_say_a_cut_epoch_starts_over``: a checkpoint past the batches this run can count.
    The note said "at the batch size the run had then" after a fault whose checkpoint held
    a later step (the QA pass), though the batch size had not changed; with the same batch
    size such a checkpoint is one saved after an epoch's last batch, before its record."""
    from app.training.resuming import _say_a_cut_epoch_starts_over

    epochs = [{"epoch": 1, "steps": 48}]
    _say_a_cut_epoch_starts_over(epochs, 1, 96, resized=False)
    same = capsys.readouterr().err
    assert "batch size" not in same and "after the last of epoch 2's 48 step(s)" in same, same
    _say_a_cut_epoch_starts_over(epochs, 1, 64, resized=True)
    assert "16 step(s) into epoch 2, at the batch size the run had then" in \
        capsys.readouterr().err
    _say_a_cut_epoch_starts_over(epochs, 1, 48, resized=False)   # at the epoch's end: nothing
    assert capsys.readouterr().err == ""
