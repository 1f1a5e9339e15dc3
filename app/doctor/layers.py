"""What the model's layers say about it under a dtype policy, before any step is run.

* ``walk``        - every layer, nested ones included, with a path-like name;
* ``table``       - class, compute dtype, variable dtype and output dtype of each;
* ``dtype_findings`` - layers computing in float32 under a mixed policy (and the likely
  reason), layers whose variables are 16-bit, layers that compute in 16 bits but hand on
  float32 (not policy-aware), a softmax computed in 16 bits, and the model's output dtype;
* ``tensor_core_findings`` - sizes that are not multiples of 8 (float16 on Tensor Cores).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from app.core.catalog import SIXTEEN_BIT
from app.doctor.report import BLOCKER, INFO, WARNING, Finding
from app.task.float32_layers import FLAG as F32_FLAG, flag as f32_flag
from app.task.model_layers import dtype_name, is_model
from app.precision.policy import (TENSOR_CORE_MULTIPLE, off_tensor_core_tiles, pad_to_tiles,
                                  round_to_tiles)

OUTPUT_FIX = ("make the last layer float32: dtype='float32' on it (e.g. Dense(n, "
              "activation='softmax', dtype='float32')), or add "
              "tf.keras.layers.Activation('linear', dtype='float32') after it")
AWARE_FIX = ("make every tensor the layer creates itself in call() follow the policy: "
             "tf.cast(t, self.compute_dtype) for constants, tf.ones/zeros and float32 "
             "variables, or create weights with self.add_weight()")


def _policy_name(layer) -> str:
    pol = getattr(layer, "dtype_policy", None) or getattr(layer, "_dtype_policy", None)
    return str(getattr(pol, "name", pol)) if pol is not None else str(getattr(layer, "dtype", ""))


def _functional_output_dtype(layer) -> Optional[str]:
    try:
        out = layer.output
    except Exception:  # subclassed, nested or called several times
        return None
    import tensorflow as tf

    flat = tf.nest.flatten(out)
    return dtype_name(getattr(flat[0], "dtype", None)) if flat else None


def _own_weights(layer) -> list:
    from app.precision.finite import variables_of

    return variables_of(getattr(layer, "weights", []) or [])


def _has_kernel(layer) -> bool:
    return any(len(getattr(w, "shape", ())) >= 2 for w in _own_weights(layer))


def table(entries, captured: Dict[int, dict]) -> List[dict]:
    rows = []
    for path, layer, _parent in entries:
        cap = captured.get(id(layer)) or {}
        variables = sorted({dtype_name(w.dtype) for w in _own_weights(layer)})
        rows.append({
            "name": path,
            "class": type(layer).__name__,
            "policy": _policy_name(layer),
            "compute_dtype": dtype_name(getattr(layer, "compute_dtype", None)),
            "variable_dtype": (",".join(variables) if variables
                               else dtype_name(getattr(layer, "variable_dtype", None))),
            "output_dtype": cap.get("dtype") or _functional_output_dtype(layer),
            "nested_model": is_model(layer),
        })
    return rows


def _is_cast(layer) -> bool:
    """A deliberate ``tf.cast`` on a functional model's tensors (Keras 2 wraps it in a
    TFOpLambda layer): a float32 result is what the user asked for."""
    return "cast" in str(getattr(layer, "symbol", "") or "").split(".")[-1]


def _is_softmax(layer) -> bool:
    if type(layer).__name__ == "Softmax":
        return True
    act = getattr(layer, "activation", None)
    return getattr(act, "__name__", "") == "softmax"


# ---- dtype findings -------------------------------------------------------------------------

def dtype_findings(model, entries, rows, policy: str, model_outputs,
                   chosen: Sequence[str] = ()) -> List[Finding]:
    """``model_outputs``: [(dtype name, producing layer or None)] of the model's outputs;
    ``chosen``: the full paths ``--float32-layers`` set to float32 (their layers' float32
    is what the user asked for).  A layer a finding says should compute in float32 gets
    the exact ``--float32-layers`` flag in its fix."""
    findings: List[Finding] = []
    mixed = policy.startswith("mixed_")
    by_path = {r["name"]: r for r in rows}
    layers = [(p, l, parent) for p, l, parent in entries if not is_model(l)]
    computing = [(p, l, parent) for p, l, parent in layers
                 if by_path[p]["compute_dtype"] is not None]

    for path, layer, _ in layers:
        row = by_path[path]
        if row["variable_dtype"] and any(d in SIXTEEN_BIT
                                         for d in row["variable_dtype"].split(",")):
            findings.append(Finding(
                WARNING, "variable_dtype", path,
                f"its variables are {row['variable_dtype']} (policy {row['policy']}): small "
                "weight updates are lost when the weights themselves are 16-bit",
                f"without editing the model: {f32_flag([path])} (the layer is made again "
                f"with float32 variables, its weights kept); or give it the mixed policy "
                f"(dtype='{policy if mixed else 'mixed_float16'}' or no dtype at all): float32 "
                "variables, 16-bit math"))
    if mixed:
        findings += _float32_layers(entries, computing, by_path, policy, chosen, model)
        upcasting = [p for p, l, _ in computing if by_path[p]["compute_dtype"] in SIXTEEN_BIT
                     and by_path[p]["output_dtype"] == "float32" and not _is_cast(l)]
        for path in upcasting:
            if any(other.startswith(path + "/") for other in upcasting):
                continue  # a container passing on what its inner layer made: name that one
            row = by_path[path]
            findings.append(Finding(
                WARNING, "not_policy_aware", path,
                f"computes in {row['compute_dtype']} but its output is float32: something "
                "it creates in call() is float32 and promotes the result, so its math runs "
                "(partly) in float32 and the next layer casts back",
                AWARE_FIX))
        for path, layer, _ in computing:
            row = by_path[path]
            if row["compute_dtype"] in SIXTEEN_BIT and _is_softmax(layer) and not any(
                    out_layer is layer for _, out_layer in model_outputs):
                findings.append(Finding(
                    WARNING, "softmax_16bit", path,
                    f"computes a softmax in {row['compute_dtype']} and a later layer casts it: "
                    "the probabilities lose precision before the loss",
                    "compute the softmax itself in float32: Activation('softmax', "
                    "dtype='float32') as the last layer"))
    path_of = {id(l): p for p, l, _ in entries}
    for dtype, out_layer in model_outputs:
        if dtype in SIXTEEN_BIT:
            name = path_of.get(id(out_layer), getattr(out_layer, "name", None))
            kind = ("softmax" if out_layer is not None and _is_softmax(out_layer)
                    else "output (logits or values)")
            findings.append(Finding(
                BLOCKER, "output_dtype", name,
                f"the model's {kind} is {dtype}: the loss is computed from 16-bit values "
                "(the softmax and cross-entropy lose precision, large logits overflow)",
                OUTPUT_FIX))
    return _with_flag(findings, set(path_of.values()))


# The findings whose fix is "compute this layer in float32".
FLOAT32_FIXES = ("output_dtype", "softmax_16bit")


def _with_flag(findings: List[Finding], paths) -> List[Finding]:
    """The fix of each finding that wants its layer in float32 starts with the one flag
    that does it for all of them, without editing the model."""
    wanted: List[str] = []
    for f in findings:
        if f.check in FLOAT32_FIXES and f.layer in paths and f.layer not in wanted:
            wanted.append(f.layer)
    if not wanted:
        return findings
    how = (f"run it in float32 without editing the model: {f32_flag(wanted)}" if len(wanted) == 1
           else f"run these {len(wanted)} layers in float32 without editing the model: "
                f"{f32_flag(wanted)}")
    for f in findings:
        if f.check in FLOAT32_FIXES and f.layer in wanted:
            f.fix = f"{how}; or {f.fix}" if f.fix else how
    return findings


def _float32_layers(entries, computing, by_path, policy, chosen=(),
                    model=None) -> List[Finding]:
    findings: List[Finding] = []
    asked = [p for p, _l, _par in computing
             if any(p == c or p.startswith(c + "/") for c in chosen)]
    for path in asked:
        findings.append(Finding(
            INFO, "float32_layer", path,
            f"computes in float32 under {policy}, as {F32_FLAG} asks", None))
    computing = [e for e in computing if e[0] not in asked]
    f32 = [(p, l, parent) for p, l, parent in computing if by_path[p]["compute_dtype"] == "float32"]
    if not f32:
        return findings
    # Made under the policy (the model's own policy is the mixed one), its float32 layers
    # were given float32 on purpose: each is named below, not "built before the policy".
    if len(f32) == len(computing) and _policy_name(model) != policy:
        findings.append(Finding(
            WARNING, "float32_layer", None,
            f"every layer computes in float32 although the policy is {policy}: the model "
            "was built before the policy was set (built at import time, returned from a "
            "global, or loaded from a file saved under float32), so it gets no speed-up",
            "build the model inside the model function, after the policy is set (the app "
            "sets it before calling your function); for a saved model, rebuild the "
            "architecture under the policy and load only the weights"))
        return findings
    # A nested model whose layers are all float32: built or loaded before the policy.
    reported_parents = set()
    for path, layer, parent in f32:
        if parent is None or id(parent) in reported_parents:
            continue
        members = [p for p, l, par in computing if par is parent]
        # Created under the mixed policy, a nested model's own policy is mixed even when
        # its last layers are float32 on purpose; float32 means it predates the policy.
        if members and _policy_name(parent) == "float32" and all(
                by_path[p]["compute_dtype"] == "float32" for p in members):
            reported_parents.add(id(parent))
            findings.append(Finding(
                WARNING, "float32_layer", parent.name,
                f"every layer of the nested model {parent.name!r} computes in float32 under "
                f"{policy}: it was built or loaded before the policy was set (a pretrained "
                "or hub model?)",
                "rebuild it under the policy and load its weights (set the policy before "
                "creating it)"))
    last16 = max((i for i, (p, l, par) in enumerate(computing)
                  if by_path[p]["compute_dtype"] in SIXTEEN_BIT), default=-1)
    for i, (path, layer, parent) in enumerate(computing):
        if by_path[path]["compute_dtype"] != "float32" or (parent is not None and
                                                           id(parent) in reported_parents):
            continue
        if i > last16:
            findings.append(Finding(
                INFO, "float32_layer", path,
                "computes in float32 at the end of the model (dtype set explicitly), as "
                "recommended for the output", None))
        elif _has_kernel(layer):
            findings.append(Finding(
                WARNING, "float32_layer", path,
                f"computes in float32 under {policy} (dtype set explicitly on the layer, or "
                "it was created before the policy): its matrix math gets no 16-bit speed-up",
                "remove dtype='float32' from the layer unless it is there for numerical "
                "stability; create it after the policy is set"))
        else:
            findings.append(Finding(
                INFO, "float32_layer", path,
                f"computes in float32 under {policy} (dtype set explicitly); cheap for a "
                "layer without a weight matrix, and fine for normalization or softmax", None))
    return findings


# ---- Tensor Core fit --------------------------------------------------------------------------

def _kernel_shape(layer):
    k = getattr(layer, "kernel", None)
    shape = getattr(k, "shape", None)
    return tuple(int(d) for d in shape) if shape is not None else None


def tensor_core_findings(entries, rows, batch_size: int, num_classes: Optional[int],
                         input_channels: Optional[int]) -> List[Finding]:
    """Sizes that keep float16 matrix math off Tensor Cores (cuDNN/cuBLAS want multiples of 8)."""
    by_path = {r["name"]: r for r in rows}
    findings: List[Finding] = []
    m = TENSOR_CORE_MULTIPLE
    off = off_tensor_core_tiles

    sixteen = [(p, l) for p, l, _ in entries
               if not is_model(l) and by_path[p]["compute_dtype"] in SIXTEEN_BIT]
    dense = [(p, l) for p, l in sixteen if hasattr(l, "units") and _kernel_shape(l)]
    output_dense = dense[-1][0] if dense and num_classes and \
        int(dense[-1][1].units) == int(num_classes) else None
    first_conv = True
    for path, layer in sixteen:
        cls = type(layer).__name__
        if hasattr(layer, "units") and _kernel_shape(layer):
            if off(layer.units):
                if path == output_dense:
                    findings.append(Finding(
                        INFO, "tensor_cores", path,
                        f"{cls} output layer has {layer.units} units (one an output), not a "
                        f"multiple of {m}", "nothing to do for a small output layer; for a "
                        "large one, pad the outputs (classes) to a multiple of 8"))
                else:
                    findings.append(Finding(
                        WARNING, "tensor_cores", path,
                        f"{cls} has {layer.units} units, not a multiple of {m}: float16 "
                        "matrix math cannot use Tensor Cores fully",
                        f"use a multiple of {m} (e.g. {round_to_tiles(layer.units)})"))
        elif hasattr(layer, "filters") and _kernel_shape(layer):
            kshape = _kernel_shape(layer)
            transpose = "Transpose" in cls
            channels = kshape[-1] if transpose else kshape[-2] * int(getattr(layer, "groups", 1) or 1)
            if off(layer.filters):
                findings.append(Finding(
                    WARNING, "tensor_cores", path,
                    f"{cls} has {layer.filters} filters, not a multiple of {m}",
                    f"use a multiple of {m} (e.g. {round_to_tiles(layer.filters)})"))
            if off(channels):
                if first_conv and input_channels is not None and channels == input_channels:
                    findings.append(Finding(
                        INFO, "tensor_cores", path,
                        f"{cls} reads the {channels} input channels of the data (not a multiple "
                        f"of {m})", "nothing to do: cuDNN pads the first layer's channels"))
                else:
                    findings.append(Finding(
                        WARNING, "tensor_cores", path,
                        f"{cls} has {channels} input channels, not a multiple of {m}",
                        f"make the layer before it produce a multiple of {m} channels"))
            first_conv = False
        elif hasattr(layer, "input_dim") and hasattr(layer, "output_dim"):
            if off(layer.output_dim):
                findings.append(Finding(
                    WARNING, "tensor_cores", path,
                    f"{cls} has output_dim {layer.output_dim}, not a multiple of {m}: the "
                    "layers after it multiply by a size that misses Tensor Cores",
                    f"use a multiple of {m} (e.g. {round_to_tiles(layer.output_dim)})"))
            if off(layer.input_dim):
                findings.append(Finding(
                    INFO, "tensor_cores", path,
                    f"{cls} vocabulary size {layer.input_dim} is not a multiple of {m}",
                    f"pad it to {pad_to_tiles(layer.input_dim)} if the embedding matrix is also "
                    "used as the output projection"))
    if off(batch_size):
        findings.append(Finding(
            WARNING, "tensor_cores", None,
            f"batch size {batch_size} is not a multiple of {m}",
            f"use a multiple of {m} (e.g. {round_to_tiles(batch_size)})"))
    return findings
