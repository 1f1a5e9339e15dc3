"""A user's ``(train, val)`` unbatched ``tf.data.Dataset`` of ``(features, label)`` or
``(features, label, sample_weight)`` -> the run's batched pipelines.  A batched one is taken
apart first; unknown cardinality (after ``filter``, from generators) is fine: each dataset
is counted once, in the same pass that finds the number of classes and the elements that
hold NaN."""
from __future__ import annotations

from typing import NamedTuple, Optional

from app.task.data import DataBundle
from app.task.data_rows import MOST_LISTED, DatasetElements
from app.task.data_rules import (WEIGHTS_ALLOWED, check_class_count, finite_validation,
                                 given_classes, validation_class_id, weight_values,
                                 wrong_form)
from app.core.errors import UsageError

SHUFFLE_BUFFER = 10_000


def _element_parts(ds, spec, returned, which):
    """The (features, label[, sample_weight]) specs of ``ds``'s elements.  The features are
    one tensor, or a dict (or tuple) of them for a model of several inputs, as Keras takes
    them; the weight one number a sample."""
    import tensorflow as tf

    es = ds.element_spec
    if not isinstance(es, tuple) or len(es) not in (2, 3) \
            or not all(isinstance(s, tf.TensorSpec) for s in es[1:]) \
            or not _tensor_structure(es[0]):
        raise wrong_form(spec, returned, f"the {which} dataset's elements are {es}; expected "
                         "(features, label) or (features, label, sample_weight): "
                         "features one tensor or a dict of tensors (one per model "
                         "input), the label one tensor")
    return es


def _check_weight_spec(ds, spec, which) -> None:
    """A sample's weight (after the batches, if any, were taken apart): one number."""
    es = ds.element_spec
    if len(es) == 3 and (es[2].shape.num_elements() != 1 or not (
            es[2].dtype.is_floating or es[2].dtype.is_integer)):
        raise UsageError(f"dataset spec {spec!r}: the {which} dataset's sample weights are "
                         f"{es[2]}", WEIGHTS_ALLOWED + " (a scalar, or of shape (1,))")


def _batched(ds) -> bool:
    """Every part's first dimension unknown: batches, as Keras' own loaders give them
    (``image_dataset_from_directory`` and the like).  An unbatched dataset of sequences of
    varying length has scalar labels, so it does not look so."""
    import tensorflow as tf

    return all(s.shape.rank and s.shape[0] is None for s in tf.nest.flatten(ds.element_spec))


def _tensor_structure(spec) -> bool:
    """A tensor's spec, or a dict (string keys), tuple or list of them (not nested further:
    one tensor per model input)."""
    import tensorflow as tf

    if isinstance(spec, tf.TensorSpec):
        return True
    if isinstance(spec, dict):
        return bool(spec) and all(isinstance(k, str) and isinstance(v, tf.TensorSpec)
                                  for k, v in spec.items())
    return isinstance(spec, (tuple, list)) and bool(spec) and all(
        isinstance(v, tf.TensorSpec) for v in spec)


def _named_parts(features):
    """(name, part) for each feature: ``''`` for one tensor, `` 'a'`` for a dict's."""
    if isinstance(features, dict):
        return [(f" {k!r}", v) for k, v in features.items()]
    if isinstance(features, (tuple, list)):
        return [(f" [{i}]", v) for i, v in enumerate(features)]
    return [("", features)]


class Scan(NamedTuple):
    count: int            # elements
    top: int              # the largest label, for integer ids (else -1)
    low: int              # the smallest, for integer ids (else 0)
    onehot: bool          # for label rows: every row non-negative and summing to 1
    multihot: bool        # for label rows: every value 0 or 1
    bad: list             # the places of the first MOST_LISTED elements with NaN or inf
    bad_total: int        # how many hold NaN or inf
    weights: tuple = ()   # with sample weights: (NaN or inf, below zero, above zero) counts
    whole: bool = True    # for integer ids: every label a whole number (floating labels)


def _scan(ds, labels: Optional[str] = None, watch_finite: bool = False) -> Scan:
    """One pass over ``ds``: its elements; with ``labels`` "ids" the largest (integer
    scalars), with "rows" whether every row is a one-hot (or soft) label, and whether every
    value is 0 or 1 (multi-hot); NaN and inf only when ``watch_finite`` and a part is
    floating."""
    import tensorflow as tf

    from app.precision.finite import all_finite

    weighted = len(ds.element_spec) == 3
    # NaN in the data (features and labels); the weights are counted apart.
    floating = [i for i, spec in enumerate(tf.nest.flatten(ds.element_spec[:2]))
                if spec.dtype.is_floating]
    watch = bool(watch_finite and floating)

    def step(state, element):
        n, top, low, rows_ok, multihot, bad_total, bad, weights, whole = state
        y = element[1]
        if weighted:
            w = tf.cast(tf.reshape(element[2], []), tf.float32)
            weights = weights + tf.cast(tf.stack([tf.logical_not(tf.math.is_finite(w)),
                                                  w < 0.0, w > 0.0]), tf.int64)
        element = tf.nest.flatten(element[:2])
        if labels == "ids":
            top = tf.maximum(top, tf.cast(tf.reduce_max(y), tf.int64))
            low = tf.minimum(low, tf.cast(tf.reduce_min(y), tf.int64))
            if y.dtype.is_floating:   # a validation set's labels may be of another dtype
                whole = tf.logical_and(whole, tf.reduce_all(tf.equal(y, tf.math.floor(y))))
        elif labels == "rows":
            y = tf.cast(y, tf.float32)
            rows_ok = tf.logical_and(rows_ok, tf.logical_and(
                tf.reduce_min(y) >= 0.0, tf.abs(tf.reduce_sum(y) - 1.0) <= 1e-3))
            multihot = tf.logical_and(multihot, tf.reduce_all(
                tf.logical_or(tf.equal(y, 0.0), tf.equal(y, 1.0))))
        if watch:
            finite = all_finite([element[i] for i in floating])
            # The list is written only for a bad element (a cond: rewriting the whole list
            # for every element doubled the pass's time).
            slot = tf.minimum(bad_total, MOST_LISTED - 1)
            bad = tf.cond(tf.logical_and(tf.logical_not(finite), bad_total < MOST_LISTED),
                          lambda: tf.tensor_scatter_nd_update(bad, [[slot]], [n]),
                          lambda: bad)
            bad_total += tf.cast(tf.logical_not(finite), tf.int64)
        return n + 1, top, low, rows_ok, multihot, bad_total, bad, weights, whole
    start = (tf.constant(0, tf.int64), tf.constant(-1, tf.int64), tf.constant(0, tf.int64),
             tf.constant(True), tf.constant(True),
             tf.constant(0, tf.int64),
             tf.fill([MOST_LISTED if watch else 1], tf.constant(-1, tf.int64)),
             tf.zeros([3], tf.int64), tf.constant(True))
    n, top, low, rows_ok, multihot, bad_total, bad, weights, whole = ds.reduce(start, step)
    bad_total = int(bad_total.numpy())
    return Scan(int(n.numpy()), int(top.numpy()), int(low.numpy()), bool(rows_ok.numpy()),
                bool(multihot.numpy()), [int(i) for i in bad.numpy()[:bad_total]], bad_total,
                tuple(int(c) for c in weights.numpy()) if weighted else (),
                bool(whole.numpy()))


def _validation_ids(val, vscan: Scan, classes: int, spec: str, past_allowed: bool) -> None:
    """The validation labels are class ids when the training labels are, as for arrays
    (``data_rules.validation_class_id``): none negative, none a fraction, and none past the
    training labels' classes unless ``num_classes`` says more (``given_classes`` checks it)
    or only some training elements were counted (--max-train-samples).  The element is
    found in a second pass, only when there is one."""
    import tensorflow as tf

    not_ids = vscan.low < 0 or not vscan.whole
    if not not_ids and (past_allowed or vscan.top < classes):
        return

    def bad(i, element):
        y = tf.cast(element[1], tf.float64)
        wrong = tf.logical_or(tf.reduce_any(y < 0), tf.reduce_any(tf.not_equal(y, tf.floor(y))))
        return wrong if not_ids else tf.reduce_any(y >= classes)
    for i, element in val.enumerate().filter(bad).take(1):
        y = tf.reshape(element[1], [-1]).numpy()
        if not_ids:
            y = y[(y < 0) | (y != y.astype("int64"))]
        else:
            y = y[y >= classes]
        value = y[0].item()
        validation_class_id(spec, int(value) if not not_ids else value,
                            f"element {int(i)} of the validation dataset", classes,
                            past=not not_ids)


def from_datasets(train, val, spec, global_batch, seed, max_train, max_val, input_shape,
                  num_classes):
    import tensorflow as tf

    returned = (train, val)
    notes = []
    _element_parts(train, spec, returned, "training")
    _element_parts(val, spec, returned, "validation")
    if _batched(train) or _batched(val):
        # The app batches at the global batch (the replicas, --accumulate and tune decide
        # it): the user's batches are taken apart first, their samples kept in order.
        first = tf.nest.flatten(train.element_spec)[0]
        train, val = (ds.unbatch() if _batched(ds) else ds for ds in (train, val))
        notes.append(f"dataset {spec!r} came batched (elements of shape {first.shape}): "
                     "its batches are taken apart and the samples batched again at the "
                     "run's global batch")
    for ds, which in ((train, "training"), (val, "validation")):
        _check_weight_spec(ds, spec, which)
    fx, fy = train.element_spec[:2]
    for name, part in _named_parts(fx):
        if not part.shape.is_fully_defined():
            raise wrong_form(spec, returned, f"training features{name} have shape {part.shape}; "
                             "every sample needs the same, fully known shape")
    for ds, which in ((train, "training"), (val, "validation")):
        if int(ds.cardinality().numpy()) == tf.data.INFINITE_CARDINALITY:
            raise wrong_form(spec, returned, f"the {which} dataset is infinite (repeat()); an "
                             "epoch needs a finite dataset")
    if max_train:
        train = train.take(max_train)
    if max_val:
        val = val.take(max_val)
    if fy.dtype == tf.string:
        raise UsageError(f"dataset spec {spec!r}: the training labels are strings, not class ids",
                         "class ids 0..N-1 (a tf.keras.layers.StringLookup maps them, "
                         "num_oov_indices=0), one-hot rows, or values with a --loss for them")
    integer_labels = fy.dtype.is_integer and fy.shape.rank == 0
    rows = ((fy.dtype.is_floating or fy.dtype.is_integer) and fy.shape.rank == 1
            and (fy.shape[0] or 0) > 1)
    labels = "ids" if integer_labels else "rows" if rows else None
    scan = _scan(train, labels, watch_finite=True)
    vlabel = val.element_spec[1]
    vscan = _scan(val, labels if vlabel.dtype.is_floating or vlabel.dtype.is_integer
                  else None, watch_finite=True)
    finite_validation(spec, vscan.bad, vscan.bad_total, "elements")
    n_train, n_val, bad, bad_total = scan.count, vscan.count, scan.bad, scan.bad_total
    if n_train == 0:
        raise wrong_form(spec, returned, "the training dataset has no elements")
    if n_val == 0:   # as for arrays: no validation metric would be a number
        raise wrong_form(spec, returned, "the validation dataset has no elements")
    for which, counted in (("training", scan), ("validation", vscan)):
        if counted.weights:
            nonfinite, negative, positive = counted.weights
            weight_values(spec, which, (nonfinite, ()), (negative, ()),
                          all_zero=positive == 0)
    if integer_labels and scan.low >= 0:
        _validation_ids(val, vscan, scan.top + 1, spec,
                        past_allowed=bool(num_classes or max_train))
        top = max(scan.top, vscan.top)
        kind, classes = ("binary" if top <= 1 else "sparse"), top + 1
        check_class_count(spec, classes)
    elif rows and scan.onehot:   # the training labels decide, as for arrays (label_kind_of)
        kind, classes = "onehot", int(fy.shape[0])
    elif rows and scan.multihot:
        kind, classes = "multilabel", int(fy.shape[0])
    else:   # values: negative ids, rows neither one- nor multi-hot: not class labels
        kind, classes = "other", max(1, fy.shape.num_elements() or 1)
    several = not isinstance(fx, tf.TensorSpec)
    # One tensor may be reshaped for a built-in model; several inputs go as they are.
    shapes = [tuple(int(d) for d in s.shape) for s in tf.nest.flatten(fx)]
    if not several:
        shapes = [input_shape(shapes[0])]
    shape = tf.nest.pack_sequence_as(fx, shapes) if several else shapes[0]

    def feature(x, shape):
        if x.dtype == tf.uint8:
            x = tf.cast(x, tf.float32) / 255.0
        elif x.dtype != tf.float32 and (x.dtype.is_floating or (
                x.dtype.is_integer and not several)):
            # One input: numbers as float32.  Of several, integers stay what they are (the
            # ids an Embedding or a lookup layer takes; float32 would round ids past 2**24).
            x = tf.cast(x, tf.float32)
        return tf.reshape(x, shape)

    def prepare(x, y, *weight):
        x = tf.nest.pack_sequence_as(x, [feature(t, s) for t, s in
                                         zip(tf.nest.flatten(x), shapes)])
        if kind in ("sparse", "binary"):
            y = tf.cast(y, tf.int32)
        elif (y.dtype.is_floating or y.dtype.is_integer) and y.dtype != tf.float32:
            y = tf.cast(y, tf.float32)
        return (x, y) + tuple(tf.cast(tf.reshape(w, []), tf.float32) for w in weight)
    # The counted sizes are asserted so Keras' progress bars and the step counts know them.
    mapped = train.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    sample = next(iter(mapped.batch(8).take(1)))
    train = (mapped.apply(tf.data.experimental.assert_cardinality(n_train))
             .shuffle(min(n_train, SHUFFLE_BUFFER), seed=seed, reshuffle_each_iteration=True)
             .batch(global_batch).prefetch(tf.data.AUTOTUNE))
    val = (val.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
           .apply(tf.data.experimental.assert_cardinality(n_val))
           .batch(global_batch).prefetch(tf.data.AUTOTUNE))
    return DataBundle(train, val, shape, given_classes(spec, num_classes, kind, classes),
                      n_train, n_val, label_kind=kind, sample_batch=tf.nest.map_structure(
                          lambda t: t.numpy(), tuple(sample)),
                      weighted=len(train.element_spec) == 3,
                      train_rows=DatasetElements(n_train, bad, bad_total,
                                                 first_only=bool(max_train)), notes=notes)
