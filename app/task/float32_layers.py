"""``--float32-layers NAME[,NAME...]``: run the layers named in float32, the rest of the model
under the policy, without editing the model.

The names are read (``parse``, no TensorFlow: the flag and its ``TFMP_FLOAT32_LAYERS``
variable are checked before TensorFlow is imported) and, once the model function has returned
and before the model's first call, each is found among the model's layers
(``app.task.model_layers.walk``: its full path, ``outer/inner``, or the last parts of that
path when only one layer has them, such as its plain name) and given the float32 dtype policy
(``app.precision.layer_policy``).  A nested model or a layer of layers named goes to float32
whole.  That is the same as a clone of the model with those layers' ``dtype='float32'``: their
variables are float32 under every mixed policy already, so the weights stay, only the dtype
their calls compute in changes (the layers after them cast back to 16 bits as they would
after any float32 layer), and Keras saves each layer's policy with the model.  A layer whose
variables were made 16-bit (Keras 2's Normalization in EfficientNet, dtype='float16') is made
again: the model is cloned with that layer in float32 and the weights carried over.

A layer can fail in 16 bits while the model function is still building the model (a custom
layer that adds a float32 constant to its input stops Keras' functional construction with a
dtype clash), so ``while_building(names)`` is in force while the model function runs: a layer
named (by its plain name, or by its path in the calls under way) computes in float32 from its
first call on, with the layers inside it and those it calls.  The layers of a nested
functional model are called as that model is made, before it has a name to be part of their
path, so there a layer the last parts of a path name that fails in 16 bits is made float32
provisionally; once the model function has returned, ``apply`` finds the names in the built
model and puts the provisional layers they do not name back under the policy.

A name several layers have (the same layer in each copy of a block) names all of them: a
layer that fails as it is wired is known by its plain name only, which is the name its
refusal gives, and that flag has to work.

``flag(paths)`` is the exact flag for layers that should be float32: ``check``'s findings
print it, as does anything else that names such a layer.
"""
from __future__ import annotations

import contextlib
import difflib
import re
from typing import Any, Iterable, Iterator, List, Sequence, Tuple

from app.core.errors import UsageError

FLAG = "--float32-layers"
# The layers a resumed run keeps from its record (app.training.resuming), as a message names
# them when the model no longer has one.
KEPT_BY_RESUME = "the run's own float32 layers, kept by --resume,"
FORMS = ("comma-separated layer names of the model: a layer's full path (outer/inner for "
         "a layer of a nested model or layer) or its last parts, such as its plain name "
         "(every layer that has them)")
_SHOWN = 5          # closest names listed for a name the model does not have


def parse(value: Any, what: str = "float32_layers") -> Tuple[str, ...]:
    """The names in ``value``: None or "" (none), "a,b" or a list of names; whitespace
    around a name is dropped and a name given twice counts once.  An empty name in a list
    (``a,,b``) or something that is not text raises UsageError naming ``what`` (the
    setting, or the TFMP_ variable the value came from)."""
    if value is None:
        return ()
    if isinstance(value, str):
        if not value.strip():
            return ()
        items: Sequence[Any] = value.split(",")
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise UsageError(f"{what} must be layer names. Received: {what}={value!r}",
                         FORMS + ", e.g. predictions")
    names: List[str] = []
    for item in items:
        if not isinstance(item, str):
            raise UsageError(f"{what} must be layer names. Received: {item!r} in "
                             f"{what}={value!r}", FORMS + ", e.g. predictions")
        name = item.strip().strip("/")
        if not name:
            raise UsageError(f"{what} has an empty layer name. Received: "
                             f"{what}={value!r}", FORMS + ", e.g. predictions,norm")
        if name not in names:
            names.append(name)
    return tuple(names)


def text(names: Iterable[str]) -> str:
    """The names as the flag's value (and metrics.json's): ``a,b``."""
    return ",".join(names)


def flag(paths: Iterable[str]) -> str:
    """``--float32-layers a,b``: the flag that runs these layers in float32."""
    return f"{FLAG} {text(paths)}"


@contextlib.contextmanager
def while_building(names: Sequence[str]) -> Iterator[List[Tuple[Any, str]]]:
    """While the model function runs: each layer that ``names`` names gets the float32
    policy at its first call, before it computes anything, as do the layers inside it and
    every layer first called during its call (those it makes in ``build``).  Keras calls each
    layer of a functional or Sequential model as the function wires it, so a layer that would
    fail there in 16 bits never runs in 16 bits; a subclassed model's first call comes later,
    after ``apply``.  A name is matched as ``apply`` matches it, against the layer's path in
    the calls under way (``block/inner`` for a layer a layer of layers calls).

    The layers of a nested functional model are first called as that model is made, outside
    any call of it, so their path is not known yet.  A layer whose path so far ends a name
    given (``rotate`` for ``augment/rotate``) is called as it is; only when that call fails
    is it made float32 and called again, provisionally.  (Made float32 before its first call,
    a layer makes its variables float32 without Keras 2's casting wrapper, and could not go
    back to 16 bits.)  Yields the list of those [(layer, its policy before)] for ``apply``,
    which puts back the ones the names do not reach in the built model.  ``Layer.__call__``
    is wrapped for the model function's call only: training's steps run the plain one."""
    provisional: List[Tuple[Any, str]] = []
    if not names:
        yield provisional
        return
    import tensorflow as tf

    from app.precision.layer_policy import set_policy

    paths = [n for n in names if "/" in n]
    base = tf.keras.layers.Layer
    original = base.__dict__["__call__"]
    calls: List[str] = []      # the names of the layers whose calls are under way
    inside = [0]               # how many of those calls are of layers made float32 here

    def plain(layer, args, kwargs):
        calls.append(str(getattr(layer, "name", "")))
        try:
            return original(layer, *args, **kwargs)
        finally:
            calls.pop()

    def in_float32(layer, made, args, kwargs):
        for inner in _whole(layer):
            _to_float32(inner, made)
        inside[0] += 1
        try:
            return plain(layer, args, kwargs)
        finally:
            inside[0] -= 1

    def call(layer, *args, **kwargs):
        path = "/".join(calls + [str(getattr(layer, "name", ""))])
        if inside[0] or any(_names(n, path) for n in names):
            return in_float32(layer, None, args, kwargs)
        if not any(n.endswith("/" + path) for n in paths):
            return plain(layer, args, kwargs)
        try:
            return plain(layer, args, kwargs)
        except Exception as exc:   # whatever fails in 16 bits may run in float32
            failed = exc
        made = len(provisional)
        try:
            return in_float32(layer, provisional, args, kwargs)
        except Exception:   # float32 does not help: the error in 16 bits is the one to give
            pass
        for inner, before in provisional[made:]:
            set_policy(inner, before)
        del provisional[made:]
        raise failed
    base.__call__ = call
    try:
        yield provisional
    finally:
        base.__call__ = original


def _to_float32(layer, provisional) -> None:
    """Give ``layer`` the float32 policy; when ``provisional`` is a list, note there the
    layer and the policy it had."""
    from app.precision.layer_policy import policy_name, set_policy

    before = policy_name(layer)
    if before == "float32":
        return
    if provisional is not None:
        provisional.append((layer, before))
    set_policy(layer, "float32")


def _names(name: str, path: str) -> bool:
    """``name`` names the layer at ``path``: it is the path, or the path's last parts."""
    return path == name or path.endswith("/" + name)


def _matches(name: str, entries) -> list:
    """The entries ``name`` names: its full path, else every path ending in ``/name``."""
    exact = [e for e in entries if e[0] == name]
    if exact:
        return exact
    return [e for e in entries if _names(name, e[0])]


def _closest(name: str, paths: Sequence[str]) -> List[str]:
    """The model's layer paths most like ``name`` (its path or the path's last part)."""
    scored = []
    low = name.lower()
    for path in paths:
        last = path.rsplit("/", 1)[-1].lower()
        score = max(difflib.SequenceMatcher(None, low, path.lower()).ratio(),
                    difflib.SequenceMatcher(None, low, last).ratio())
        if low in path.lower():
            score = max(score, 0.6 + 0.4 * len(low) / max(len(path), 1))
        scored.append((score, path))
    scored.sort(key=lambda sp: -sp[0])
    good = [p for s, p in scored[:_SHOWN] if s >= 0.75]
    return good or [p for s, p in scored[:3] if s >= 0.4]


def _unnumbered(path: str) -> str:
    """A layer's last name without Keras' automatic number: ``dense_3`` -> ``dense``."""
    return re.sub(r"_\d+$", "", path.rsplit("/", 1)[-1])


def resolve(model, names: Sequence[str], spec: str, said: str = FLAG) -> List[Tuple[str, Any]]:
    """[(full path, layer)] of the layers each name in ``names`` names, in the order given
    (every layer a name fits: the same layer in each copy of a block).  A name the model
    does not have raises UsageError naming it as ``said`` gave it (the flag, its TFMP_
    variable, app.train's keyword, a resumed run's record), the forms allowed, and the
    model's layers that come closest."""
    from app.task import model_layers

    entries = model_layers.walk(model)
    paths = [p for p, _l, _parent in entries]
    found: List[Tuple[str, Any]] = []
    for name in names:
        hits = _matches(name, entries)
        if not hits:
            close = _closest(name, paths)
            near = (f"; the closest of its {len(paths)} layers: {', '.join(close)}" if close
                    else f"; none of its {len(paths)} layers is close (`tfmp check --model "
                    f"{spec}` lists them all)")
            if any(_unnumbered(c) == _unnumbered(name) for c in close):
                near += (" (Keras numbers automatic layer names on in a process that built "
                         "the model before, such as a notebook: name the layer in the model, "
                         "or use the name this process gives it)")
            raise UsageError(f"{said} {name!r}: model {spec!r} has no layer of that name{near}",
                             FORMS)
        for path, layer, _parent in hits:
            if all(p != path for p, _l in found):
                found.append((path, layer))
    return found


def apply(model, names: Sequence[str], spec: str,
          provisional: Sequence[Tuple[Any, str]] = (), said: str = FLAG) -> Tuple[Any, List[str]]:
    """Give the layers ``names`` name (and, for a nested model or a layer of layers, every
    layer inside it) the float32 policy; returns (the model, their full paths).  Call it
    after the model function returned and before the model's first call (``Task.build``).
    ``provisional``: what ``while_building`` made float32 by the end of a path, [(layer,
    its policy before)]; those the names do not reach here go back to that policy.  The
    model is ``model`` itself, or, when a layer named made its variables 16-bit, its clone
    with that layer made again in float32 (``_rebuilt``).  ``said``: how the user gave the
    names (``resolve``)."""
    if not names:
        return model, []
    from app.precision.layer_policy import set_policy

    found = resolve(model, names, spec, said)
    reached = {id(inner) for _path, layer in found for inner in _whole(layer)}
    for layer, before in provisional:
        if id(layer) not in reached:
            set_policy(layer, before)
    sixteen = [(path, layer) for path, layer in found if _sixteen_bit(layer)]
    if sixteen:
        model = _rebuilt(model, sixteen, spec, said)
        found = resolve(model, [path for path, _layer in found], spec, said)   # the clone's
    for _path, layer in found:
        for inner in _whole(layer):
            set_policy(inner, "float32")
    return model, [path for path, _layer in found]


def _whole(layer) -> list:
    """``layer`` and every layer inside it (a nested model's, a layer of layers'): what a
    name that names it makes float32."""
    from app.task import model_layers

    return [layer] + [inner for _path, inner, _parent in model_layers.walk(layer)]


def _sixteen_bit(layer) -> List[str]:
    """The 16-bit dtypes of ``layer``'s variables: made in its compute dtype when the model
    was built (Keras 2's Normalization, as in EfficientNet; or dtype='float16')."""
    from app.core.catalog import SIXTEEN_BIT
    from app.precision.finite import variables_of
    from app.task.model_layers import dtype_name

    return sorted({dtype_name(w.dtype) for w in variables_of(layer.weights)} & set(SIXTEEN_BIT))


def _rebuilt(model, sixteen: Sequence[Tuple[str, Any]], spec: str, said: str = FLAG):
    """A built layer keeps its variables, so one whose variables are 16-bit (``sixteen``:
    [(full path, layer)]) cannot compute in float32 as it is: the model is cloned
    (``clone_model``) with those layers made again from their config with dtype='float32',
    and every layer's weights carried over (cast to the clone's dtypes).  A layer inside a
    nested model, or a model that is not a graph of layers (a subclassed model), cannot be
    cloned so: one line."""
    import numpy as np
    import tensorflow as tf

    from app.task.model_layers import dtype_name

    top = {layer.name for layer in getattr(model, "layers", [])}
    inner = [(path, layer) for path, layer in sixteen if path not in top]
    if inner or not _is_graph_model(model):
        raise _cannot_rebuild(*(inner or sixteen)[0], spec,
                              "a layer of a nested model" if inner else "a subclassed model",
                              said)
    remade = {path for path, _layer in sixteen}

    def clone(layer):
        config = layer.get_config()
        if layer.name in remade:
            config["dtype"] = "float32"
        return layer.__class__.from_config(config)
    try:
        fresh = tf.keras.models.clone_model(model, clone_function=clone)
    except Exception as exc:   # a custom layer without a working get_config, and the like
        raise _cannot_rebuild(*sixteen[0], spec, f"cloning it failed: {exc}", said) from None
    for old, new in zip(model.layers, fresh.layers):
        new.set_weights([np.asarray(w).astype(tf.as_dtype(dtype_name(v.dtype)).as_numpy_dtype)
                         for w, v in zip(old.get_weights(), new.weights)])
    return fresh


def _is_graph_model(model) -> bool:
    """A Functional or Sequential model (a graph of layers ``clone_model`` can remake)."""
    return bool(getattr(model, "_is_graph_network", False)) or \
        type(model).__name__ in ("Functional", "Sequential")


def _cannot_rebuild(path: str, layer, spec: str, why: str, said: str = FLAG):
    return UsageError(
        f"{said} {path!r}: model {spec!r} made that layer's variables "
        f"{'/'.join(_sixteen_bit(layer))} (in its 16-bit dtype, when the model was built), "
        f"and the model cannot be made again with them in float32 ({why})",
        "the layers after it (such as the output layer); or give that layer "
        "dtype='float32' where the model is built")
