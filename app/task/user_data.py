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

from typing import Callable, Optional

import numpy as np

from app.task import sequences
from app.task.data import DataBundle
from app.task.data_rules import wrong_form
from app.task.user_arrays import from_arrays
from app.task.user_datasets import from_datasets
from app.core.errors import UsageError


def from_user(returned, spec: str, global_batch: int, *, seed: int = 0,
              max_train_samples: Optional[int] = None, max_val_samples: Optional[int] = None,
              input_shape: Callable[[tuple], tuple] = tuple,
              num_classes: Optional[int] = None) -> DataBundle:
    import tensorflow as tf

    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        raise wrong_form(spec, returned, "expected a pair: training and validation data")
    train, val = returned
    if sequences.is_sequence(train) and sequences.is_sequence(val):   # keras.utils.Sequence
        train, val = (sequences.as_dataset(part, spec, which)
                      for part, which in ((train, "training"), (val, "validation")))
    if isinstance(train, tf.data.Dataset) and isinstance(val, tf.data.Dataset):
        return from_datasets(train, val, spec, global_batch, seed, max_train_samples,
                             max_val_samples, input_shape, num_classes)
    if isinstance(train, tf.data.Dataset) or isinstance(val, tf.data.Dataset) or \
            sequences.is_sequence(train) or sequences.is_sequence(val):
        raise wrong_form(spec, returned, "both parts must be tf.data datasets, both Keras "
                         "Sequences, or both (x, y) arrays")
    if _one_pair(train, val):
        n = len(train)
        raise UsageError(f"dataset spec {spec!r} returned one (x, y) pair of {n} samples: the "
                         "validation data is missing",
                         "((x_train, y_train), (x_val, y_val)), e.g. the last tenth held out: "
                         f"((x[:{n - n // 10}], y[:{n - n // 10}]), (x[{n - n // 10}:], "
                         f"y[{n - n // 10}:])) after shuffling them together")
    return from_arrays(train, val, spec, global_batch, seed, max_train_samples,
                       max_val_samples, input_shape, num_classes)


def _one_pair(train, val) -> bool:
    """(x, y) itself where ((x_train, y_train), (x_val, y_val)) was expected: two arrays
    (not pairs) of the same length."""
    return (isinstance(train, np.ndarray) and isinstance(val, np.ndarray)
            and train.ndim >= 1 and val.ndim >= 1 and len(train) == len(val))

