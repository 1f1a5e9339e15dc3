"""A weight a sample, as Keras' fit takes ``sample_weight``: (x, y, w) arrays and tf.data of
(features, label, weight) train in both loops, and the weights decide what is learned
(``user_models/weighted.py`` is built so that only they do); the sentinel, ``check``, the
tuner's trials and ``--accumulate`` take the weighted batches; weights no loss can use are
one line each."""
import os
import re

import numpy as np
import pytest

from app.core.errors import UsageError
from tests.paths import USER_MODELS
from tests.unit.helpers import run_app, user_module

WEIGHTED = os.path.join(str(USER_MODELS), "weighted.py")


def _weighted():
    return user_module(WEIGHTED)


def _train(tiny_config, dataset, **kw):
    from app.training.job import train

    args = dict(model="mlp", dataset=f"{WEIGHTED}:{dataset}", epochs=2, learning_rate=3e-3,
                max_train_samples=None, max_val_samples=None)
    args.update(kw)
    return train(tiny_config(**args))


@pytest.mark.parametrize("dataset, loop", [("arrays", "fit"), ("arrays", "custom"),
                                           ("datasets", "fit"), ("datasets", "custom"),
                                           ("weighted_validation", "custom")])
def test_the_weights_decide_what_is_learned_in_both_loops(tiny_config, dataset, loop):
    m = _train(tiny_config, dataset, loop=loop)
    assert m["status"] == "completed"
    assert m["data"]["sample_weights"] is True and m["data"]["train_samples"] == 512
    # The contested third of the validation set is right only if the weights were used.
    assert m["epochs"][-1]["val_accuracy"] >= 0.9, m["epochs"][-1]


def test_weighted_validation_in_fit_trains_without_keras_warning(tiny_config):
    """Keras 2 warned at every validation of weighted data that the weights were meant for
    ``weighted_metrics``: they weigh the loss alone, as documented, and compile says so."""
    import logging

    import tensorflow as tf

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())
    seen = Lines()
    tf.get_logger().addHandler(seen)   # TensorFlow's logger does not propagate to caplog's
    try:
        m = _train(tiny_config, "weighted_validation", loop="fit")
    finally:
        tf.get_logger().removeHandler(seen)
    assert m["status"] == "completed" and m["epochs"][-1]["val_accuracy"] >= 0.9
    assert not [line for line in seen.lines if "weighted_metrics" in line], seen.lines


def test_without_the_weights_the_same_samples_are_learned_otherwise(tiny_config):
    """The control: the data is such that a run that dropped the weights would fail above."""
    m = _train(tiny_config, "unweighted", loop="custom")
    assert "sample_weights" not in m["data"]
    assert m["epochs"][-1]["val_accuracy"] <= 0.75, m["epochs"][-1]


def test_the_custom_loss_is_the_weighted_sum_over_the_batch_size():
    """Keras' fit: sum(loss * weight) / batch size; the custom loop's step is the same."""
    import tensorflow as tf

    from app.training.step import forward_backward

    model = tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(4,))])
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
    x = tf.random.stateless_normal((6, 4), seed=(1, 2))
    y = tf.constant([0, 1, 2, 0, 1, 2])
    w = tf.constant([0.0, 1.0, 2.0, 3.0, 0.5, 0.0])
    out = forward_backward(model, loss_fn, x, y, sample_weight=w)
    per = loss_fn(y, model(x)).numpy()
    assert float(out.loss) == pytest.approx(float((per * w.numpy()).sum() / 6), rel=1e-5)
    zero = forward_backward(model, loss_fn, x, y, sample_weight=tf.zeros(6))
    assert all(float(tf.reduce_sum(tf.abs(g))) == 0.0 for g in zero.grads)


def test_a_nan_sample_of_weighted_data_is_named_by_its_rows(tiny_config, capsys):
    """The sentinel's stash and replay take the (x, y, w) batch."""
    m = _train(tiny_config, "nan_arrays", loop="custom", epochs=1)
    f = m["numerics"]["fault"]
    assert f["where"]["kind"] == "input samples" and f["verdict"] == "data"
    assert (f["where"]["bad_rows"], f["where"]["bad_rows_total"]) == ([40, 200], 2)
    assert "fix: repair or drop rows 40, 200 of x_train" in capsys.readouterr().err


def test_check_accumulate_and_a_tuner_trial_take_weighted_batches(tiny_config):
    from app.doctor.check import check
    from app.tuner import trial

    report = check("mlp", f"{WEIGHTED}:arrays", precision="float32", batch_size=32, steps=3,
                   verbose=False)
    assert report["verdict"] == "ready" and report["comparison"]["steps"] == 3, report["findings"]
    m = _train(tiny_config, "datasets", loop="custom", accumulate=2)
    assert m["epochs"][-1]["val_accuracy"] >= 0.9, m["epochs"][-1]
    result = trial.run({"model": "mlp", "dataset": f"{WEIGHTED}:arrays", "batch_size": 64,
                        "policy": "float32", "steps": 2, "warmup_steps": 1, "min_seconds": 0,
                        "offline": True})
    assert result["status"] == "ok" and result["steps"] >= 2, result


@pytest.mark.parametrize("weights, words", [
    (lambda w: w[:-1], "the training sample weights have shape (511,) for 512 samples"),
    (lambda w: np.where(np.arange(len(w)) == 7, np.nan, w),
     "1 training sample weight(s) are NaN or inf (rows 7)"),
    (lambda w: -w, "512 training sample weight(s) are below zero (rows 0, 1, 2, 3, 4, ...)"),
    (lambda w: 0 * w, "every training sample weight is 0, so nothing would be learned"),
    (lambda w: np.array(["a"] * len(w)), "the training sample weights are not numbers"),
])
def test_weights_no_loss_can_use_are_one_line(weights, words):
    from app.task.user_data import from_user

    (x, y, w), val = _weighted().arrays()
    with pytest.raises(UsageError) as err:
        from_user(((x, y, weights(w)), val), "t:w", 32)
    assert words in str(err.value)
    assert "one finite, non-negative number a sample, not all zero" in err.value.allowed


def test_tf_data_weights_are_checked_as_arrays_are():
    import tensorflow as tf

    from app.task.user_data import from_user

    (x, y, w), (xv, yv) = _weighted().arrays()
    val = tf.data.Dataset.from_tensor_slices((xv, yv))
    bad = np.where(np.arange(len(w)) % 100 == 3, np.nan, w).astype(np.float32)
    with pytest.raises(UsageError, match=r"6 training sample weight\(s\) are NaN or inf"):
        from_user((tf.data.Dataset.from_tensor_slices((x, y, bad)), val), "t:w", 32)
    with pytest.raises(UsageError, match="the training dataset's sample weights are TensorSpec"):
        from_user((tf.data.Dataset.from_tensor_slices((x, y, np.ones((512, 2)))), val), "t:w", 32)
    bundle = from_user((tf.data.Dataset.from_tensor_slices((x, y, w[:, None])), val), "t:w", 32)
    xb, yb, wb = next(iter(bundle.train))
    assert bundle.weighted and wb.shape == (32,) and wb.dtype == tf.float32
    assert len(next(iter(bundle.val))) == 2   # the validation data as it came: unweighted


# ---- --class-weight ------------------------------------------------------------------------------

def test_class_weights_decide_as_sample_weights_do(tiny_config):
    """The unweighted samples with class 0 weighed 8: the contested region is learned as 0."""
    m = _train(tiny_config, "unweighted", loop="fit", class_weight="0=8")
    assert m["data"]["class_weight"] == [8.0, 1.0, 1.0, 1.0] and m["data"]["sample_weights"]
    assert m["config"]["class_weight"] == "0=8"
    assert m["epochs"][-1]["val_accuracy"] >= 0.9, m["epochs"][-1]


def test_resume_keeps_the_runs_class_weights_unless_told_otherwise(tiny_config, capsys):
    """The loss would change under a resumed run that forgot --class-weight."""
    m = _train(tiny_config, "unweighted", loop="custom", class_weight="0=8", epochs=1,
               save_model=False)
    kept = _train(tiny_config, "unweighted", loop="custom", epochs=2, resume=True)
    assert kept["data"]["class_weight"] == m["data"]["class_weight"] == [8.0, 1.0, 1.0, 1.0]
    assert kept["config"]["class_weight"] == "0=8" and len(kept["epochs"]) == 2
    assert "note: --resume keeps the run's class weights (--class-weight 0=8)" in \
        capsys.readouterr().err
    changed = _train(tiny_config, "unweighted", loop="custom", epochs=3, resume=True,
                     class_weight="balanced")
    assert changed["config"]["class_weight"] == "balanced"
    assert "note: the run was trained with --class-weight 0=8; it continues with balanced" \
        in capsys.readouterr().err


GROWING_DATA = """
import os
import numpy as np
import tensorflow as tf

def load(seed=0):
    # The share of class 0 is read from a file beside this one: the data a run resumes on
    # may have grown since it began.
    share = float(open(os.path.join(os.path.dirname(__file__), "share.txt")).read())
    rng = np.random.default_rng(seed)
    n = 256
    y = (rng.random(n) >= share).astype(np.int64)
    x = (rng.normal(size=(n, 8)) + y[:, None]).astype(np.float32)
    return (tf.data.Dataset.from_tensor_slices((x, y)),
            tf.data.Dataset.from_tensor_slices((x[:64], y[:64])))
"""


def test_a_resumed_balanced_run_keeps_the_weights_it_counted(tiny_config, tmp_path, capsys):
    """Counted once, when the run began: --resume applies that table exactly (metrics.json
    keeps it at full precision), whatever the data holds now, and reads no extra epoch."""
    (tmp_path / "growing.py").write_text(GROWING_DATA)
    (tmp_path / "share.txt").write_text("0.8")
    spec = f"{tmp_path / 'growing.py'}:load"

    def run(**kw):
        from app.training.job import train

        return train(tiny_config(dataset=spec, loop="custom", max_train_samples=None,
                                 max_val_samples=None, **kw))
    first = run(epochs=1, class_weight="balanced")
    said = capsys.readouterr().err
    assert "counting read the training data once" in said
    table = first["data"]["class_weight"]
    counts = re.search(r"training labels' counts (\d+), (\d+)\)", said).groups()
    n0, n1 = int(counts[0]), int(counts[1])
    assert table == [256 / (2 * n0), 256 / (2 * n1)]   # exact, not rounded
    (tmp_path / "share.txt").write_text("0.5")   # a count now would give other weights
    resumed = run(epochs=2, resume=True)
    said = capsys.readouterr().err
    assert "note: --resume keeps the run's class weights (--class-weight balanced)" in said
    assert "--class-weight balanced: the run's class weights " in said and \
        "(counted when the run began: --resume does not count the labels again)" in said
    assert "counting read the training data once" not in said
    assert resumed["data"]["class_weight"] == table and len(resumed["epochs"]) == 2
    # Other weights given: they replace the counted ones.
    other = run(epochs=3, resume=True, class_weight="0=2")
    assert other["data"]["class_weight"] == [2.0, 1.0]


def test_a_table_this_program_did_not_write_is_counted_again():
    from app.training.config import TrainConfig
    from app.training.resuming import counted_class_weights

    balanced = TrainConfig(class_weight="balanced")

    def run(table, setting="balanced"):
        return {"config": {"class_weight": setting}, "data": {"class_weight": table}}
    assert counted_class_weights(balanced, run([0.5, 2])) == [0.5, 2.0]
    for bad in ([], [0.5, "x"], [float("nan")], [-1.0], [True], "0.5", None, {"0": 1}):
        assert counted_class_weights(balanced, run(bad)) is None, bad
    assert counted_class_weights(TrainConfig(class_weight="0=2"), run([0.5, 2])) is None
    assert counted_class_weights(balanced, run([0.5, 2], setting="0=2")) is None
    assert counted_class_weights(balanced, run([0.5, 2], setting="nonsense")) is None
    assert counted_class_weights(balanced, None) is None
    assert counted_class_weights(balanced, {"config": "garbled", "data": []}) is None
    assert counted_class_weights(balanced, {"config": {"class_weight": "balanced"},
                                            "data": "garbled"}) is None


def test_class_weights_multiply_the_datas_own_weights(tiny_config):
    """The data weighs class 0 by 8; --class-weight 0=0.1 makes that 0.8, under the 0.7/0.3
    that class 1 has: the region goes back to 1."""
    m = _train(tiny_config, "arrays", loop="custom", class_weight={0: 0.1})
    assert m["epochs"][-1]["val_accuracy"] <= 0.75, m["epochs"][-1]


def test_balanced_weights_come_from_the_counts_of_arrays_and_of_tf_data_alike():
    from app.task import class_weights
    from app.task.user_data import from_user

    module = _weighted()
    (x, y), val = module.unweighted()
    counts = np.bincount(y, minlength=4)
    expected = [len(y) / (4 * c) for c in counts]
    balanced = class_weights.parse("balanced")
    for returned in (((x, y), val), tuple(
            __import__("tensorflow").data.Dataset.from_tensor_slices(p) for p in ((x, y), val))):
        bundle = class_weights.weigh(from_user(returned, "t:w", 64), balanced)
        assert bundle.class_weight == pytest.approx(expected) and bundle.weighted
        note = bundle.notes[-1]
        assert f"counts {', '.join(map(str, counts))}" in note
        # A pipeline is read once more for its labels: said, with the flag that skips it.
        said = re.search(r"counting read the training data once, in [\d.]+ s: "
                         r"--class-weight (\S+) gives the same weights without that pass$", note)
        assert (said is None) == isinstance(returned[0], tuple), note   # arrays: no pass
        if said:
            again = class_weights.weigh(from_user(returned, "t:w", 64),
                                        class_weights.parse(said.group(1)))
            assert np.array_equal(np.float32(again.class_weight), np.float32(bundle.class_weight))
        xb, yb, wb = next(iter(bundle.train))
        assert np.allclose(wb.numpy(), np.take(expected, yb.numpy()))
        assert len(next(iter(bundle.val))) == 2   # fit does not weigh validation by class


@pytest.mark.parametrize("value, parsed", [
    ("balanced", "balanced"), (" Balanced ", "balanced"), ("3=10", {3: 10.0}),
    ("1=4.5, 0=1", {0: 1.0, 1: 4.5}), ({2: 3}, {2: 3.0}), ("", None), (None, None)])
def test_class_weight_forms(value, parsed):
    from app.task import class_weights

    assert class_weights.parse(value) == parsed


@pytest.mark.parametrize("value, words", [
    ("3", "'3' is not CLASS=WEIGHT"), ("a=1", "'a' is not a class id"),
    ("-1=2", "'-1' is not a class id"), ("1=x", "weight 'x' is not a number"),
    ("1=-2", "weight '-2' is not a finite number >= 0"), ("1=nan", "not a finite number"),
    ("1=2,1=3", "class 1 is given twice"), ({1.5: 2}, "1.5 is not a class id"),
    (["1=2"], "class weights are 'balanced' or CLASS=WEIGHT pairs")])
def test_bad_class_weights_are_one_line(value, words):
    from app.task import class_weights

    with pytest.raises(UsageError) as err:
        class_weights.parse(value)
    assert words in str(err.value) and str(err.value).startswith("error: --class-weight: ")
    assert err.value.allowed.startswith("balanced, or CLASS=WEIGHT pairs")


def test_a_bad_variable_is_named_and_exits_2_before_anything_is_written(tmp_path):
    from app.training.config import resolve_config

    assert resolve_config({}, {"TFMP_CLASS_WEIGHT": "0=2,3=1"}).class_weight == "0=2,3=1"
    assert resolve_config({"class_weight": "balanced"},
                          {"TFMP_CLASS_WEIGHT": "0=2"}).class_weight == "balanced"
    proc = run_app("train", "--output", str(tmp_path / "run"),
                   env={"TFMP_CLASS_WEIGHT": "0:2"}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert lines == ["error: TFMP_CLASS_WEIGHT: '0:2' is not CLASS=WEIGHT. Received: "
                     "TFMP_CLASS_WEIGHT='0:2'; allowed: balanced, or CLASS=WEIGHT pairs of "
                     "class ids and weights >= 0, e.g. 3=10 or 0=1,1=4.5 (classes not listed "
                     "weigh 1)"], proc.stderr
    assert not (tmp_path / "run").exists()


def test_class_weights_need_classes_that_the_labels_have():
    from app.task import class_weights
    from app.task.user_data import from_user

    (x, y), val = _weighted().unweighted()
    bundle = from_user(((x, y), val), "t:w", 64)
    with pytest.raises(UsageError, match=r"weighs class 4, and the labels are the class ids 0\.\.3"):
        class_weights.weigh(bundle, class_weights.parse("4=2"))
    with pytest.raises(UsageError, match="weighs every class 0"):
        class_weights.weigh(bundle, class_weights.parse("0=0,1=0,2=0,3=0"))
    values = from_user(((x, y.astype(np.float32) + 0.5), (val[0], val[1] + 0.5)), "t:v", 64)
    with pytest.raises(UsageError, match="the labels of this data are values, not classes"):
        class_weights.weigh(values, class_weights.parse("balanced"))


# ---- Keras Sequences -----------------------------------------------------------------------------

@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_keras_sequence_of_weighted_batches_trains(tiny_config, loop, capsys):
    """A Sequence is what Keras code often loads data with: its batches are taken apart and
    batched again at the run's batch, the weights kept (the contested region learned as 0)."""
    m = _train(tiny_config, "sequences", loop=loop)
    assert m["status"] == "completed" and m["data"]["sample_weights"] is True
    assert (m["data"]["train_samples"], m["data"]["val_samples"]) == (512, 192)
    assert m["epochs"][-1]["val_accuracy"] >= 0.9, m["epochs"][-1]
    assert "came batched" in capsys.readouterr().err


def test_a_sequence_runs_its_on_epoch_end_after_each_pass():
    from app.task.user_data import from_user

    train, val = _weighted().sequences()
    bundle = from_user((train, val), "t:seq", 64)
    counted = train.epochs_ended      # the pass that counts the samples
    for _ in range(2):
        for _batch in bundle.train:
            pass
    assert train.epochs_ended == counted + 2


@pytest.mark.parametrize("batch, words", [
    ([1, 2], "batch 0 of the training Sequence is list of 2"),
    ((np.zeros((4, 8)),), "batch 0 of the training Sequence is tuple of 1"),
    ((np.zeros((4, 8)), 3), "holds something that is not an array"),
])
def test_a_sequence_whose_batches_are_not_arrays_is_one_line(batch, words):
    import tensorflow as tf

    from app.task.user_data import from_user

    class Odd(tf.keras.utils.Sequence):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return batch

    _, val = _weighted().sequences()
    with pytest.raises(UsageError) as err:
        from_user((Odd(), val), "t:odd", 32)
    assert words in str(err.value) and "batches (x, y) or (x, y, sample_weight)" in str(err.value)
    with pytest.raises(UsageError, match="both Keras Sequences"):
        from_user((Odd(), (np.zeros((4, 8)), np.zeros(4))), "t:mixed", 32)
