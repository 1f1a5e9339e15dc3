"""The failing step's batch, kept by the step itself in variables (one set per local
replica) for the sentinel's replay.

XLA cannot change a variable's shape, so a sample of known shape is kept in
[batch_size, ...] rows (a short last batch padded, its row count kept); a sample of unknown
shape in a variable of any shape (fine without XLA)."""
from __future__ import annotations

from typing import List

import tensorflow as tf


class BatchStash:
    def __init__(self, element_spec, local_replicas: int = 1, batch_size: int = 0):
        self.structure = element_spec
        specs = tf.nest.flatten(element_spec)
        self.variables: List[List[tf.Variable]] = [
            [_stash_variable(spec, batch_size, f"sentinel_batch_{r}_{i}")
             for i, spec in enumerate(specs)] for r in range(max(1, local_replicas))]
        self.rows = [tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                 name=f"sentinel_batch_rows_{r}")
                     for r in range(len(self.variables))]

    def __len__(self) -> int:
        return len(self.variables)

    def writer(self, replica: int, batch, then=None):
        """The function that keeps ``batch`` as ``replica``'s and then runs ``then()`` (the
        latch: a reader that sees it sees the batch), for a branch of the caller's that only
        a faulty step takes, so an ordinary step copies nothing."""
        flat = tf.nest.flatten(batch)

        def write() -> None:
            written = [v.assign(_fitted(tf.cast(t, v.dtype), v), read_value=False)
                       for t, v in zip(flat, self.variables[replica])]
            written.append(self.rows[replica].assign(tf.cast(tf.shape(flat[0])[0], tf.int64),
                                                     read_value=False))
            if then is not None:
                with tf.control_dependencies(written):
                    then()
        return write

    def batches(self) -> list:
        """Each replica's kept batch (those that kept one), as the dataset's structure."""
        return [tf.nest.pack_sequence_as(self.structure, [
            tf.convert_to_tensor(v)[:n] for v in vs])
            for vs, n in ((vs, int(rows.numpy())) for vs, rows in zip(self.variables, self.rows))
            if n > 0]


def _stash_variable(spec, batch_size: int, name: str) -> tf.Variable:
    sample = spec.shape[1:] if spec.shape.rank else None
    if batch_size and sample is not None and sample.is_fully_defined():
        return tf.Variable(tf.zeros([batch_size] + sample.as_list(), spec.dtype),
                           trainable=False, name=name)
    return tf.Variable(tf.zeros([0] * max(spec.shape.rank or 1, 1), spec.dtype),
                       trainable=False, shape=tf.TensorShape(None), name=name)


def _fitted(t, var):
    """``t`` as ``var`` holds it: padded to its rows when its shape is fixed."""
    rows = var.shape[0] if var.shape.rank else None
    if rows is None:
        return t
    n = t.shape[0]
    if n is not None:   # traced per batch shape, as XLA needs
        return t if n == rows else tf.pad(t[:rows], [[0, max(0, rows - n)]] + [[0, 0]] * (t.shape.rank - 1))
    pad = tf.maximum(rows - tf.shape(t)[0], 0)
    return tf.ensure_shape(tf.pad(t[:rows], [[0, pad]] + [[0, 0]] * (t.shape.rank - 1)),
                           var.shape)
