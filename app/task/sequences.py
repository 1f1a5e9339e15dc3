"""A Keras ``Sequence`` (``keras.utils.PyDataset`` in Keras 3) as ``tf.data``.

Keras code often reads its data through one: a class whose ``seq[i]`` loads batch ``i``
(from disk, with its own decoding), which Keras' ``fit`` takes as it is.  Here its batches
become a dataset (``from_generator``, the signature read from batch 0), which
``app.task.user_data`` takes apart and batches again at the run's global batch, as it does
any batched dataset.  After each pass ``on_epoch_end`` runs, as fit runs it (a Sequence
that shuffles its order there keeps doing so).
"""
from __future__ import annotations

import numpy as np

from app.core.errors import UsageError, UserCodeError

BATCH_FORMS = "batches (x, y) or (x, y, sample_weight) of NumPy arrays, x one array or a dict"


def is_sequence(obj) -> bool:
    import tensorflow as tf

    kind = getattr(tf.keras.utils, "Sequence", None)
    return kind is not None and isinstance(obj, kind)


def as_dataset(seq, spec: str, which: str):
    """The batches of ``seq`` as a ``tf.data.Dataset`` (a UsageError naming the spec for a
    Sequence whose batches are not (x, y[, w]) arrays)."""
    import tensorflow as tf

    try:
        count = len(seq)
        first = seq[0] if count else None
    except Exception as exc:   # the user's own loading code
        raise UserCodeError(spec, f"reading batch 0 of the {which} Sequence", exc) from exc
    if not count:
        raise UsageError(f"dataset spec {spec!r}: the {which} Sequence has no batches "
                         "(len() is 0)", BATCH_FORMS)
    if not isinstance(first, tuple) or len(first) not in (2, 3):
        raise UsageError(f"dataset spec {spec!r}: batch 0 of the {which} Sequence is "
                         f"{type(first).__name__}"
                         + (f" of {len(first)}" if isinstance(first, (tuple, list)) else ""),
                         BATCH_FORMS)
    try:
        signature = tf.nest.map_structure(_spec, first)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"dataset spec {spec!r}: batch 0 of the {which} Sequence holds "
                         f"something that is not an array ({exc})", BATCH_FORMS) from None

    def batches():
        for i in range(len(seq)):
            yield seq[i]
        if hasattr(seq, "on_epoch_end"):
            seq.on_epoch_end()
    return tf.data.Dataset.from_generator(batches, output_signature=signature)


def _spec(part):
    import tensorflow as tf

    array = np.asarray(part)
    if array.ndim < 1:
        raise ValueError(f"a batch part of shape {array.shape}")
    dtype = tf.string if array.dtype.kind in "US" else tf.as_dtype(array.dtype)
    return tf.TensorSpec((None,) + array.shape[1:], dtype)
