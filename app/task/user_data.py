"""A user's dataset function's return value -> the same batched pipelines as the built-ins.

Three forms are accepted, exactly what users already have:

* ``((x_train, y_train), (x_val, y_val))`` NumPy arrays, what ``keras.datasets.*.load_data()``
  returns; either part may be ``(x, y, sample_weight)``, as Keras' ``fit`` takes it.
  ``uint8`` features are scaled to float32 in [0, 1] (as the built-ins are); other numeric
  features become float32.
* ``(train, val)`` *unbatched* ``tf.data.Dataset`` of ``(features, label)`` or ``(features,
  label, sample_weight)`` (a batched one is taken apart first).  Unknown cardinality (after
  ``filter``, from generators) is fine: each dataset is counted once, in the same pass that
  finds the number of classes.
* ``(train, val)`` Keras ``Sequence`` s of batches (``app.task.sequences``): made datasets.

The app then shuffles, batches (the global batch), prefetches and, under a strategy,
distributes them.  Anything else is one ``UsageError`` naming the spec, what was
expected and what was received.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import numpy as np

from app.task import array_file, sequences
from app.task.data import DataBundle, make_dataset
from app.task.data_rows import MOST_LISTED, DataRows, DatasetElements, unread_rows
from app.core.errors import UsageError

EXPECTED = ("((x_train, y_train), (x_val, y_val)) NumPy arrays, (train, val) unbatched "
            "tf.data.Dataset of (features, label), or (train, val) Keras Sequences of "
            "batches; (x, y, sample_weight) and (features, label, sample_weight) with a "
            "weight a sample")
WEIGHTS_ALLOWED = "one finite, non-negative number a sample, not all zero"
SHUFFLE_BUFFER = 10_000


def _received(obj) -> str:
    if isinstance(obj, (tuple, list)):
        inner = ", ".join(_received(o) for o in obj[:3])
        return f"{type(obj).__name__} of {len(obj)} ({inner}{', ...' if len(obj) > 3 else ''})"
    shape = getattr(obj, "shape", None)
    return type(obj).__name__ + (f" shape {tuple(shape)}" if shape is not None else "")


def _bad(spec: str, returned, why: str = "") -> UsageError:
    if array_file.is_array_file(spec):   # the user wrote arrays, not a function returning them
        return UsageError(f"dataset file {spec!r}: {why}", array_file.LAYOUT)
    return UsageError(f"dataset spec {spec!r} returned {_received(returned)}"
                      + (f" ({why})" if why else ""), EXPECTED)


def _finite_labels(spec: str, which: str, y) -> None:
    """Labels with NaN or inf are a fault of the data, named with their rows: they read as
    values, not class ids (so the run asked for a regression loss), and any loss of them
    is NaN from the first batch that holds one."""
    y = np.asarray(y)
    if not np.issubdtype(y.dtype, np.floating):
        return
    bad = np.flatnonzero(~np.isfinite(y.reshape(len(y), -1)).all(axis=1))
    if bad.size:
        rows = ", ".join(str(int(r)) for r in bad[:5]) + (", ..." if bad.size > 5 else "")
        raise UsageError(f"dataset {spec!r}: {bad.size} {which} label(s) are NaN or infinite "
                         f"(rows {rows})", "finite labels: fix or drop those rows")


def _given_classes(spec: str, num_classes: Optional[int], kind: str, counted: int) -> int:
    """The class count: ``num_classes`` when given, else the one the labels show.  A count
    given that the labels do not fit (a class id past it, one-hot rows of another width)
    is one line, where the loss would fail on the first batch with TensorFlow's error."""
    if not num_classes:
        if kind in ("sparse", "binary") and counted == 1:
            # A one-unit model trained on it learns nothing, at accuracy 0, without a word.
            raise UsageError(f"dataset {spec!r}: every label is class 0, one class: there is "
                             "nothing to tell apart",
                             "labels of two classes or more, or --num-classes N when this "
                             "part of the data holds one class of N")
        return counted
    if kind in ("sparse", "binary") and counted > num_classes:
        raise UsageError(f"num_classes {num_classes} is too few for dataset {spec!r}: its "
                         f"labels go up to class id {counted - 1}",
                         f"num_classes {counted} or more, or leave it unset to count the labels")
    if kind in ("onehot", "multilabel") and counted != num_classes:
        rows = "one-hot" if kind == "onehot" else "multi-hot"
        raise UsageError(f"num_classes {num_classes} does not fit dataset {spec!r}: its labels "
                         f"are {rows} rows of {counted}",
                         f"num_classes {counted}, or leave it unset to count the labels")
    return num_classes


def from_user(returned, spec: str, global_batch: int, *, seed: int = 0,
              max_train_samples: Optional[int] = None, max_val_samples: Optional[int] = None,
              input_shape: Callable[[tuple], tuple] = tuple,
              num_classes: Optional[int] = None) -> DataBundle:
    import tensorflow as tf

    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        raise _bad(spec, returned, "expected a pair: training and validation data")
    train, val = returned
    if sequences.is_sequence(train) and sequences.is_sequence(val):   # keras.utils.Sequence
        train, val = (sequences.as_dataset(part, spec, which)
                      for part, which in ((train, "training"), (val, "validation")))
    if isinstance(train, tf.data.Dataset) and isinstance(val, tf.data.Dataset):
        return _from_datasets(train, val, spec, global_batch, seed, max_train_samples,
                              max_val_samples, input_shape, num_classes)
    if isinstance(train, tf.data.Dataset) or isinstance(val, tf.data.Dataset) or \
            sequences.is_sequence(train) or sequences.is_sequence(val):
        raise _bad(spec, returned, "both parts must be tf.data datasets, both Keras "
                                   "Sequences, or both (x, y) arrays")
    if _one_pair(train, val):
        n = len(train)
        raise UsageError(f"dataset spec {spec!r} returned one (x, y) pair of {n} samples: the "
                         "validation data is missing",
                         "((x_train, y_train), (x_val, y_val)), e.g. the last tenth held out: "
                         f"((x[:{n - n // 10}], y[:{n - n // 10}]), (x[{n - n // 10}:], "
                         f"y[{n - n // 10}:])) after shuffling them together")
    return _from_arrays(train, val, spec, global_batch, seed, max_train_samples,
                        max_val_samples, input_shape, num_classes)


# ---- arrays ------------------------------------------------------------------------------------

def _one_pair(train, val) -> bool:
    """(x, y) itself where ((x_train, y_train), (x_val, y_val)) was expected: two arrays
    (not pairs) of the same length."""
    return (isinstance(train, np.ndarray) and isinstance(val, np.ndarray)
            and train.ndim >= 1 and val.ndim >= 1 and len(train) == len(val))


def _part(part, spec, returned, which):
    """(x, y, sample weights or None) arrays of one part: (x, y) or (x, y, sample_weight)."""
    if not isinstance(part, (tuple, list)) or len(part) not in (2, 3):
        raise _bad(spec, returned, f"the {which} part must be (x, y) or (x, y, sample_weight)")
    x, y = _pair(part[:2], spec, returned, which)
    return x, y, (_weights(part[2], len(y), spec, which) if len(part) == 3 else None)


def _weights(w, n: int, spec: str, which: str) -> np.ndarray:
    """One weight a sample, as Keras' fit takes ``sample_weight``: float32, shape (n,)."""
    try:
        w = np.asarray(w, dtype=np.float64)
    except (TypeError, ValueError):
        raise UsageError(f"dataset spec {spec!r}: the {which} sample weights are not numbers",
                         WEIGHTS_ALLOWED) from None
    if w.ndim == 2 and w.shape[1] == 1:
        w = w[:, 0]
    if w.shape != (n,):
        raise UsageError(f"dataset spec {spec!r}: the {which} sample weights have shape "
                         f"{w.shape} for {n} samples", WEIGHTS_ALLOWED + f": shape ({n},)")
    bad, negative = np.flatnonzero(~np.isfinite(w)), np.flatnonzero(w < 0)
    _weight_values(spec, which, (len(bad), bad[:5]), (len(negative), negative[:5]),
                   all_zero=not np.any(w))
    return w.astype(np.float32)


def _weight_values(spec: str, which: str, bad: tuple, negative: tuple, all_zero: bool) -> None:
    """Refuse weights no loss can use: NaN or inf, below zero, or every one zero.  ``bad``
    and ``negative``: (how many, the first rows)."""
    for (count, rows), what in ((bad, "NaN or inf"), (negative, "below zero")):
        if count:
            listed_rows = ", ".join(str(int(i)) for i in rows) + (
                ", ..." if count > len(rows) else "")
            raise UsageError(f"dataset spec {spec!r}: {count} {which} sample weight(s) "
                             f"are {what}" + (f" (rows {listed_rows})" if len(rows) else ""),
                             WEIGHTS_ALLOWED)
    if all_zero:
        raise UsageError(f"dataset spec {spec!r}: every {which} sample weight is 0, so "
                         "nothing would be " + ("learned" if which == "training" else "measured"),
                         WEIGHTS_ALLOWED)


def _pair(part, spec, returned, which):
    """(x, y) arrays of one part; x one array, or a dict of them (one per model input)."""
    if isinstance(part[0], dict):
        return _inputs_pair(part, spec, returned, which)
    try:
        x, y = np.asarray(part[0]), np.asarray(part[1])
    except Exception:  # ragged lists and the like
        raise _bad(spec, returned, f"the {which} part cannot be made into arrays") from None
    if y.dtype.kind in "USO" and y.ndim >= 1 and len(y) and isinstance(
            y.reshape(-1)[0], (str, bytes)):
        raise UsageError(f"dataset spec {spec!r}: the {which} labels are strings (e.g. "
                         f"{str(y.reshape(-1)[0])!r}), not class ids",
                         "class ids 0..N-1 (names, ids = np.unique(y, return_inverse=True) "
                         "maps them), one-hot rows, or values with a --loss for them")
    mixed = _mixed_text_row(x) if x.dtype.kind == "O" and x.size else None
    if mixed is not None:   # made strings, its numbers read "0.5" and a numeric model failed
        raise _bad(spec, returned, f"the {which} features mix text and numbers: row "
                                   f"{mixed[0]} holds {str(mixed[1])[:40]!r}")
    x = _text(x)
    if x.dtype.kind not in "biufUS" or y.dtype.kind not in "biuf" or x.ndim < 1 or y.ndim < 1:
        raise _bad(spec, returned, f"the {which} part must be numeric arrays (features may "
                                   "be text, for a model that reads strings)")
    if len(x) != len(y):
        raise _bad(spec, returned, f"{which}: {len(x)} samples but {len(y)} labels")
    if len(x) == 0:
        raise _bad(spec, returned, f"{which}: no samples")
    return x, y


def _inputs_pair(part, spec, returned, which):
    """(dict of arrays, y): every input checked as one x is, the same rows in each."""
    inputs = part[0]
    if not inputs or not all(isinstance(k, str) for k in inputs):
        raise _bad(spec, returned, f"the {which} features are a dict: it needs string keys "
                                   "(the model's input names) and at least one array")
    pairs = {k: _pair((v, part[1]), spec, returned, f"{which} input {k!r}")
             for k, v in inputs.items()}
    return {k: x for k, (x, _) in pairs.items()}, next(iter(pairs.values()))[1]


def _text(x: np.ndarray) -> np.ndarray:
    """An object array of Python strings (what pandas gives) as a string array; text features
    go to the model as they are (a TextVectorization or StringLookup layer reads them).  The
    caller has refused one that mixes strings with numbers (``_mixed_text_row``)."""
    if x.dtype.kind == "O" and x.size and isinstance(x.reshape(-1)[0], (str, bytes)):
        try:
            return x.astype(type(x.reshape(-1)[0]))
        except (TypeError, ValueError):
            return x
    return x


def _mixed_text_row(x: np.ndarray):
    """(row, value) of the first string in an object array that also holds other things
    (numbers, None), else None."""
    flat = x.reshape(len(x), -1) if x.ndim else x.reshape(1, -1)
    is_text = np.vectorize(lambda v: isinstance(v, (str, bytes)), otypes=[bool])(flat)
    if is_text.all() or not is_text.any():
        return None
    row = int(np.flatnonzero(is_text.any(axis=1))[0])
    return row, flat[row][is_text[row]][0]


def _features(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "US":   # text
        return x
    if x.dtype == np.uint8:
        return x.astype(np.float32) / 255.0
    if x.dtype == np.bool_:   # flags: 0 and 1
        return x.astype(np.float32)
    if not np.issubdtype(x.dtype, np.number):
        raise TypeError(x.dtype)
    return x.astype(np.float32, copy=False)


def _input(x: np.ndarray) -> np.ndarray:
    """One of several inputs: uint8 scaled as one x is, other floats and flags float32,
    integers kept."""
    if x.dtype == np.uint8 or x.dtype.kind in "fb":
        return _features(x)
    return x


def _rows(x, n: Optional[int]):
    """The first ``n`` rows of ``x`` (an array or a dict of them), all when ``n`` is None."""
    return {k: v[:n] for k, v in x.items()} if isinstance(x, dict) else x[:n]


def _inputs_side_by_side(xtr, xva):
    """(name, training array, validation array) for each input."""
    if isinstance(xtr, dict):
        return [(f" of input {k!r}", xtr[k], xva[k]) for k in xtr]
    return [("", xtr, xva)]


def label_kind_of(y_train: np.ndarray) -> tuple[str, int]:
    """("sparse" | "onehot" | "multilabel" | "binary" | "other", the number of classes; for
    "other", values no class loss fits, how many values a label holds).  One-hot rows are
    rows of non-negative numbers that sum to 1 (soft labels too); multi-hot rows hold only 0
    and 1, any number of 1s a sample (tags: a sample of several classes, or of none); any
    other table is values."""
    flat = y_train.reshape(len(y_train), -1)
    width = int(flat.shape[1])
    if y_train.ndim == 2 and width > 1:
        if flat.size and (flat.min() >= 0) and np.allclose(flat.sum(axis=1), 1.0, atol=1e-3):
            return "onehot", width
        if flat.size and np.isin(flat, (0, 1)).all():
            return "multilabel", width
        return "other", width
    if width != 1:
        return "other", width
    if np.issubdtype(y_train.dtype, np.integer) or np.all(np.mod(flat, 1) == 0):
        low, high = (int(flat.min()), int(flat.max())) if flat.size else (0, 0)
        if low < 0:
            return "other", 1
        return ("binary" if high <= 1 else "sparse"), high + 1
    return "other", 1


def _from_arrays(train, val, spec, global_batch, seed, max_train, max_val, input_shape,
                 num_classes):
    returned = (train, val)
    xtr, ytr, wtr = _part(train, spec, returned, "training")
    xva, yva, wva = _part(val, spec, returned, "validation")
    several = isinstance(xtr, dict)
    if several and (not isinstance(xva, dict) or set(xtr) != set(xva)):
        raise _bad(spec, returned, f"the training inputs are {sorted(xtr)}, the validation "
                                   f"inputs {sorted(xva) if isinstance(xva, dict) else 'one array'}")
    if not several and isinstance(xva, dict):
        raise _bad(spec, returned, f"the training features are one array, the validation "
                                   f"features a dict {sorted(xva)}")
    for name, a, b in _inputs_side_by_side(xtr, xva):
        if a.shape[1:] != b.shape[1:]:
            raise _bad(spec, returned, f"training samples{name} have shape {a.shape[1:]}, "
                                       f"validation samples {b.shape[1:]}")
    for which, y in (("training", ytr), ("validation", yva)):
        _finite_labels(spec, which, y)
    # What the labels are, from all of them: a --max-train-samples subset of sorted data
    # (check loads a few batches) showed one class, or too few.
    kind, classes = label_kind_of(ytr)
    notes = []
    if kind in ("sparse", "binary"):
        val_kind, val_classes = label_kind_of(yva)
        classes = max(classes, val_classes if val_kind in ("sparse", "binary") else 0)
        notes += _sparse_ids_note(spec, ytr, classes, num_classes)
    unread = unread_rows(xtr, ytr, max_train)
    xtr, xva = _rows(xtr, max_train), _rows(xva, max_val)
    ytr, yva = ytr[:max_train], yva[:max_val]
    wtr, wva = (None if w is None else w[:n] for w, n in ((wtr, max_train), (wva, max_val)))
    if several:   # several inputs go as they are (integer ids stay integers), floats float32
        xtr, xva = ({k: _input(v) for k, v in x.items()} for x in (xtr, xva))
        shape = {k: tuple(v.shape[1:]) for k, v in xtr.items()}
    else:
        try:
            xtr, xva = _features(xtr), _features(xva)
        except TypeError:
            raise _bad(spec, returned, f"features of dtype {xtr.dtype} are not numeric") from None
        if xtr.ndim == 1 and xtr.dtype.kind not in "US":
            # One number a sample: one feature, as Keras 2's fit reads a 1-D x (Keras 3 and a
            # Dense layer take no sample without a feature axis).
            xtr, xva = xtr[:, None], xva[:, None]
        shape = input_shape(tuple(xtr.shape[1:]))
        xtr, xva = xtr.reshape((len(xtr),) + shape), xva.reshape((len(xva),) + shape)
    if kind in ("sparse", "binary"):
        ytr = ytr.reshape(-1).astype(np.int32)
        yva = yva.reshape(-1).astype(np.int32)
        if classes > 2:
            kind = "sparse"
    elif kind == "onehot":
        ytr, yva = ytr.astype(np.float32), yva.astype(np.float32)
    else:
        ytr, yva = ytr.astype(np.float32), yva.astype(np.float32)
    classes = _given_classes(spec, num_classes, kind, classes)
    return DataBundle(make_dataset(xtr, ytr, global_batch, True, seed, flat_labels=False,
                                   weights=wtr),
                      make_dataset(xva, yva, global_batch, False, flat_labels=False,
                                   weights=wva),
                      shape, classes, len(ytr), len(yva), label_kind=kind,
                      sample_batch=(_rows(xtr, 8), ytr[:8]) + (
                          () if wtr is None else (wtr[:8],)),
                      weighted=wtr is not None,
                      train_rows=DataRows(xtr, ytr, unread=unread), notes=notes)


# Class ids this far past the ones in use give the model mostly outputs no label reaches.
SPARSE_IDS = 10


def _sparse_ids_note(spec: str, y: np.ndarray, classes: int, num_classes) -> list:
    """A note when the class ids are a few spread far apart (ids such as 7, 512 and 10**6):
    the class count is the largest id + 1, so the model gets an output for every id between."""
    if num_classes or classes <= 100:
        return []
    used = int(np.unique(y.reshape(-1)).size)
    if classes < SPARSE_IDS * used:
        return []
    return [f"dataset {spec!r}: its labels use {used} class id(s), up to {classes - 1}, so the "
            f"model gets {classes} outputs, most of which no label reaches; numbering the "
            "classes 0.." f"{used - 1} (ids = np.unique(y, return_inverse=True)[1]) makes it "
            f"{used}"]


# ---- tf.data -----------------------------------------------------------------------------------

def _element_parts(ds, spec, returned, which):
    """The (features, label[, sample_weight]) specs of ``ds``'s elements.  The features are
    one tensor, or a dict (or tuple) of them for a model of several inputs, as Keras takes
    them; the weight one number a sample."""
    import tensorflow as tf

    es = ds.element_spec
    if not isinstance(es, tuple) or len(es) not in (2, 3) \
            or not all(isinstance(s, tf.TensorSpec) for s in es[1:]) \
            or not _tensor_structure(es[0]):
        raise _bad(spec, returned, f"the {which} dataset's elements are {es}; expected "
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
        n, top, low, rows_ok, multihot, bad_total, bad, weights = state
        y = element[1]
        if weighted:
            w = tf.cast(tf.reshape(element[2], []), tf.float32)
            weights = weights + tf.cast(tf.stack([tf.logical_not(tf.math.is_finite(w)),
                                                  w < 0.0, w > 0.0]), tf.int64)
        element = tf.nest.flatten(element[:2])
        if labels == "ids":
            top = tf.maximum(top, tf.cast(tf.reduce_max(y), tf.int64))
            low = tf.minimum(low, tf.cast(tf.reduce_min(y), tf.int64))
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
        return n + 1, top, low, rows_ok, multihot, bad_total, bad, weights
    start = (tf.constant(0, tf.int64), tf.constant(-1, tf.int64), tf.constant(0, tf.int64),
             tf.constant(True), tf.constant(True),
             tf.constant(0, tf.int64),
             tf.fill([MOST_LISTED if watch else 1], tf.constant(-1, tf.int64)),
             tf.zeros([3], tf.int64))
    n, top, low, rows_ok, multihot, bad_total, bad, weights = ds.reduce(start, step)
    bad_total = int(bad_total.numpy())
    return Scan(int(n.numpy()), int(top.numpy()), int(low.numpy()), bool(rows_ok.numpy()),
                bool(multihot.numpy()), [int(i) for i in bad.numpy()[:bad_total]], bad_total,
                tuple(int(c) for c in weights.numpy()) if weighted else ())


def _from_datasets(train, val, spec, global_batch, seed, max_train, max_val, input_shape,
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
            raise _bad(spec, returned, f"training features{name} have shape {part.shape}; "
                                       "every sample needs the same, fully known shape")
    for ds, which in ((train, "training"), (val, "validation")):
        if int(ds.cardinality().numpy()) == tf.data.INFINITE_CARDINALITY:
            raise _bad(spec, returned, f"the {which} dataset is infinite (repeat()); an "
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
    vscan = _scan(val, labels)
    n_train, n_val, bad, bad_total = scan.count, vscan.count, scan.bad, scan.bad_total
    if n_train == 0:
        raise _bad(spec, returned, "the training dataset has no elements")
    if n_val == 0:   # as for arrays: no validation metric would be a number
        raise _bad(spec, returned, "the validation dataset has no elements")
    for which, counted in (("training", scan), ("validation", vscan)):
        if counted.weights:
            nonfinite, negative, positive = counted.weights
            _weight_values(spec, which, (nonfinite, ()), (negative, ()),
                           all_zero=positive == 0)
    if integer_labels and min(scan.low, vscan.low) >= 0:
        top = max(scan.top, vscan.top)
        kind, classes = ("binary" if top <= 1 else "sparse"), top + 1
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
    return DataBundle(train, val, shape, _given_classes(spec, num_classes, kind, classes),
                      n_train, n_val, label_kind=kind, sample_batch=tf.nest.map_structure(
                          lambda t: t.numpy(), tuple(sample)),
                      weighted=len(train.element_spec) == 3,
                      train_rows=DatasetElements(n_train, bad, bad_total,
                                                 first_only=bool(max_train)), notes=notes)
