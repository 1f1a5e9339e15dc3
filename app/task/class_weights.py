"""``--class-weight balanced|ID=W[,ID=W...]``: weigh each training sample by its class, as
Keras' ``fit(class_weight=...)`` does, for data whose classes are not equally common.

``parse`` reads the setting (no TensorFlow: it is checked with the other settings, before
TensorFlow is imported).  ``balanced`` gives class c the weight n / (k * n_c), k the classes
the training labels hold and n_c the samples of c (scikit-learn's "balanced": each class's
samples together weigh as much as another's); ``ID=W`` pairs give those classes their
weights and the rest 1, since weighing up one rare class is the usual need (Keras' fit wants
every class listed).  ``weigh`` then multiplies each training batch's sample weights (1 where
the data gave none) by its labels' class weights, in the input pipeline: both loops, the
sentinel's replay and ``--accumulate`` see them as any sample weight.  The validation data is
not weighed, as fit does not weigh it by class.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Dict, List, Optional, Union

from app.core.errors import UsageError

FLAG = "--class-weight"
BALANCED = "balanced"
FORMS = ("balanced, or CLASS=WEIGHT pairs of class ids and weights >= 0, e.g. 3=10 or "
         "0=1,1=4.5 (classes not listed weigh 1)")

Parsed = Union[str, Dict[int, float], None]


def parse(value: Any, said: str = FLAG) -> Parsed:
    """None or "" (none), "balanced", "3=10,0=0.5" or a dict {3: 10.0}: the class weights.
    Anything else raises UsageError naming the setting as it was given (``said``: the flag,
    its TFMP_ variable or the API's keyword) and the value."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str) and value.strip().lower() == BALANCED:
        return BALANCED
    pairs = _pairs(value, said)
    out: Dict[int, float] = {}
    for key, weight in pairs:
        cls, w = _class_id(key, value, said), _weight(weight, value, said)
        if cls in out:
            raise _bad(f"class {cls} is given twice", value, said)
        out[cls] = w
    if not out:
        raise _bad("no class is given a weight", value, said)
    return dict(sorted(out.items()))


def text(parsed: Parsed) -> Optional[str]:
    """The setting as the flag writes it: "balanced" or "0=1,3=10"; None for none."""
    if parsed is None or isinstance(parsed, str):
        return parsed
    return _pairs_text(parsed, "g")


def exact_text(table: List[float]) -> str:
    """A table of class weights as the flag's CLASS=WEIGHT pairs, to 9 significant digits
    (what a float32, which the weights are applied in, needs to be read back the same):
    classes weighing 1 left out, as the flag leaves them."""
    return _pairs_text({c: w for c, w in enumerate(table) if w != 1.0}, ".9g") or "0=1"


def _pairs_text(weights: Dict[int, float], spec: str) -> str:
    return ",".join(f"{c}={w:{spec}}" for c, w in weights.items())


def _table_text(table: List[float]) -> str:
    """A table of class weights as the notes show it: ``0: 0.625, 1: 2.5``."""
    return ", ".join(f"{c}: {w:.3g}" for c, w in enumerate(table))


def _bad(why: str, value: Any, said: str) -> UsageError:
    return UsageError(f"{said}: {why}. Received: {said}={value!r}", FORMS)


def _pairs(value: Any, said: str) -> List[tuple]:
    if isinstance(value, dict):
        return list(value.items())
    if not isinstance(value, str):
        raise _bad("class weights are 'balanced' or CLASS=WEIGHT pairs", value, said)
    pairs = []
    for item in value.split(","):
        key, sep, weight = item.partition("=")
        if not sep or not key.strip() or not weight.strip():
            raise _bad(f"{item.strip()!r} is not CLASS=WEIGHT", value, said)
        pairs.append((key.strip(), weight.strip()))
    return pairs


def _class_id(key: Any, value: Any, said: str) -> int:
    try:
        cls = int(key)
    except (TypeError, ValueError):
        raise _bad(f"{key!r} is not a class id (an integer >= 0)", value, said) from None
    if cls < 0 or isinstance(key, (bool, float)):
        raise _bad(f"{key!r} is not a class id (an integer >= 0)", value, said)
    return cls


def _weight(weight: Any, value: Any, said: str) -> float:
    try:
        w = float(weight)
    except (TypeError, ValueError):
        raise _bad(f"weight {weight!r} is not a number", value, said) from None
    if not math.isfinite(w) or w < 0:
        raise _bad(f"weight {weight!r} is not a finite number >= 0", value, said)
    return w


# ---- the weights on the training batches --------------------------------------------------------

def weigh(bundle, parsed: Parsed, counted: Optional[List[float]] = None,
          said: Optional[str] = None):
    """``bundle`` with its training batches weighed by class (``parsed`` from ``parse``);
    the bundle itself when there are no class weights.  The table and a note are kept on the
    bundle (``class_weight``, ``notes``).  ``counted``: the table a resumed balanced run
    counted when it began, used as it is (one per class) instead of counting again: the loss
    stays the run's even where the data changed, and a pipeline is not read an extra time.
    ``said``: how the user gave the weights (the flag, TFMP_CLASS_WEIGHT, app.train's
    keyword), which a refusal names."""
    if parsed is None:
        return bundle
    said = said or FLAG
    if bundle.label_kind == "multilabel":
        raise UsageError(f"{said} weighs a sample by its one class, and the labels of this "
                         "data are multi-hot rows (a sample may hold several classes, or none)",
                         "a weight a sample in the data, (x, y, sample_weight); or a loss "
                         "that weighs each label's positives, --loss MODULE:OBJECT")
    if bundle.label_kind not in ("sparse", "binary", "onehot"):
        raise UsageError(f"{said} weighs samples by their class, and the labels of this data "
                         "are values, not classes", "class ids or one-hot rows as labels; "
                         "for values, a weight a sample: (x, y, sample_weight)")
    k = int(bundle.num_classes)
    if parsed == BALANCED and counted is not None and len(counted) == k:
        table = [float(w) for w in counted]
        note = (f"{FLAG} balanced: the run's class weights {_table_text(table)} (counted when "
                "the run began: --resume does not count the labels again)")
    elif parsed == BALANCED:
        started = time.perf_counter()
        labels = _array_labels(bundle)
        counts = (_label_counts(labels, bundle.label_kind, k) if labels is not None
                  else _pipeline_counts(bundle, k))
        present = sum(1 for c in counts if c)
        n = sum(counts)
        table = [n / (present * c) if c else 1.0 for c in counts]
        note = (f"{FLAG} balanced: class weights {_table_text(table)} (from the training "
                f"labels' counts {', '.join(str(c) for c in counts)})")
        if labels is None:
            # The pass runs the whole input pipeline (decoding, augmenting) for the labels
            # alone: as long as an epoch of reading, before the first step. Said, with the
            # flag that gives the same weights without it.
            note += (f"; counting read the training data once, in "
                     f"{time.perf_counter() - started:.1f} s: {FLAG} {exact_text(table)} "
                     "gives the same weights without that pass")
    else:
        beyond = sorted(c for c in parsed if c >= k)
        if beyond:
            raise UsageError(f"{said} weighs class {beyond[0]}, and the labels are the class "
                             f"ids 0..{k - 1}", f"class ids from 0 to {k - 1}")
        table = [parsed.get(c, 1.0) for c in range(k)]
        if not any(table):
            raise UsageError(f"{said} weighs every class 0, so nothing would be learned", FORMS)
        note = f"{FLAG}: class weights " + ", ".join(f"{c}: {w:g}" for c, w in parsed.items()) \
            + (", the other classes 1" if len(parsed) < k else "")
    return dataclasses.replace(bundle, train=_weighed(bundle.train, table, bundle.label_kind),
                               weighted=True, class_weight=table, notes=bundle.notes + [note])


def _class_ids(y, label_kind: str):
    import tensorflow as tf

    if label_kind == "onehot":
        return tf.argmax(y, axis=-1, output_type=tf.int32)
    return tf.reshape(tf.cast(y, tf.int32), [-1])


def _weighed(train, table: List[float], label_kind: str):
    import tensorflow as tf

    weights = tf.constant(table, tf.float32)

    def weigh_batch(x, y, *sample_weight):
        w = tf.gather(weights, _class_ids(y, label_kind))
        return (x, y, w * sample_weight[0] if sample_weight else w)
    return train.map(weigh_batch, num_parallel_calls=tf.data.AUTOTUNE)


def _array_labels(bundle):
    """The training labels when the data is arrays; None for a pipeline."""
    rows = getattr(bundle.train_rows, "arrays", None)
    return None if rows is None else rows[-1]


def _label_counts(labels, label_kind: str, k: int) -> List[int]:
    """Each class's samples among array ``labels``."""
    import numpy as np

    y = np.asarray(labels)
    ids = y.argmax(axis=-1) if label_kind == "onehot" else y.reshape(-1)
    return [int(c) for c in np.bincount(ids.astype(np.int64), minlength=k)[:k]]


def _pipeline_counts(bundle, k: int) -> List[int]:
    """Each class's training samples, in one pass over the training pipeline."""
    import tensorflow as tf

    counts = bundle.train.map(lambda x, y, *w: tf.math.bincount(
        _class_ids(y, bundle.label_kind), minlength=k, maxlength=k, dtype=tf.int64)).reduce(
        tf.zeros([k], tf.int64), lambda total, c: total + c)
    return [int(c) for c in counts.numpy()]
