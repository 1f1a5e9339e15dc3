"""What the labels are decides the default loss, the metric and ``num_classes``: class ids,
one-hot rows (soft labels too), multi-hot rows (tags), or values, which no class loss
fits.  Values trained with a cross-entropy died in the graph ("Received a label value of -7
which is outside the valid range"), a table of values passed for one-hot, and string labels
crashed in NumPy."""
import numpy as np
import pytest

from app.core.errors import UsageError
from app.task.data_rules import label_kind_of

WEIGHTS = np.array([1.0, 2.0, -1.0, 0.5], np.float32)


@pytest.mark.parametrize("labels, kind, classes", [
    (np.array([0, 2, 1, 4]), "sparse", 5),
    (np.array([0.0, 1.0, 1.0]), "binary", 2),
    (np.eye(3)[[0, 2, 1]], "onehot", 3),
    (np.array([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1]]), "onehot", 3),      # soft labels
    (np.array([[1.5, -2.0, 0.0], [0.3, 0.3, 0.3]]), "other", 3),        # three values a sample
    (np.array([[1, 0, 1], [0, 0, 0], [0, 1, 0]]), "multilabel", 3),     # tags: several, or none
    (np.array([[1.0, 1.0], [0.0, 1.0]], np.float32), "multilabel", 2),
    (np.array([[1.0, 0.5], [0.0, 1.0]]), "other", 2),                  # 0.5: not a tag
    (np.array([0.25, -1.5, 2.0]), "other", 1),
    (np.array([-1, 1, 1]), "other", 1),
])
def test_label_kinds(labels, kind, classes):
    assert label_kind_of(labels) == (kind, classes)


def _values(n=1024, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)
    return x, x @ WEIGHTS


def _split(x, y, val=128):
    return (x[:-val], y[:-val]), (x[-val:], y[-val:])


def _dense(widths):
    def build(input_shape, num_classes):
        import tensorflow as tf

        widths.append(num_classes)
        return tf.keras.Sequential([tf.keras.Input(shape=input_shape),
                                    tf.keras.layers.Dense(16, activation="relu"),
                                    tf.keras.layers.Dense(num_classes)])
    return build


def test_values_without_a_loss_are_one_line_and_nothing_is_written(tmp_path):
    import tensorflow as tf

    import app
    x, y = _values(256)
    arrays = _split(x, y)
    datasets = tuple(tf.data.Dataset.from_tensor_slices(part) for part in arrays)
    for data in (arrays, datasets):
        with pytest.raises(UsageError) as caught:
            app.train(model=_dense([]), data=data, epochs=1, precision="float32",
                      output=str(tmp_path / "run"))
        assert str(caught.value).startswith(
            "error: the labels are not class ids (labels such as ")
        assert str(caught.value).endswith(
            "), and no loss fits them by default; allowed: a loss for them: --loss mse (mae, "
            "huber, ... or MODULE:OBJECT; loss= in app.train, or the model compiled with "
            "one); or class ids 0..N-1, one-hot rows, or multi-hot rows of 0s and 1s")
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_values_train_with_a_regression_loss_to_a_small_error(tmp_path, loop):
    import app
    x, y = _values()
    widths = []
    m = app.train(model=_dense(widths), data=_split(x, y), loss="mse", epochs=8,
                  learning_rate=1e-2, batch_size=32, loop=loop, precision="float32",
                  progress="lines", save_model=False, output=str(tmp_path / "run"))
    assert m["status"] == "completed" and m["data"]["label_kind"] == "other"
    assert widths == [1]                      # num_classes: the values a label holds
    last = m["epochs"][-1]
    assert "val_accuracy" not in last         # the default metric for values: MAE
    # Predicting 0 is off by 1.9 on average: the model has learnt the linear map (Keras 2's
    # mse broadcast (batch,) labels against the (batch, 1) output and stayed at 1.8).
    assert last["val_mae"] < 0.25, m["epochs"]


def test_a_keras_loss_name_trains_a_one_unit_output_in_the_custom_loop(tmp_path):
    """Keras 2's loss functions took (batch,) labels against a (batch, 1) output as they
    came: binary cross-entropy raised ("logits and labels must have the same shape") and
    mse broadcast them and learnt only the mean (val MAE 1.81; the custom loop and check's
    probe call the function itself, fit wraps it)."""
    import tensorflow as tf

    import app
    x, y = _values()

    def build(input_shape):
        return tf.keras.Sequential([tf.keras.Input(shape=input_shape),
                                    tf.keras.layers.Dense(16, activation="relu"),
                                    tf.keras.layers.Dense(1, activation="sigmoid")])
    m = app.train(model=build, data=_split(x, (y > 0).astype(np.int64)),
                  loss="binary_crossentropy", epochs=4, learning_rate=1e-2, batch_size=32,
                  loop="custom", precision="float32", progress="lines", save_model=False,
                  output=str(tmp_path / "run"))
    assert m["epochs"][-1]["val_accuracy"] >= 0.95, m["epochs"]


def test_string_labels_are_one_line(tmp_path):
    import tensorflow as tf

    import app
    x, y = _values(256)
    names = np.where(y > 0, "pos", "neg")
    with pytest.raises(UsageError, match=r"the training labels are strings \(e\.g\. 'neg'\), "
                                         r"not class ids; allowed: class ids 0\.\.N-1"):
        app.train(model=_dense([]), data=_split(x, names), epochs=1,
                  output=str(tmp_path / "run"))
    datasets = tuple(tf.data.Dataset.from_tensor_slices(part) for part in _split(x, names))
    with pytest.raises(UsageError, match="the training labels are strings, not class ids; "
                                         "allowed: class ids 0..N-1 .a tf.keras.layers."
                                         "StringLookup maps them"):
        app.train(model=_dense([]), data=datasets, epochs=1, output=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_one_x_y_pair_is_named_as_such(tmp_path):
    """What Keras' fit(x, y) takes: the validation part is missing, and the line says how
    to hold some out."""
    import app
    x, y = _values(600)
    with pytest.raises(UsageError) as caught:
        app.train(model=_dense([]), data=(x, y), loss="mse", output=str(tmp_path / "run"))
    assert str(caught.value) == (
        "error: dataset spec 'python:arrays' returned one (x, y) pair of 600 samples: the "
        "validation data is missing; allowed: ((x_train, y_train), (x_val, y_val)), e.g. the "
        "last tenth held out: ((x[:540], y[:540]), (x[540:], y[540:])) after shuffling them "
        "together")
    assert not (tmp_path / "run").exists()


def test_check_takes_values_with_a_loss_and_says_what_the_labels_are():
    import app
    from app.doctor.report import to_text
    x, y = _values(256)
    report = app.check(model=_dense([]), data=_split(x, y, 64), loss="mse",
                       precision="float32", steps=2)
    assert report["data"]["label_kind"] == "other" and report["data"]["num_classes"] == 1
    assert to_text(report).splitlines()[0].endswith(
        "(samples of shape 4, labels of 1 value(s))")


@pytest.mark.parametrize("labels, kind, classes", [
    (np.array([0, 3, 1, 2] * 16), "sparse", 4),
    (np.array([-1, 1] * 32), "other", 1),                                 # not class ids
    (np.eye(3, dtype=np.float32)[np.arange(64) % 3], "onehot", 3),
    (np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32), "other", 3),
    (np.array([[1, 1, 0], [0, 0, 1], [0, 0, 0], [1, 0, 0]] * 16), "multilabel", 3),
    (np.array([[1, 1, 0], [0, 0, 1], [0, 0, 0], [1, 0, 0]] * 16, np.float32), "multilabel", 3),
    (np.eye(3, dtype=np.int64)[np.arange(64) % 3], "onehot", 3),        # integer one-hot rows
])
def test_a_tf_data_datasets_labels_are_read_in_its_counting_pass(labels, kind, classes):
    """A dataset's rows were one-hot by their shape alone: a table of three values a
    sample got a categorical cross-entropy."""
    import tensorflow as tf

    from app.task.user_data import from_user
    x = np.zeros((64, 4), np.float32)
    data = (tf.data.Dataset.from_tensor_slices((x, labels)),
            tf.data.Dataset.from_tensor_slices((x[:16], labels[:16])))
    bundle = from_user(data, "python:tf.data", 16)
    assert (bundle.label_kind, bundle.num_classes) == (kind, classes)


def test_one_class_is_one_line_unless_num_classes_says_more(tmp_path):
    """Every label 0: a one-unit model trained at accuracy 0, exit 0, without a word."""
    from app.task.user_data import from_user
    x = np.zeros((64, 4), np.float32)
    zeros = np.zeros(64, np.int64)
    with pytest.raises(UsageError) as caught:
        from_user(((x, zeros), (x[:16], zeros[:16])), "d.py:f", 16)
    assert str(caught.value) == (
        "error: dataset 'd.py:f': every label is class 0, one class: there is nothing to tell "
        "apart; allowed: labels of two classes or more, or --num-classes N when this part of "
        "the data holds one class of N")
    assert from_user(((x, zeros), (x[:16], zeros[:16])), "d.py:f", 16,
                     num_classes=3).num_classes == 3


def test_the_class_count_is_read_from_all_labels_not_the_samples_kept():
    """Sorted data under --max-train-samples (check loads a few batches): the first rows
    showed one class, or too few for the model's output."""
    from app.task.user_data import from_user
    x = np.zeros((64, 4), np.float32)
    y = np.repeat(np.arange(4), 16)
    bundle = from_user(((x, y), (x[:16], y[:16])), "d.py:f", 8, max_train_samples=8,
                       max_val_samples=8)
    assert (bundle.label_kind, bundle.num_classes, bundle.train_samples) == ("sparse", 4, 8)


def test_an_empty_validation_dataset_is_one_line_as_empty_arrays_are():
    """Trained, exit 0, with val_loss nan and val_accuracy None."""
    import tensorflow as tf

    from app.task.user_data import from_user
    x, y = np.zeros((64, 4), np.float32), np.arange(64) % 3
    data = (tf.data.Dataset.from_tensor_slices((x, y)),
            tf.data.Dataset.from_tensor_slices((x, y)).take(0))
    with pytest.raises(UsageError, match=r"\(the validation dataset has no elements\)"):
        from_user(data, "d.py:f", 16)
    with pytest.raises(UsageError, match=r"\(validation: no samples\)"):
        from_user(((x, y), (x[:0], y[:0])), "d.py:f", 16)


def test_features_that_mix_text_and_numbers_are_one_line():
    """Made strings ('0.5'), they reached the built-in mlp, and TensorFlow's error said
    "your code raised ... running the model on one batch (mlp)"."""
    from app.task.user_data import from_user
    x = np.array([[0.5, 1.0]] * 40, dtype=object)
    x[21, 1] = "oops"
    y = np.arange(40) % 2
    with pytest.raises(UsageError, match=r"the training features mix text and numbers: row 21 "
                                         r"holds 'oops'"):
        from_user(((x, y), (x[:8], y[:8])), "d.py:f", 8)
    words = np.array([["a b"], ["c d"]] * 20, dtype=object)   # all text: a text model's input
    assert from_user(((words, y), (words[:8], y[:8])), "d.py:f", 8).input_shape == (1,)


def test_class_ids_spread_far_apart_get_a_note():
    """Ids 0, 1 and 10**6: the model got 1,000,001 outputs and trained at 2 samples/s."""
    from app.task.user_data import from_user
    x = np.zeros((60, 4), np.float32)
    y = np.array([0, 1, 10**6] * 20)
    bundle = from_user(((x, y), (x[:9], y[:9])), "d.py:f", 8)
    assert bundle.num_classes == 10**6 + 1
    assert bundle.notes == [
        "dataset 'd.py:f': its labels use 3 class id(s), up to 1000000, so the model gets "
        "1000001 outputs, most of which no label reaches; numbering the classes 0..2 (ids = "
        "np.unique(y, return_inverse=True)[1]) makes it 3"]
    dense = np.arange(60)   # ids 0..59, every one in use: no note
    assert from_user(((x, dense), (x[:9], dense[:9])), "d.py:f", 8).notes == []


def _tags(n=3000, seed=0):
    """Four tags a sample, each a rule of its own on the features (one of them not linear):
    a sample holds any number of them, none included."""
    x = np.random.default_rng(seed).normal(size=(n, 16)).astype(np.float32)
    y = np.stack([x[:, 0] > 0, x[:, 1] + x[:, 2] > 0, x[:, 3] * x[:, 4] > 0,
                  np.abs(x[:, 5]) > 1], axis=1).astype(np.float32)
    return _split(x, y, val=500)


def _tagger(activation):
    def build(input_shape, num_classes):
        import tensorflow as tf

        return tf.keras.Sequential([
            tf.keras.Input(shape=input_shape),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(num_classes, activation=activation, dtype="float32")])
    return build


@pytest.mark.parametrize("activation, loop", [(None, "fit"), ("sigmoid", "custom")])
def test_multi_hot_labels_train_as_tags_with_a_binary_cross_entropy(tmp_path, capfd, activation,
                                                                    loop):
    """Multi-hot rows were values: no loss by default, and with --loss binary_crossentropy
    the accuracy was none (MAE only when the units matched).  Now: a binary cross-entropy
    on every unit, from logits or not as the outputs are, and the share of tags right."""
    import app

    data = _tags()
    m = app.train(model=_tagger(activation), data=data, epochs=10, batch_size=32,
                  learning_rate=1e-2, loop=loop, precision="float32", progress="lines",
                  save_model=False, output=str(tmp_path / "run"))
    assert (m["data"]["label_kind"], m["data"]["num_classes"]) == ("multilabel", 4)
    said = capfd.readouterr()
    assert ("note: loss: binary_crossentropy on " + (
        "logits (from_logits=True)" if activation is None else
        "probabilities (the model's outputs lie in 0..1)")) in said.out + said.err
    # Guessing each tag's more common value is right 62% of the time; the rules are learnt.
    baseline = float(np.mean(np.maximum(data[1][1].mean(axis=0), 1 - data[1][1].mean(axis=0))))
    assert baseline < 0.7
    assert m["epochs"][-1]["val_accuracy"] >= 0.9, m["epochs"]


def test_binary_metrics_on_logits_read_them_as_logits(tmp_path):
    """One output unit without a sigmoid, 0/1 labels: the loss was taken from logits, the
    metrics not.  The accuracy thresholded at 0.5 (Keras' "accuracy" does the same), so a
    logit of 0.3 counted as class 0 though its probability is 0.57: on this data it read
    0.765 for 0.795; AUC, precision and recall read logits as probabilities (val_auc 0.55
    for 0.68, val_recall 0.01 for 0.12), and on Keras 2 their names ('auc', the example in
    --metrics' own help) were refused.  Each now reports what the model's own predictions
    give."""
    import tensorflow as tf

    import app
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 8)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0.8).astype(np.int64)      # a quarter of them class 1
    (xt, yt), (xv, yv) = _split(x, y, val=400)

    def build(input_shape, num_classes):
        return tf.keras.Sequential([tf.keras.Input(shape=input_shape),
                                    tf.keras.layers.Dense(16, activation="relu"),
                                    tf.keras.layers.Dense(1, dtype="float32")])
    m = app.train(model=build, data=((xt, yt), (xv, yv)), epochs=4, precision="float32",
                  metrics="accuracy,auc,precision,recall,true_positives", progress="lines",
                  output=str(tmp_path / "run"))
    model = tf.keras.models.load_model(m["model_path"], compile=False)
    logits = model.predict(xv, verbose=0).reshape(-1)
    right = float(np.mean((logits > 0) == yv))
    last = m["epochs"][-1]
    assert abs(last["val_accuracy"] - right) < 1e-6
    positive = logits > 0
    assert last["val_true_positives"] == float(np.sum(positive & (yv == 1)))
    assert last["val_precision"] == pytest.approx(np.sum(positive & (yv == 1)) / np.sum(positive))
    assert last["val_recall"] == pytest.approx(np.sum(positive & (yv == 1)) / np.sum(yv == 1))
    auc = tf.keras.metrics.AUC()
    auc.update_state(yv, tf.sigmoid(logits))
    assert last["val_auc"] == pytest.approx(float(auc.result()), abs=1e-4)
    # Where the two thresholds disagree on this model, the test tells them apart.
    assert np.any((logits > 0) != (logits > 0.5))


def test_multi_hot_labels_and_class_weights_are_one_line(tmp_path):
    import app

    with pytest.raises(UsageError, match=r"^error: class_weight weighs a sample by its one class, "
                                         r"and the labels of this data are multi-hot rows"):
        app.train(model=_tagger(None), data=_tags(800), class_weight="balanced", epochs=1,
                  output=str(tmp_path / "run"))
    with pytest.raises(UsageError, match=r"has 3 output unit\(s\) but the labels of dataset "
                                         r"'python:arrays' are multi-hot rows of 4"):
        app.train(model=lambda input_shape, num_classes: _tagger(None)(input_shape, 3),
                  data=_tags(800), epochs=1, output=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["auc", "precision", "recall", "true_positives", "AUC"])
def test_metric_names_in_snake_case_are_keras_classes_under_either_keras(name):
    """Keras 2 knows 'AUC' and 'TruePositives' only; Keras 3 and its docs say 'auc'."""
    from types import SimpleNamespace

    from app.task.losses import make_metric
    metric = make_metric(name, SimpleNamespace(label_kind="binary"), 1)
    assert metric.name == name
    assert type(metric).__name__.lower() == name.replace("_", "").lower()


def test_a_metric_that_needs_arguments_is_one_line():
    from types import SimpleNamespace

    from app.task.losses import make_metric
    with pytest.raises(UsageError) as caught:
        make_metric("mean_iou", SimpleNamespace(label_kind="sparse"), 3)
    assert str(caught.value) == (
        "error: metric 'mean_iou' (MeanIoU) needs arguments; allowed: a metric that takes "
        "none, or MODULE:OBJECT: a module of yours that builds it, e.g. mean_iou = "
        "tf.keras.metrics.MeanIoU(...)")


def test_a_class_cross_entropy_metric_on_logits_is_the_loss(tmp_path):
    """Three classes, logits: a cross-entropy named in --metrics read the logits as
    probabilities; given their softmax it is the loss itself (no sample weights)."""
    import tensorflow as tf

    import app
    rng = np.random.default_rng(0)
    x = rng.normal(size=(800, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)

    def build(input_shape, num_classes):
        return tf.keras.Sequential([tf.keras.Input(shape=input_shape),
                                    tf.keras.layers.Dense(num_classes, dtype="float32")])
    m = app.train(model=build, data=_split(x, y, val=200), epochs=2, precision="float32",
                  metrics="accuracy,sparse_categorical_crossentropy", progress="lines",
                  save_model=False, output=str(tmp_path / "run"))
    last = m["epochs"][-1]
    assert last["val_sparse_categorical_crossentropy"] == pytest.approx(last["val_loss"],
                                                                       rel=1e-5)


@pytest.mark.parametrize("softmax", [False, True])
def test_auc_precision_recall_of_class_ids_read_every_class(tmp_path, softmax):
    """Three classes as ids, against logits or a softmax: `--metrics auc` failed on the first
    step ("Shapes (None, 3) and (None, 1) are incompatible"), a traceback that left a run
    folder behind.  Such metrics now read one-hot rows against the class probabilities,
    as Keras reads one-hot labels (micro-averaged over the classes)."""
    import tensorflow as tf

    import app
    rng = np.random.default_rng(0)
    x = rng.normal(size=(800, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)

    def build(input_shape, num_classes):
        return tf.keras.Sequential([tf.keras.Input(shape=input_shape), tf.keras.layers.Dense(
            num_classes, activation="softmax" if softmax else None, dtype="float32")])
    m = app.train(model=build, data=_split(x, y, val=200), epochs=5, precision="float32",
                  metrics="accuracy,auc,precision,recall", progress="lines", learning_rate=0.05,
                  output=str(tmp_path / "run"))
    assert m["status"] == "completed"
    model = tf.keras.models.load_model(m["model_path"], compile=False)
    scores = model.predict(x[-200:], verbose=0)
    probabilities = scores if softmax else tf.nn.softmax(scores).numpy()
    one_hot = np.eye(3)[y[-200:]]
    last = m["epochs"][-1]
    auc = tf.keras.metrics.AUC()
    auc.update_state(one_hot, probabilities)
    assert last["val_auc"] == pytest.approx(float(auc.result()), abs=1e-4)
    chosen = probabilities > 0.5
    assert last["val_precision"] == pytest.approx(
        np.sum(chosen & (one_hot == 1)) / max(np.sum(chosen), 1), abs=1e-4)
    assert last["val_recall"] == pytest.approx(np.sum(chosen & (one_hot == 1)) / 200, abs=1e-4)
    assert last["val_auc"] > 0.8    # the model has learnt something to rank by


@pytest.mark.parametrize("form", ["arrays", "tf.data"])
def test_one_stray_huge_class_id_is_one_line_not_an_out_of_memory(form):
    """One label of 10**9 among ids 0..2: the model got 10**9 + 1 outputs and the run ended
    in "your code raised ResourceExhaustedError" (found by a QA pass)."""
    import tensorflow as tf

    from app.core.errors import UsageError
    from app.task.user_data import from_user

    x = np.random.default_rng(0).normal(size=(40, 4)).astype("float32")
    y = np.arange(40) % 3
    y[7] = 10 ** 9
    parts = ((x[:30], y[:30]), (x[30:], y[30:]))
    if form == "tf.data":
        parts = tuple(tf.data.Dataset.from_tensor_slices(p) for p in parts)
    with pytest.raises(UsageError) as caught:
        from_user(parts, "d.py:load", 8)
    line = caught.value.line()
    assert line.startswith("error: dataset 'd.py:load': its labels go up to class id 1000000000"
                           + (" (row 7 of the training labels)" if form == "arrays" else "")
                           + ", so the model would get 1000000001 outputs"), line
    assert line.endswith("allowed: class ids numbered 0..N-1 with N at most 1048576 (ids = "
                         "np.unique(y, return_inverse=True)[1] numbers them)"), line


@pytest.mark.parametrize("form", ["arrays", "tf.data"])
def test_nan_in_the_validation_features_is_one_line_naming_them(form):
    """Every epoch said val_loss=nan, the run "completed", and --early-stop stopped on it
    with no cause given (a QA pass); NaN in training rows is the sentinel's, at its step."""
    import tensorflow as tf

    from app.core.errors import UsageError
    from app.task.user_data import from_user

    x = np.random.default_rng(0).normal(size=(40, 4)).astype("float32")
    y = np.arange(40) % 3
    x[33, 1], x[38, 0] = np.inf, np.nan
    parts = ((x[:30], y[:30]), (x[30:], y[30:]))
    if form == "tf.data":
        parts = tuple(tf.data.Dataset.from_tensor_slices(p) for p in parts)
    with pytest.raises(UsageError) as caught:
        from_user(parts, "d.py:load", 8)
    where = "rows" if form == "arrays" else "elements"
    assert caught.value.line() == (
        f"error: dataset 'd.py:load': 2 validation sample(s) hold NaN or infinite values "
        f"({where} 3, 8); allowed: finite features: fix or drop those samples (the loss and the "
        "metrics of a sample with NaN are NaN)")
    x[[33, 38]] = 0.0   # and clean ones pass
    bundle = from_user(((x[:30], y[:30]), (x[30:], y[30:])), "d.py:load", 8)
    assert bundle.val_samples == 10


@pytest.mark.parametrize("form", ["arrays", "tf.data"])
@pytest.mark.parametrize("change, line", [
    (lambda y: np.where(np.arange(len(y)) == 5, -1, y),
     "validation label -1 ({where} 5{of}) is not a class id, as the training labels (0..2) "
     "are; allowed: class ids in the validation labels too: whole numbers 0..2"),
    (lambda y: y + 0.5,
     "validation label 1.5 ({where} 0{of}) is not a class id, as the training labels (0..2) "
     "are; allowed: class ids in the validation labels too: whole numbers 0..2"),
    (lambda y: np.where(np.arange(len(y)) == 5, 7, y),
     "validation label 7 ({where} 5{of}) is a class no training label has (they are class "
     "ids 0..2); allowed: validation labels among the training labels' classes 0..2, or "
     "--num-classes 8 or more when the training part lacks some classes"),
])
def test_validation_labels_are_read_by_the_training_labels_rule(form, change, line, tmp_path):
    """Validation labels went unchecked (a QA pass): -1 trained a whole epoch and died in
    the validation pass with TensorFlow's "Received a label value of -1" (exit 1), a 7
    among classes 0..2 gave the model 8 outputs, and labels + 0.5 were rounded down, both
    without a word.  One line before anything is written, as for training labels."""
    import tensorflow as tf

    import app

    x = np.random.default_rng(0).normal(size=(60, 4)).astype("float32")
    y = np.arange(60) % 3
    parts = ((x[:40], y[:40]), (x[40:], change(y[40:])))
    if form == "tf.data":
        parts = tuple(tf.data.Dataset.from_tensor_slices(p) for p in parts)
    with pytest.raises(UsageError) as caught:
        app.train(model=_dense([]), data=parts, epochs=1, precision="float32",
                  output=str(tmp_path / "run"))
    where, of = (("row", " of y_val") if form == "arrays"
                 else ("element", " of the validation dataset"))
    assert caught.value.line() == (f"error: dataset 'python:{form}': "
                                   + line.format(where=where, of=of))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("form", ["arrays", "tf.data"])
def test_a_validation_class_past_the_training_ones_is_fine_with_num_classes(form):
    import tensorflow as tf

    from app.task.user_data import from_user

    x = np.zeros((60, 4), np.float32)
    y = np.arange(60) % 3
    yv = y[40:].copy()
    yv[5] = 7
    parts = ((x[:40], y[:40]), (x[40:], yv))
    if form == "tf.data":
        parts = tuple(tf.data.Dataset.from_tensor_slices(p) for p in parts)
    assert from_user(parts, "d.py:f", 8, num_classes=8).num_classes == 8
    with pytest.raises(UsageError, match="num_classes 5 is too few for dataset 'd.py:f': its "
                                         "labels go up to class id 7"):
        from_user(parts, "d.py:f", 8, num_classes=5)
