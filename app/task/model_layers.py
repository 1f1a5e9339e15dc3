"""A model's layers as a tree: each layer once, depth first, named by its full path (a layer
of a layer: ``outer/inner``).  ``check`` reads its findings off it, and a model just built is
checked here against the layer kinds this TensorFlow can run (``app.machine.kernels``)."""
from __future__ import annotations

from typing import List, Optional, Tuple

from app.core.catalog import SIXTEEN_BIT
from app.machine import kernels


def dtype_name(d) -> Optional[str]:
    """A dtype's name ('float16'), whether TensorFlow's DType or Keras 3's string; None for
    None."""
    if d is None:
        return None
    return str(getattr(d, "name", d))


def is_model(layer) -> bool:
    import tensorflow as tf

    return isinstance(layer, tf.keras.Model)


def is_input(layer) -> bool:
    return type(layer).__name__ == "InputLayer"


def children(layer) -> list:
    try:
        return list(layer._flatten_layers(include_self=False, recursive=False))
    except (AttributeError, TypeError):
        return list(getattr(layer, "layers", []) or [])


def walk(model) -> List[tuple]:
    """[(path, layer, parent_model_or_None)] depth first, each layer once, inputs left out."""
    seen, out = set(), []

    def visit(layer, prefix, parent):
        for child in children(layer):
            if id(child) in seen:
                continue
            seen.add(id(child))
            path = f"{prefix}{child.name}"
            if not is_input(child):
                out.append((path, child, parent))
            visit(child, path + "/", child if is_model(child) else parent)
    visit(model, "", None)
    return out


def sixteen_bit_layers(model) -> List[Tuple[str, str, Optional[str]]]:
    """(path, class name, kind or None) of the model's layers that compute in bfloat16
    (nested models left out: their own layers are listed)."""
    import tensorflow as tf

    out = []
    for path, layer, _parent in walk(model):
        dtype = getattr(layer, "compute_dtype", None)
        if dtype_name(dtype) == kernels.PROBED_DTYPE and \
                not isinstance(layer, tf.keras.Model):
            out.append((path, type(layer).__name__, kernels.kind_of(layer)))
    return out


def check_model(model, spec: str) -> None:
    """A model just built (before its first forward pass): raise the refusal when a layer
    computing in bfloat16 is of a kind this TensorFlow cannot run here.  Models without a
    bfloat16 layer are not probed."""
    layers = sixteen_bit_layers(model)
    if not layers:
        return
    refusal = kernels.refusal_for_layers(kernels.support(kernels.PROBED_POLICY), layers, spec)
    if refusal is not None:
        raise refusal


def refusal_from_build_error(exc: BaseException, spec: str, model=None):
    """The kernels refusal for a model that failed under the mixed policy now set, as its
    build function called a layer, on its first batch or in its first training step, because
    an op takes no 16-bit input here, else None.  ``model``, when there is one, names a layer
    the error gives only the class or the node of."""
    from app.precision.policy import global_policy_name

    layers = [(path, type(layer).__name__)
              for path, layer, _parent in (walk(model) if model is not None else ())]
    return kernels.refusal_from_error(exc, spec, layers, global_policy_name())


def policy_mismatch(model, policy: str, float32_paths=()) -> Optional[str]:
    """One warning when the model's layers do not compute in the dtypes the run's ``policy``
    gives (a layer's dtype is fixed when it is made): a model made before the policy was set
    (returned from a global, or passed to ``app.train`` already built) computes in float32
    under a mixed policy, and gets no speed-up; one made under mixed_float16 runs float16
    under another policy, which has no loss scaling for it.  None when they agree (layers
    set to float32 on purpose, beside 16-bit ones, are no mismatch; nor are those
    ``--float32-layers`` names, ``float32_paths``)."""
    import tensorflow as tf

    wanted = tf.keras.mixed_precision.Policy(policy).compute_dtype
    dtypes = [(path, dtype_name(getattr(layer, "compute_dtype", None)))
              for path, layer, parent in walk(model) if not is_model(layer)
              and not any(path == p or path.startswith(p + "/") for p in float32_paths)
              and not _float32_on_purpose(layer, parent or model, wanted)]
    dtypes = [(path, d) for path, d in dtypes if d is not None]
    if not dtypes:
        return None
    fix = ("build the model inside the model function, which the run calls after it sets "
           "the policy (to app.train pass the function, not a model already built)")
    other = [(path, d) for path, d in dtypes if d in SIXTEEN_BIT and d != wanted]
    if other:
        kind = other[0][1]
        scaled = (f", and this run has no loss scaling for {kind}: small gradients flush to 0"
                  if kind == "float16" else "")
        return (f"{len(other)} layer(s) of the model compute in {kind} (first: "
                f"{other[0][0]!r}) although the policy is {policy}: they were made under "
                f"another policy{scaled}; {fix}")
    if wanted != "float32" and not any(d == wanted for _, d in dtypes):
        return (f"every layer of the model computes in float32 although the policy is "
                f"{policy}: the model was made before the policy was set, so it gets no "
                f"speed-up; {fix}")
    return None


def _float32_on_purpose(layer, container, wanted: str) -> bool:
    """A float32 layer in a model made under the run's 16-bit policy (the model's own policy
    is that one) had float32 given to it (``dtype="float32"``): made before the policy was
    set, its model would be float32 too.  No layer's record says whether its dtype was given."""
    if wanted == "float32" or dtype_name(getattr(layer, "compute_dtype", None)) != "float32":
        return False
    own = getattr(container, "dtype_policy", None) or getattr(container, "_dtype_policy", None)
    return dtype_name(getattr(own, "compute_dtype", None)) == wanted
