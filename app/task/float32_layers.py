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
after any float32 layer), and Keras saves each layer's policy with the model.

``flag(paths)`` is the exact flag for layers that should be float32: ``check``'s findings
print it, as does anything else that names such a layer.
"""
from __future__ import annotations

import difflib
import re
from typing import Any, Iterable, List, Sequence, Tuple

from app.core.errors import UsageError

FLAG = "--float32-layers"
FORMS = ("comma-separated layer names of the model: a layer's full path (outer/inner for "
         "a layer of a nested model or layer) or its plain name when no other layer has it")
_SHOWN = 5          # closest names listed for a name the model does not have


def parse(value: Any) -> Tuple[str, ...]:
    """The names in ``value``: None or "" (none), "a,b" or a list of names; whitespace
    around a name is dropped and a name given twice counts once.  An empty name in a list
    (``a,,b``) or something that is not text raises UsageError."""
    if value is None:
        return ()
    if isinstance(value, str):
        if not value.strip():
            return ()
        items: Sequence[Any] = value.split(",")
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise UsageError(f"float32_layers must be layer names. Received: float32_layers={value!r}",
                         FORMS + ", e.g. predictions")
    names: List[str] = []
    for item in items:
        if not isinstance(item, str):
            raise UsageError(f"float32_layers must be layer names. Received: {item!r} in "
                             f"float32_layers={value!r}", FORMS + ", e.g. predictions")
        name = item.strip().strip("/")
        if not name:
            raise UsageError(f"float32_layers has an empty layer name. Received: "
                             f"float32_layers={value!r}", FORMS + ", e.g. predictions,norm")
        if name not in names:
            names.append(name)
    return tuple(names)


def text(names: Iterable[str]) -> str:
    """The names as the flag's value (and metrics.json's): ``a,b``."""
    return ",".join(names)


def flag(paths: Iterable[str]) -> str:
    """``--float32-layers a,b``: the flag that runs these layers in float32."""
    return f"{FLAG} {text(paths)}"


def _matches(name: str, entries) -> list:
    """The entries ``name`` names: its full path, else every path ending in ``/name``."""
    exact = [e for e in entries if e[0] == name]
    if exact:
        return exact
    return [e for e in entries if e[0].endswith("/" + name)]


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


def resolve(model, names: Sequence[str], spec: str) -> List[Tuple[str, Any]]:
    """[(full path, layer)] of each name in ``names``, in the order given.  A name the
    model does not have, or one that fits several of its layers, raises UsageError naming
    it, the forms allowed, and the model's layers that come closest."""
    from app.task import model_layers

    entries = model_layers.walk(model)
    paths = [p for p, _l, _parent in entries]
    found: List[Tuple[str, Any]] = []
    for name in names:
        hits = _matches(name, entries)
        if len(hits) > 1:
            raise UsageError(
                f"{FLAG} {name!r}: model {spec!r} has {len(hits)} layers of that name "
                f"({', '.join(p for p, _l, _parent in hits[:_SHOWN])}"
                f"{', ...' if len(hits) > _SHOWN else ''})",
                "one layer's full path, e.g. " + hits[0][0])
        if not hits:
            close = _closest(name, paths)
            near = (f"; the closest of its {len(paths)} layers: {', '.join(close)}" if close
                    else f"; none of its {len(paths)} layers is close (`tfmp check --model "
                    f"{spec}` lists them all)")
            if any(_unnumbered(c) == _unnumbered(name) for c in close):
                near += (" (Keras numbers automatic layer names on in a process that built "
                         "the model before, such as a notebook: name the layer in the model, "
                         "or use the name this process gives it)")
            raise UsageError(f"{FLAG} {name!r}: model {spec!r} has no layer of that name{near}",
                             FORMS)
        path, layer, _parent = hits[0]
        if all(p != path for p, _l in found):
            found.append((path, layer))
    return found


def apply(model, names: Sequence[str], spec: str) -> List[str]:
    """Give the layers ``names`` name (and, for a nested model or a layer of layers, every
    layer inside it) the float32 policy; returns their full paths.  Call it after the model
    function returned and before the model's first call (``Task.build``)."""
    if not names:
        return []
    from app.precision.layer_policy import set_policy
    from app.task import model_layers

    found = resolve(model, names, spec)
    for path, layer in found:
        _check_variables(path, layer, spec)
    for _path, layer in found:
        set_policy(layer, "float32")
        for _inner_path, inner, _parent in model_layers.walk(layer):
            set_policy(inner, "float32")
    return [path for path, _layer in found]


def _check_variables(path: str, layer, spec: str) -> None:
    """A layer whose variables are 16-bit (made in its compute dtype when the model was
    built, as Keras 2's Normalization does, or dtype='float16') cannot compute in float32
    with them: a clone would make them again, a built layer keeps them.  One line instead
    of a dtype clash in its first call."""
    sixteen = sorted({str(getattr(w.dtype, "name", w.dtype)) for w in layer.weights}
                     & {"float16", "bfloat16"})
    if sixteen:
        raise UsageError(
            f"{FLAG} {path!r}: model {spec!r} made that layer's variables "
            f"{'/'.join(sixteen)} (in its 16-bit dtype, when the model was built), so it "
            "cannot compute in float32 without being built again",
            "the layers after it (such as the output layer); or give that layer "
            "dtype='float32' where the model is built")
