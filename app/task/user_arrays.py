"""A user's ``((x_train, y_train), (x_val, y_val))`` NumPy arrays -> the run's batched
pipelines.  Either part may be ``(x, y, sample_weight)``, as Keras' ``fit`` takes it; x may
be a dict of arrays, one per model input.  ``uint8`` features are scaled to float32 in
[0, 1] (as the built-ins are), other numeric features and flags become float32, text goes
to the model as it is."""
from __future__ import annotations

from typing import Optional

import numpy as np

from app.task.data import DataBundle, make_dataset
from app.task.data_rows import DataRows, unread_rows
from app.task.data_rules import (MOST_CLASSES, WEIGHTS_ALLOWED, check_class_count,
                                 finite_labels, finite_validation, given_classes,
                                 label_kind_of, validation_class_id, weight_values,
                                 wrong_form)
from app.core.errors import UsageError

def _part(part, spec, returned, which):
    """(x, y, sample weights or None) arrays of one part: (x, y) or (x, y, sample_weight)."""
    if not isinstance(part, (tuple, list)) or len(part) not in (2, 3):
        raise wrong_form(spec, returned,
                         f"the {which} part must be (x, y) or (x, y, sample_weight)")
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
    weight_values(spec, which, (len(bad), bad[:5]), (len(negative), negative[:5]),
                  all_zero=not np.any(w))
    return w.astype(np.float32)



def _pair(part, spec, returned, which):
    """(x, y) arrays of one part; x one array, or a dict of them (one per model input)."""
    if isinstance(part[0], dict):
        return _inputs_pair(part, spec, returned, which)
    try:
        x, y = np.asarray(part[0]), np.asarray(part[1])
    except Exception:  # ragged lists and the like
        raise wrong_form(spec, returned, f"the {which} part cannot be made into arrays") from None
    if y.dtype.kind in "USO" and y.ndim >= 1 and len(y) and isinstance(
            y.reshape(-1)[0], (str, bytes)):
        raise UsageError(f"dataset spec {spec!r}: the {which} labels are strings (e.g. "
                         f"{str(y.reshape(-1)[0])!r}), not class ids",
                         "class ids 0..N-1 (names, ids = np.unique(y, return_inverse=True) "
                         "maps them), one-hot rows, or values with a --loss for them")
    mixed = _mixed_text_row(x) if x.dtype.kind == "O" and x.size else None
    if mixed is not None:   # made strings, its numbers read "0.5" and a numeric model failed
        raise wrong_form(spec, returned, f"the {which} features mix text and numbers: row "
                         f"{mixed[0]} holds {str(mixed[1])[:40]!r}")
    x = _text(x)
    if x.dtype.kind not in "biufUS" or y.dtype.kind not in "biuf" or x.ndim < 1 or y.ndim < 1:
        raise wrong_form(spec, returned, f"the {which} part must be numeric arrays (features may "
                         "be text, for a model that reads strings)")
    if len(x) != len(y):
        raise wrong_form(spec, returned, f"{which}: {len(x)} samples but {len(y)} labels")
    if len(x) == 0:
        raise wrong_form(spec, returned, f"{which}: no samples")
    return x, y


def _inputs_pair(part, spec, returned, which):
    """(dict of arrays, y): every input checked as one x is, the same rows in each."""
    inputs = part[0]
    if not inputs or not all(isinstance(k, str) for k in inputs):
        raise wrong_form(spec, returned, f"the {which} features are a dict: it needs string keys "
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



def from_arrays(train, val, spec, global_batch, seed, max_train, max_val, input_shape,
                num_classes):
    returned = (train, val)
    xtr, ytr, wtr = _part(train, spec, returned, "training")
    xva, yva, wva = _part(val, spec, returned, "validation")
    several = isinstance(xtr, dict)
    if several and (not isinstance(xva, dict) or set(xtr) != set(xva)):
        raise wrong_form(spec, returned, f"the training inputs are {sorted(xtr)}, the validation "
                         f"inputs {sorted(xva) if isinstance(xva, dict) else 'one array'}")
    if not several and isinstance(xva, dict):
        raise wrong_form(spec, returned, f"the training features are one array, the validation "
                         f"features a dict {sorted(xva)}")
    for name, a, b in _inputs_side_by_side(xtr, xva):
        if a.shape[1:] != b.shape[1:]:
            raise wrong_form(spec, returned, f"training samples{name} have shape {a.shape[1:]}, "
                             f"validation samples {b.shape[1:]}")
    for which, y in (("training", ytr), ("validation", yva)):
        finite_labels(spec, which, y)
    # What the labels are, from all of them: a --max-train-samples subset of sorted data
    # (check loads a few batches) showed one class, or too few.
    kind, classes = label_kind_of(ytr)
    notes = []
    if kind in ("sparse", "binary"):
        _validation_ids(spec, yva, classes, num_classes)
        val_kind, val_classes = label_kind_of(yva)
        classes = max(classes, val_classes if val_kind in ("sparse", "binary") else 0)
        if classes > MOST_CLASSES:
            check_class_count(spec, classes, _largest_id_at(ytr, yva))
        notes += _sparse_ids_note(spec, ytr, classes, num_classes)
    unread = unread_rows(xtr, ytr, max_train)
    xtr, xva = _rows(xtr, max_train), _rows(xva, max_val)
    ytr, yva = ytr[:max_train], yva[:max_val]
    bad = DataRows(xva, yva, names=("x_val", "y_val")).nonfinite()
    finite_validation(spec, bad, len(bad), "rows")
    wtr, wva = (None if w is None else w[:n] for w, n in ((wtr, max_train), (wva, max_val)))
    if several:   # several inputs go as they are (integer ids stay integers), floats float32
        xtr, xva = ({k: _input(v) for k, v in x.items()} for x in (xtr, xva))
        shape = {k: tuple(v.shape[1:]) for k, v in xtr.items()}
    else:
        try:
            xtr, xva = _features(xtr), _features(xva)
        except TypeError:
            raise wrong_form(spec, returned,
                             f"features of dtype {xtr.dtype} are not numeric") from None
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
    classes = given_classes(spec, num_classes, kind, classes)
    return DataBundle(make_dataset(xtr, ytr, global_batch, True, seed, flat_labels=False,
                                   weights=wtr),
                      make_dataset(xva, yva, global_batch, False, flat_labels=False,
                                   weights=wva),
                      shape, classes, len(ytr), len(yva), label_kind=kind,
                      sample_batch=(_rows(xtr, 8), ytr[:8]) + (
                          () if wtr is None else (wtr[:8],)),
                      weighted=wtr is not None,
                      train_rows=DataRows(xtr, ytr, unread=unread), notes=notes)


def _validation_ids(spec: str, yva: np.ndarray, classes: int, num_classes) -> None:
    """The validation labels are class ids when the training labels are (data_rules), and
    within theirs unless ``num_classes`` says more (which ``given_classes`` checks)."""
    flat = yva.reshape(len(yva), -1)
    if flat.shape[1] != 1:
        return
    flat = flat[:, 0]
    bad = np.flatnonzero((flat < 0) | (np.mod(flat, 1) != 0))
    past = not bad.size and not num_classes
    if past:
        bad = np.flatnonzero(flat >= classes)
    if bad.size:
        value = flat[bad[0]].item()
        validation_class_id(spec, int(value) if past else value, f"row {int(bad[0])} of y_val",
                            classes, past)


def _largest_id_at(ytr: np.ndarray, yva: np.ndarray) -> str:
    """Which label holds the largest class id: 'row 0 of the training labels'."""
    top = [(int(y.max()), which, int(y.reshape(-1).argmax()))
           for y, which in ((ytr, "training"), (yva, "validation")) if y.size]
    _, which, row = max(top)
    return f"row {row} of the {which} labels"


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


