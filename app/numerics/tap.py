"""Each layer's inputs and outputs during a forward pass, for every model form (functional,
Sequential, subclassed, nested): the ``call`` of each layer *instance* is wrapped
(``object.__setattr__``, past Keras' attribute tracking) and records only while this
thread is ``recording()``, so a step traced meanwhile (fit's, in another thread) is left
as it was.  Used as a context manager: on leaving, every layer is put back (a traced
function keeps what it recorded, so the tap is needed only while tracing).

A record is made when a call returns, so a layer of a layer comes before its parent:
the first record with a non-finite output is the innermost layer where the value began.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class Call:
    """One layer call: its full path, class, compute dtype, and the floating tensors it
    took and gave."""
    path: str
    layer: object
    order: int
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    ops: list = field(default_factory=list)   # the graph ops its call made (``with_ops``)
    # What Keras cast to the layer's 16-bit dtype before its call took it (its autocast of a
    # float32 layer's output, or of the model's input): the wider tensors, as they were
    # before the cast (``cast_sources``).  A value past the dtype's largest is inf already
    # in ``inputs``.
    cast_from: list = field(default_factory=list)

    @property
    def class_name(self) -> str:
        return type(self.layer).__name__

    @property
    def dtype(self) -> Optional[str]:
        return _dtype(self.outputs[0]) if self.outputs else None


def _dtype(t) -> Optional[str]:
    d = getattr(t, "dtype", None)
    return str(getattr(d, "name", d)) if d is not None else None


def floating(values) -> list:
    import tensorflow as tf

    return [t for t in tf.nest.flatten(values)
            if getattr(getattr(t, "dtype", None), "is_floating", False)]


def _op_count() -> int:
    import tensorflow as tf

    return len(tf.compat.v1.get_default_graph().get_operations())


def _ops_since(first: int) -> list:
    import tensorflow as tf

    return tf.compat.v1.get_default_graph().get_operations()[first:]


def cast_sources(inputs) -> list:
    """The tensors ``inputs`` were cast from to a narrower float dtype in the graph (Keras'
    autocast before a 16-bit layer's call): a traced function's only (an eager tensor has no
    op)."""
    found = []
    for t in inputs:
        op = getattr(t, "op", None)
        if op is None or getattr(op, "type", None) != "Cast" or not op.inputs:
            continue
        source = op.inputs[0]
        if source.dtype.is_floating and source.dtype.size > t.dtype.size:
            found.append(source)
    return found


def largest_finite(tensors):
    """The largest finite magnitude in ``tensors`` (0 for none), as a float32 tensor: what a
    layer's values reach, an inf or NaN among them left out."""
    import tensorflow as tf

    vals = [tf.maximum(tf.reduce_max(tf.where(tf.math.is_finite(t), tf.abs(tf.cast(t, tf.float32)),
                                              0.0)), 0.0) for t in tensors]
    return tf.reduce_max(tf.stack(vals)) if vals else tf.constant(0.0)


class Tap:
    """Wraps the layers of ``entries`` (``app.task.model_layers.walk``) once; ``recording()``
    yields the list of ``Call`` records a forward pass in this thread fills."""

    def __init__(self, entries):
        self._local = threading.local()
        self._wrapped = []
        for path, layer, _parent in entries:
            if "call" in vars(layer):   # already an instance attribute: leave it alone
                continue
            object.__setattr__(layer, "call", self._make(layer, layer.call, path))
            self._wrapped.append(layer)

    def _make(self, layer, original, path):
        local = self._local

        def call(*args, **kwargs):
            first = _op_count() if getattr(local, "with_ops", False) else None
            out = original(*args, **kwargs)
            calls = getattr(local, "calls", None)
            if calls is not None:
                inputs = floating((args, kwargs))
                calls.append(Call(path, layer, len(calls), inputs, floating(out),
                                  [] if first is None else _ops_since(first),
                                  cast_sources(inputs)))
            return out
        return call

    @contextlib.contextmanager
    def recording(self, with_ops: bool = False):
        """``with_ops``: each record keeps the graph ops its call made (traced only:
        what a layer computes inside, ``app.numerics.inside``)."""
        calls: List[Call] = []
        self._local.calls, self._local.with_ops = calls, with_ops
        try:
            yield calls
        finally:
            self._local.calls, self._local.with_ops = None, False

    def __enter__(self) -> "Tap":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def remove(self) -> None:
        for layer in self._wrapped:
            try:
                object.__delattr__(layer, "call")
            except AttributeError:  # pragma: no cover - removed by someone else
                pass
        self._wrapped = []
