"""Inside the layer where a 16-bit value first went non-finite, when its magnitudes do not
say why (its inputs finite, and float32's value far under the dtype's largest): the first
op of its call whose output is non-finite, and whether that op overflowed or divided by a
value that is 0 in 16 bits (an underflow: an epsilon, a variance, a norm).  A 0/0 from an
epsilon of 1e-8 is no overflow, and its fix is not a clip.

One more forward pass of the failing batch, after the fault only, traced with the ops of
that layer's call recorded (``Tap.recording(with_ops=True)``): each float tensor those ops
make or read, finite or not and its smallest magnitude; and the constants the call holds
that are not 0 in float32 but are in 16 bits (``tf.cast(1e-8, x.dtype)``).  A constant
Python folded to 16 bits before the graph saw it (``x + 1e-8`` on a float16 ``x``) is 0
there already: that one cannot be named.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import tensorflow as tf

from app.numerics import limits
from app.numerics.tap import Tap
from app.precision import finite

# The ops that a 0 makes non-finite, with the input that must not be 0 (x / 0, 1 / sqrt(0),
# log(0), 0 ** -n).
DIVIDING = {"RealDiv": 1, "Div": 1, "FloorDiv": 1, "TruncateDiv": 1, "Xdivy": 1,
            "Reciprocal": 0, "Inv": 0, "Rsqrt": 0, "Log": 0, "Pow": 0}


@dataclass
class Inside:
    cause: str                       # underflow | overflow
    op: str                          # the op's type where it began, e.g. RealDiv
    constant: Optional[float] = None  # a constant of the call that is 0 in the dtype
    occurrence: int = 0              # which op of that type the call made (0: its first)
    # An overflow: the largest magnitude that op's output reaches with the layer in float32
    # (``float32_largest``), None when not measured.
    float32_largest: Optional[float] = None


def look(model, entries, x, index: int, dtype: str) -> Optional[Inside]:
    """The ``index``-th layer call of a forward pass of ``x`` (as the replay recorded them),
    seen from inside; None when this pass finds nothing non-finite in it (dropout drew
    anew) or the call made no op of its own."""
    meta: dict = {}

    @tf.function
    def run(x):
        with Tap(entries) as tap, tap.recording(with_ops=True) as calls:
            model(x, training=True)
        ops = calls[index].ops if index < len(calls) else []
        tensors = _float_tensors(ops)
        meta.update(tensors=[(t.op.type, t.op.name, [i.name for i in t.op.inputs], made)
                             for t, made in tensors],
                    names=[t.name for t, _ in tensors], constants=_small_constants(ops, dtype))
        if not tensors:
            return tf.zeros([0, 2])
        return tf.stack([tf.stack([tf.cast(finite.all_finite([t]), tf.float32), _smallest(t)])
                         for t, _ in tensors])

    stats = run(x).numpy()
    seen = {name: (bool(r[0]), float(r[1])) for name, r in zip(meta["names"], stats)}
    of_type: dict = {}   # op type -> how many of that type the call made before
    for (op_type, _name, inputs, made), name in zip(meta["tensors"], meta["names"]):
        if not made:
            continue
        if seen[name][0]:
            of_type[op_type] = of_type.get(op_type, 0) + 1
            continue
        return Inside(_cause(op_type, inputs, seen), op_type,
                      meta["constants"][0] if meta["constants"] else None,
                      occurrence=of_type.get(op_type, 0))
    return None


def largest_of(model, entries, x, index: int, op_type: str, occurrence: int) -> Optional[float]:
    """The largest finite magnitude of the output of the ``occurrence``-th op of type
    ``op_type`` that the ``index``-th layer call of a forward pass of ``x`` makes, as the
    layers' policies are now (run under ``replay.all_float32``: what the op that overflowed
    in 16 bits reaches in float32); None when the call makes no such op."""
    @tf.function
    def run(x):
        with Tap(entries) as tap, tap.recording(with_ops=True) as calls:
            model(x, training=True)
        ops = calls[index].ops if index < len(calls) else []
        made = [t for t, by_call in _float_tensors(ops) if by_call and t.op.type == op_type]
        if occurrence >= len(made):
            return tf.constant(-1.0)
        t = tf.abs(tf.cast(made[occurrence], tf.float32))
        return tf.reduce_max(tf.where(tf.math.is_finite(t), t, 0.0))

    value = float(run(x).numpy())
    return None if value < 0 else value


def _float_tensors(ops) -> list:
    """(tensor, made by one of ``ops``) for each float tensor ``ops`` make or read, in the
    order they were made (a layer's inputs first where read)."""
    out, seen = [], set()
    made = {op.name for op in ops}
    for op in ops:
        for t in list(op.inputs) + list(op.outputs):
            if t.name in seen or not t.dtype.is_floating or t.op.type == "Const":
                continue
            seen.add(t.name)
            out.append((t, t.op.name in made))
    return out


def _smallest(t):
    """The smallest magnitude of ``t``'s finite values (inf for none)."""
    a = tf.abs(tf.cast(t, tf.float32))
    return tf.reduce_min(tf.where(tf.math.is_finite(a), a, float("inf")))


def _cause(op_type: str, inputs: List[str], seen: dict) -> str:
    """A dividing op whose divisor holds a 0 (finite in float32: the 0 is 16 bits' own) is
    an underflow; anything else that goes non-finite from finite inputs overflowed."""
    at = DIVIDING.get(op_type)
    if at is not None and at < len(inputs) and seen.get(inputs[at], (True, 1.0))[1] == 0.0:
        return "underflow"
    return "overflow"


def _small_constants(ops, dtype: str) -> List[float]:
    """The constants the call holds in float32 or float64 that are not 0 there but are in
    ``dtype`` (an epsilon written inline and cast to it)."""
    found = []
    for op in ops:
        if op.type != "Const" or op.outputs[0].dtype not in (tf.float32, tf.float64):
            continue
        value = tf.get_static_value(op.outputs[0])
        if value is None:
            continue
        small = [float(v) for v in np.ravel(np.abs(value)) if limits.underflows(float(v), dtype)]
        found.extend(small[:1])
    return found
