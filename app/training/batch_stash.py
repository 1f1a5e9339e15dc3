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
        self.count = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                 name="sentinel_stashed_replicas")

    def __len__(self) -> int:
        return len(self.variables)

    @property
    def fixed(self) -> bool:
        """Every part of a sample has a known shape (fixed-size rows)."""
        return all(v.shape.rank for vs in self.variables for v in vs)

    def write(self, replica: int, batch, new=True) -> list:
        """The ops that keep ``batch`` as ``replica``'s where ``new`` (inside the step)."""
        flat = tf.nest.flatten(batch)

        def keep_or(value, var):
            if new is True:
                return var.assign(value, read_value=False)
            return var.assign(tf.where(new, value, var), read_value=False)
        ops = [keep_or(_fitted(tf.cast(t, v.dtype), v), v)
               for t, v in zip(flat, self.variables[replica])]
        ops.append(keep_or(tf.cast(tf.shape(flat[0])[0], tf.int64), self.rows[replica]))
        return ops

    def batches(self) -> list:
        """Each replica's kept batch (those that wrote one), as the dataset's structure."""
        n = int(self.count.numpy())
        return [tf.nest.pack_sequence_as(self.structure, [
            tf.convert_to_tensor(v)[:int(rows.numpy())] for v in vs])
            for vs, rows in zip(self.variables[:n], self.rows)]


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
