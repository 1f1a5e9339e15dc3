"""Recognise the error mixed precision causes in a user's layer, and name the layer.

The classic failure: a custom layer mixes its 16-bit input with a float32 tensor it made
itself inside ``call`` (``tf.constant(...)``, a float32 ``tf.Variable`` or ``tf.ones``), and
TensorFlow stops with "expected to be a half tensor but is a float tensor" or "Input 'y' of
'AddV2' Op has type float32 that does not match type float16".  The raw traceback names an
op, not the layer; this module finds the layer and turns it into one line with the fix.
Used by ``train`` (the run stops with that line) and by ``check`` (a blocker in the report).
"""
from __future__ import annotations

import re
from typing import Callable, Optional

from app.core.catalog import SIXTEEN_BIT

_16 = r"(half|float16|bfloat16)"
_32 = r"(float|float32)"
_CLASH_PATTERNS = (
    re.compile(rf"expected to be a(n)? {_16} tensor but is a(n)? {_32} tensor"),
    re.compile(rf"expected to be a(n)? {_32} tensor but is a(n)? {_16} tensor"),
    re.compile(rf"has type {_32} that does not match type {_16}"),
    re.compile(rf"has type {_16} that does not match type {_32}"),
    re.compile(rf"expected {_16} but got {_32}|expected {_32} but got {_16}"),
    re.compile(rf"must have the same dtype.*{_16}.*{_32}|must have the same dtype.*{_32}.*{_16}",
               re.S),
    re.compile(rf"{_16}.*(is not compatible with|incompatible with|does not match).*{_32}"
               rf"|{_32}.*(is not compatible with|incompatible with|does not match).*{_16}", re.S),
)
FIX = ("cast inside call(): tf.cast(t, self.compute_dtype) for every tensor the layer makes "
       "itself (constants, tf.ones/zeros, float32 variables), or create weights with "
       "self.add_weight() so Keras casts them")


def is_dtype_clash(exc: BaseException) -> bool:
    """True for the TypeError/InvalidArgumentError/ValueError of a 16-bit vs float32 clash."""
    if type(exc).__name__ not in ("TypeError", "InvalidArgumentError", "ValueError",
                                  "NotFoundError", "UnimplementedError"):
        return False
    text = str(exc)
    return any(p.search(text) for p in _CLASH_PATTERNS)


def _is_layer(obj) -> bool:
    import tensorflow as tf

    return isinstance(obj, tf.keras.layers.Layer) and not isinstance(obj, tf.keras.Model)


def failing_layer(exc: BaseException):
    """The innermost Keras layer whose code was running when ``exc`` was raised, or None.

    Walks the traceback from the raising frame outwards and takes the first frame whose
    ``self`` is a layer (autograph-converted ``call`` keeps ``self`` too).  Falls back to the
    name Keras writes into the message ("calling layer "x"", or "calling X.call()").
    """
    tb = exc.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        obj = frame.f_locals.get("self")
        if obj is not None and _is_layer(obj):
            return obj
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:
        return failing_layer(cause)
    return None


def layer_name_from_message(exc: BaseException) -> Optional[str]:
    text = str(exc)
    m = re.search(r'calling layer ["\']([^"\']+)["\'] \(type (\w+)\)', text)
    if m:
        return f"{m.group(1)!r} ({m.group(2)})"
    m = re.search(r"calling (\w+)\.call\(\)", text)
    return f"of class {m.group(1)}" if m else None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")   # Keras 3 puts terminal bold into its messages


def first_line(exc: BaseException) -> str:
    """The line of the error that says which dtypes met (Keras 3 puts it under a first line
    about output shapes that says nothing about dtypes), else its first real line."""
    lines = [_ANSI.sub("", line).strip() for line in str(exc).strip().splitlines()]
    for line in lines:
        if any(p.search(line) for p in _CLASH_PATTERNS):
            return line[:200]
    for line in lines:
        if line and not line.startswith(("Exception encountered", "Traceback")):
            return line[:200]
    return type(exc).__name__


def describe(exc: BaseException, policy: str, model_spec: str = "",
             float32_flag: Optional[Callable[[str], str]] = None) -> str:
    """One line: which layer, what clashed, the fix.  ``float32_flag(name)`` is the flag
    that runs that layer in float32 (``--float32-layers``, which ``app.task`` owns): the fix
    that needs no edit of the model, offered when the layer is known and 16-bit."""
    layer = failing_layer(exc)
    fix = FIX
    if layer is not None:
        compute = str(getattr(layer, "compute_dtype", "?"))
        who = f"layer {layer.name!r} ({type(layer).__name__}, compute dtype {compute})"
        if float32_flag is not None and compute in SIXTEEN_BIT:
            fix += f"; or, without editing the model, run it in float32: {float32_flag(layer.name)}"
    else:
        named = layer_name_from_message(exc)
        who = f"layer {named}" if named else "a layer"
    where = f" in model {model_spec!r}" if model_spec else ""
    return (f"{who}{where} mixes float16/bfloat16 and float32 tensors under {policy} "
            f"({first_line(exc)}); fix: {fix}")
