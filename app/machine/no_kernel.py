"""How TensorFlow says an op has no kernel for a 16-bit dtype, read from its errors: the
line that says it, the op, and the layer it was in (named by Keras, or by the failing
node's name scopes).  Text only; ``app.machine.kernels`` turns it into the refusal."""
from __future__ import annotations

import re
from typing import Optional, Sequence, Tuple

# How TensorFlow says an op has no kernel for a 16-bit dtype: when the op is made (a traced
# call), "Value passed to parameter 'input' has DataType bfloat16 not in list of allowed
# values: float16, float32, float64"; when it runs, "Could not find device for node: {{node
# Lgamma}} = Lgamma[T=DT_BFLOAT16]" or "No OpKernel was registered to support Op 'Lgamma'
# ... [T=DT_BFLOAT16]".  float16 ("half" in the first, DT_HALF in the others) has CPU
# kernels for every kind probed, but not for every op (AdjustContrastv2, which Keras'
# RandomContrast runs, is float32 only on a CPU).
DTYPE_NAMES = {"bfloat16": ("bfloat16", "DT_BFLOAT16"), "float16": ("half", "DT_HALF")}
POLICY_DTYPES = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


def _patterns(dtype: str):
    said, enum = DTYPE_NAMES[dtype]
    return (re.compile(rf"DataType {said} not in list of allowed values"),
            re.compile(r"Could not find device for node: \{\{node [^}]*\}\} = (\w+)\[[^\]]*"
                       + enum),
            re.compile(rf"No OpKernel was registered to support Op '(\w+)'.*{enum}"))


# The layer around it: Keras 2 'Exception encountered when calling layer "lstm" (type
# LSTM).', Keras 3 'Exception encountered when calling LogGamma.call().'
_CALLED_LAYER = (re.compile(r'calling layer "([^"]+)" \(type (\w+)\)'),
                 re.compile(r"calling ()(\w+)\.call\(\)"))


def line(exc: BaseException, dtype: str) -> Optional[str]:
    """The line of ``exc`` saying an op takes no ``dtype`` (bfloat16 or float16), else None."""
    patterns = _patterns(dtype)
    for said in str(exc).splitlines():
        if any(p.search(said) for p in patterns):
            return said.strip()[:200]
    return None


def op_of(text: str, dtype: str) -> Optional[str]:
    """The op a no-kernel ``text`` names (None when it names none: an op being made)."""
    for p in _patterns(dtype)[1:]:
        found = p.search(text)
        if found:
            return found.group(1)
    return None


def called_layer(text: str) -> Tuple[str, str]:
    """(layer name, class name) of the layer Keras says it was calling; "" for what it
    does not say (Keras 3 gives the class only)."""
    called = next((m for m in (p.search(text) for p in _CALLED_LAYER) if m), None)
    return called.groups() if called else ("", "")


def node_layer(text: str, paths: Sequence[str]) -> str:
    """The layer a failing node belongs to, from its name in a traced step
    ("{{node model/augment/random_contrast/loop_body/adjust_contrast}}"): the longest run of
    the node's name scopes that is one of the layers' ``paths``."""
    found = re.search(r"\{\{node ([^}]+)\}\}|\[\[([^\]]+)\]\]", text)
    if not found or not paths:
        return ""
    known = set(paths)
    parts = {part for path in paths for part in path.split("/")}
    # A scope is a layer's name, or (Keras 3, a layer called again) that name and "_1".
    scopes = [scope if scope in parts else re.sub(r"_\d+$", "", scope)
              for scope in (found.group(1) or found.group(2)).split("/")]
    runs = ("/".join(scopes[i:j]) for i in range(len(scopes))
            for j in range(i + 1, len(scopes) + 1))
    return max((run for run in runs if run in known), key=len, default="")
