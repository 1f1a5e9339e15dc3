"""What a user's data must be, shared by its two forms (``app.task.user_arrays``,
``app.task.user_datasets``): the one line for a wrong shape of return value, finite labels,
the class count and the label kind, and sample weights a loss can use."""
from __future__ import annotations

from typing import Optional

import numpy as np

from app.task import array_file
from app.task.data_rows import listed
from app.core.errors import UsageError

EXPECTED = ("((x_train, y_train), (x_val, y_val)) NumPy arrays, (train, val) unbatched "
            "tf.data.Dataset of (features, label), or (train, val) Keras Sequences of "
            "batches; (x, y, sample_weight) and (features, label, sample_weight) with a "
            "weight a sample")
WEIGHTS_ALLOWED = "one finite, non-negative number a sample, not all zero"


def received(obj) -> str:
    if isinstance(obj, (tuple, list)):
        inner = ", ".join(received(o) for o in obj[:3])
        return f"{type(obj).__name__} of {len(obj)} ({inner}{', ...' if len(obj) > 3 else ''})"
    shape = getattr(obj, "shape", None)
    return type(obj).__name__ + (f" shape {tuple(shape)}" if shape is not None else "")


def wrong_form(spec: str, returned, why: str = "") -> UsageError:
    if array_file.is_array_file(spec):   # the user wrote arrays, not a function returning them
        return UsageError(f"dataset file {spec!r}: {why}", array_file.LAYOUT)
    return UsageError(f"dataset spec {spec!r} returned {received(returned)}"
                      + (f" ({why})" if why else ""), EXPECTED)


def finite_labels(spec: str, which: str, y) -> None:
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


def validation_class_id(spec: str, value, where: str, classes: int, past: bool) -> None:
    """Validation labels read by the training labels' rule: with class ids 0..N-1 there, a
    validation label that is no class id (negative, a fraction) crashed the first validation
    pass or was rounded down without a word, and one past the training labels' classes got
    the model outputs no training label reaches.  ``value``: the first such label, ``where``
    it is; ``past``: it is a class id, past the training labels' ``classes``."""
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    ids = f"0..{classes - 1}"
    if past:
        raise UsageError(f"dataset {spec!r}: validation label {shown} ({where}) is a class no "
                         f"training label has (they are class ids {ids})",
                         f"validation labels among the training labels' classes {ids}, or "
                         f"--num-classes {value + 1} or more when the training part lacks "
                         "some classes")
    raise UsageError(f"dataset {spec!r}: validation label {shown} ({where}) is not a class id, "
                     f"as the training labels ({ids}) are",
                     f"class ids in the validation labels too: whole numbers {ids}")


def given_classes(spec: str, num_classes: Optional[int], kind: str, counted: int) -> int:
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


def weight_values(spec: str, which: str, bad: tuple, negative: tuple, all_zero: bool) -> None:
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


# Class ids past this many outputs are taken for a stray label, not a model's classes: one
# id of 10**9 made a Dense layer of 10**9 outputs and an out-of-memory error in the user's
# code.  Past it the count is one line (2**20: the largest class counts in use, ImageNet-21k
# and the like, are well under it).
MOST_CLASSES = 2 ** 20


def check_class_count(spec: str, classes: int, where: str = "") -> None:
    """One line when the labels' largest class id would give the model more outputs than
    ``MOST_CLASSES``; ``where``: the label that holds it, when known."""
    if classes <= MOST_CLASSES:
        return
    raise UsageError(f"dataset {spec!r}: its labels go up to class id {classes - 1}"
                     + (f" ({where})" if where else "") + f", so the model would get "
                     f"{classes} outputs, one per id up to it",
                     f"class ids numbered 0..N-1 with N at most {MOST_CLASSES} "
                     "(ids = np.unique(y, return_inverse=True)[1] numbers them)")


def finite_validation(spec: str, bad: list, total: int, where: str) -> None:
    """Validation samples with NaN or inf in their features: every validation loss and
    metric is then NaN, epoch after epoch, and --early-stop stops on it, with nothing said
    of why.  One line naming them (``bad``: the first positions; ``where``: what they are
    rows or elements of).  Training samples are the sentinel's to name, at their step."""
    if not total:
        return
    raise UsageError(f"dataset {spec!r}: {total} validation sample(s) hold NaN or infinite "
                     f"values ({where} {listed(bad, total)})",
                     "finite features: fix or drop those samples (the loss and the metrics "
                     "of a sample with NaN are NaN)")
