"""The loss and the metrics of a task: Keras names, MODULE:OBJECT specs or objects, turned
into a per-example loss on float32 predictions and fresh metric objects.

A name chosen by the user wins; without one, the loss follows the labels (one-hot ->
categorical, multi-hot -> binary on every unit, a single sigmoid unit -> binary, else sparse
categorical cross-entropy) and whether the model's outputs are probabilities (softmax,
sigmoid) or logits; so does the accuracy (on logits a binary accuracy thresholds at 0, not
at 0.5).
"""
from __future__ import annotations

from typing import Optional

from app.task import user_code as specs
from app.core.errors import UsageError

DEFAULT_LOSS = "sparse_categorical_crossentropy"
DEFAULT_METRICS = ("accuracy",)


def make_loss(loss_spec, bundle, units, probabilities: bool, notes: list, explain: bool):
    """The per-example loss (float32 predictions): ``loss_spec`` (a Keras name, MODULE:OBJECT
    or an object), else the cross-entropy that fits the labels, from logits unless
    ``probabilities`` (``outputs_look_like_probabilities``).  With ``explain``, a note says
    which default was chosen and why (the user's own model: the built-ins need no
    explaining)."""
    import tensorflow as tf

    if loss_spec is None:
        if bundle.label_kind == "other":
            raise UsageError(f"the labels are not class ids ({_labels_seen(bundle)}), and no "
                             "loss fits them by default",
                             "a loss for them: --loss mse (mae, huber, ... or MODULE:OBJECT; "
                             "loss= in app.train, or the model compiled with one); or class "
                             "ids 0..N-1, one-hot rows, or multi-hot rows of 0s and 1s")
        if bundle.label_kind == "onehot":
            name = "categorical_crossentropy"
        elif _binary(bundle, units):
            name = "binary_crossentropy"
        else:
            name = DEFAULT_LOSS
        from_logits = not probabilities
        cls = {"categorical_crossentropy": tf.keras.losses.CategoricalCrossentropy,
               "binary_crossentropy": tf.keras.losses.BinaryCrossentropy,
               DEFAULT_LOSS: tf.keras.losses.SparseCategoricalCrossentropy}[name]
        loss = cls(from_logits=from_logits, reduction="none")
        if explain:
            notes.append(f"loss: {name} on "
                         + ("logits (from_logits=True): the model's outputs are not "
                            "probabilities" if from_logits else
                            "probabilities (the model's outputs sum to 1)"
                            if name == "categorical_crossentropy" or name == DEFAULT_LOSS else
                            "probabilities (the model's outputs lie in 0..1)"))
        return per_example(loss, name)
    loss = keras_object(loss_spec, "loss", tf.keras.losses.get,
                         "a Keras loss name (e.g. sparse_categorical_crossentropy, mse) "
                         "or MODULE:OBJECT", namespace=tf.keras.losses)
    if isinstance(loss, tf.keras.losses.Loss):
        cfg = loss.get_config()
        cfg["reduction"] = "none"
        try:
            loss = type(loss).from_config(cfg)
        except Exception:  # a custom Loss without a round-tripping config: use as is
            pass
    if not callable(loss):
        raise UsageError(f"loss {spec_text(loss_spec)!r} is a {type(loss).__name__}, not a loss",
                         "a Keras loss name, a keras.losses.Loss, or a function "
                         "(y_true, y_pred) -> per-example loss")
    return per_example(loss, spec_text(loss_spec))


def default_metrics(bundle, units) -> list:
    """Accuracy for class labels; for labels that are values, the mean absolute error when
    the outputs match them one for one, else none."""
    if bundle.label_kind != "other":
        return list(DEFAULT_METRICS)
    return ["mae"] if units is not None and units == bundle.num_classes else []


def _labels_seen(bundle) -> str:
    """What the first labels look like: 'labels such as 0.25, -1.5, 2'."""
    import numpy as np

    sample = getattr(bundle, "sample_batch", None)
    if sample is None:
        return "of a kind no loss is chosen for"
    y = np.asarray(sample[1])
    seen = list(dict.fromkeys(float(v) for v in y.reshape(-1)))[:3]
    per = f", {int(np.prod(y.shape[1:]))} values a sample" if y.ndim > 1 else ""
    return f"labels such as {', '.join(f'{v:g}' for v in seen)}{per}"


def spec_text(spec) -> Optional[str]:
    """A loss or metric spec as text (metrics.json, messages)."""
    if spec is None or isinstance(spec, str):
        return spec
    return getattr(spec, "name", None) or getattr(spec, "__name__", None) or type(spec).__name__


def outputs_look_like_probabilities(model, prediction, label_kind: str = "sparse") -> bool:
    """Softmax outputs are non-negative and sum to 1, sigmoid ones (a single unit, or one a
    label of multi-hot rows) lie in 0..1; logits almost never do."""
    import numpy as np
    import tensorflow as tf

    if prediction is None:
        last = model.layers[-1] if model.layers else None
        act = getattr(getattr(last, "activation", None), "__name__", "")
        if label_kind in ("multilabel", "binary") and act == "sigmoid":
            return True
        return act == "softmax" or type(last).__name__ == "Softmax"
    y = np.asarray(tf.cast(prediction, tf.float32))
    if y.ndim < 2 or y.shape[-1] == 1 or label_kind == "multilabel":
        return bool(((y >= 0) & (y <= 1)).all())   # sigmoid outputs, one a unit
    return bool((y >= -1e-3).all() and np.allclose(y.sum(axis=-1), 1.0, atol=2e-2))


def per_example(loss, name: Optional[str] = None):
    """Per-example losses computed on float32 predictions whatever the model's output dtype
    (a 16-bit softmax or log-softmax loses the small probabilities; build() warns).
    ``name``: the loss as the user knows it (``name_of``)."""
    import tensorflow as tf

    def on_float32(y_true, y_pred):
        if y_pred.dtype != tf.float32:
            y_pred = tf.cast(y_pred, tf.float32)
        # One value a sample, (batch,) labels against a (batch, 1) output: Keras 2's loss
        # functions (mse, mae, ...) broadcast them to (batch, batch) and learn only the mean,
        # with no error; Keras wraps them in a Loss that lines them up, and so does this.
        if y_true.shape.rank is not None and y_pred.shape.rank == y_true.shape.rank + 1 \
                and y_pred.shape[-1] == 1:
            y_true = tf.expand_dims(y_true, -1)
        return loss(y_true, y_pred)
    own = getattr(loss, "__name__", None) or getattr(loss, "name", None)
    on_float32.__name__ = own or "loss"
    on_float32.loss_name = name or own
    return on_float32


def name_of(loss_fn) -> Optional[str]:
    """The name of the loss a run uses (``make_loss``'s function): the spec as given (a
    Keras name, MODULE:OBJECT, the user's function's name), else the default chosen
    (sparse_categorical_crossentropy, ...); None when it has none.  The sentinel's report
    names the loss with it: the spec alone was None for the default loss, and the report
    said "the loss (None)"."""
    name = getattr(loss_fn, "loss_name", None)
    return str(name) if name else None


def keras_object(spec, what: str, keras_get, allowed: str, namespace=None):
    """A loss or metric named by ``spec``: ``MODULE:OBJECT`` (a class is instantiated with no
    arguments), a Keras identifier through ``keras_get`` (or a class of ``namespace`` by its
    snake_case name), or an object given directly."""
    obj = spec
    if isinstance(spec, str) and specs.is_user_spec(spec):
        obj = specs.load_object(spec, what)
    elif isinstance(spec, str):
        try:
            obj = keras_get(spec)
        except (ValueError, TypeError):
            cls = class_by_snake_name(spec, namespace)
            if cls is None:
                raise UsageError(f"{what} {spec!r} is not a Keras {what}", allowed) from None
            try:
                return cls()
            except TypeError:   # MeanIoU(num_classes), ...: not one a name can give
                raise UsageError(f"{what} {spec!r} ({cls.__name__}) needs arguments",
                                 f"a {what} that takes none, or MODULE:OBJECT: a module of "
                                 f"yours that builds it, e.g. {spec.lower()} = "
                                 f"tf.keras.metrics.{cls.__name__}(...)") from None
    if isinstance(obj, type):
        obj = specs.call_user(obj, spec_text(spec), what, {})
    return obj


def class_by_snake_name(spec: str, namespace):
    """Keras 2 knows its loss and metric classes by their class names only ('AUC',
    'TruePositives'), Keras 3 and its docs by snake_case too ('auc', 'true_positives'): the
    class of ``namespace`` (``tf.keras.metrics``) whose name is ``spec`` without its
    underscores, whatever the case; None when there is none."""
    if namespace is None:
        return None
    key = spec.replace("_", "").lower()
    for name in dir(namespace):
        obj = getattr(namespace, name, None)
        if isinstance(obj, type) and name.lower() == key:
            return obj
    return None


def make_metric(spec, bundle, units, probabilities: bool = True):
    """A fresh Keras metric object for ``spec`` (the loops each need their own).
    "accuracy" is the one that fits the labels; a binary one (a single unit, or multi-hot
    labels: the share of units right) thresholds logits at 0 and probabilities at 0.5
    (Keras' own "accuracy" takes 0.5 for both, so logits of 0..0.5 count as class 0)."""
    import tensorflow as tf

    if spec in ("accuracy", "acc"):
        if bundle.label_kind == "onehot":
            return tf.keras.metrics.CategoricalAccuracy(name="accuracy")
        if _binary(bundle, units):
            return tf.keras.metrics.BinaryAccuracy(name="accuracy",
                                                   threshold=0.5 if probabilities else 0.0)
        return tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    obj = keras_object(spec, "metric", tf.keras.metrics.get,
                       "Keras metric names (e.g. accuracy, mae, auc) or MODULE:OBJECT, "
                       "comma-separated", namespace=tf.keras.metrics)
    named = isinstance(spec, str) and not specs.is_user_spec(spec)
    # A metric of probabilities that Keras would read logits with (thresholds at 0.5, or,
    # Keras 2, "predictions must be >= 0"): given the sigmoid of the outputs (one unit,
    # multi-hot labels), or their softmax (a row of class scores).  Only the ones named
    # here; a metric object of the user's reads the outputs as they are.
    # Such a metric with class labels against a row of class scores (AUC of ten classes)
    # reads every class as a positive-or-not column, as Keras does with one-hot labels
    # (micro-averaged): class ids are made one-hot rows first (as they are, Keras failed on
    # the first step: "Shapes (None, 3) and (None, 1) are incompatible").
    squash, classes = None, None
    class_labels = bundle.label_kind in ("sparse", "onehot", "binary")
    if named and _metric_name(obj) in _OF_PROBABILITIES:
        if _binary(bundle, units) and not probabilities:
            squash = tf.sigmoid
        elif class_labels and (units or 1) > 1:
            squash = None if probabilities else tf.nn.softmax
            classes = units if bundle.label_kind != "onehot" else None
    elif (named and not probabilities and class_labels
          and _metric_name(obj) in _OF_CLASS_PROBABILITIES):
        squash = tf.nn.softmax
    wrapped = squash is not None or classes is not None
    if isinstance(obj, tf.keras.metrics.Metric):
        config = obj.get_config()
        if named:
            config["name"] = spec   # as typed, in both Kerases ('mae', not mean_absolute_error)
        return (_on(type(obj), squash, classes) if wrapped else type(obj)).from_config(config)
    if callable(obj):
        name = spec if named else getattr(obj, "__name__", "metric")
        fn = obj
        if wrapped:
            def fn(y_true, y_pred, f=obj):
                return f(*_read_as_probabilities(y_true, y_pred, squash, classes))
        return tf.keras.metrics.MeanMetricWrapper(fn, name=name)
    raise UsageError(f"metric {spec!r} is a {type(obj).__name__}, not a metric",
                     "a Keras metric name, a keras.metrics.Metric, or a function")


# Keras metrics that read the outputs as probabilities of the positive class (by class or
# function name): thresholds, confusion counts, curves, a binary cross-entropy.
_OF_PROBABILITIES = {
    "AUC", "Precision", "Recall", "TruePositives", "TrueNegatives", "FalsePositives",
    "FalseNegatives", "PrecisionAtRecall", "RecallAtPrecision", "SensitivityAtSpecificity",
    "SpecificityAtSensitivity", "BinaryAccuracy", "BinaryCrossentropy", "BinaryIoU",
    "F1Score", "FBetaScore", "binary_accuracy", "binary_crossentropy"}
# ... and those that read a row of class probabilities (accuracies and top-k take the
# largest score, the same for logits).
_OF_CLASS_PROBABILITIES = {
    "CategoricalCrossentropy", "SparseCategoricalCrossentropy", "KLDivergence",
    "categorical_crossentropy", "sparse_categorical_crossentropy", "kl_divergence",
    "kullback_leibler_divergence"}


def _binary(bundle, units) -> bool:
    """Labels a binary read fits: 0/1 against one unit, or multi-hot rows."""
    return bundle.label_kind == "multilabel" or (bundle.label_kind == "binary" and units == 1)


def _metric_name(obj) -> str:
    """A Keras metric's class name, or its function's name (Keras 3's MeanMetricWrapper of
    a function keeps it as ``fn``)."""
    name = getattr(obj, "__name__", None) or type(obj).__name__
    if getattr(obj, "get_config", None) is not None and getattr(obj, "fn", None) is not None:
        name = getattr(obj.fn, "__name__", name)
    return name


def _read_as_probabilities(y_true, y_pred, squash, classes):
    """(labels, outputs) as a metric of probabilities reads them: class ids as one-hot rows
    of ``classes`` (None: as they are), the outputs in float32 through ``squash``."""
    import tensorflow as tf

    y_pred = tf.cast(y_pred, tf.float32)
    if classes is not None:
        y_true = tf.one_hot(tf.cast(tf.reshape(y_true, [-1]), tf.int32), classes)
    return y_true, (squash(y_pred) if squash is not None else y_pred)


def _on(cls, squash=None, classes=None):
    """``cls`` updated with ``squash`` (sigmoid, softmax) of the outputs (logits), and with
    class-id labels as one-hot rows of ``classes``: the metric's own variables, config and
    name, so both Kerases' loops treat it as the class it is."""
    class OnProbabilities(cls):
        def update_state(self, y_true, y_pred, sample_weight=None):
            return super().update_state(*_read_as_probabilities(y_true, y_pred, squash, classes),
                                        sample_weight=sample_weight)
    OnProbabilities.__name__ = OnProbabilities.__qualname__ = cls.__name__
    return OnProbabilities


def weighted(per_example, sample_weight=None):
    """Each sample's loss times its weight, as Keras' fit weighs ``sample_weight`` (the
    sum is then divided by the batch's size, not by the weights' sum, as Keras does)."""
    if sample_weight is None:
        return per_example
    import tensorflow as tf

    return per_example * tf.cast(tf.reshape(sample_weight, tf.shape(per_example)),
                                 per_example.dtype)
