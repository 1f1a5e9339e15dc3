"""One layer's dtype policy, read and set the same way under Keras 2 and Keras 3.

The numerics sentinel replays a failing batch with every layer computing in float32, and
``--float32-layers`` runs the layers it names in float32 inside a mixed-precision model.
Both change the policy of a layer that is already built: its variables are float32 under
every mixed policy, so only the dtype its call computes in changes, from its next call on
(a step traced before keeps the dtypes it was traced with).
"""
from __future__ import annotations

import tensorflow as tf

from app.precision.keras_version import IS_KERAS3


def policy_name(layer) -> str:
    """'float32', 'mixed_float16', 'mixed_bfloat16', ... of ``layer``."""
    policy = getattr(layer, "dtype_policy", None)
    return str(getattr(policy, "name", policy))


def set_policy(layer, name: str) -> None:
    """Make ``layer`` compute under the policy ``name`` from its next call on."""
    if IS_KERAS3:
        layer.dtype_policy = name
        return
    # Keras 2 has no public setter; _set_dtype_policy is what the constructor's
    # dtype= argument calls, and it updates the compute dtype and autocasting together.
    layer._set_dtype_policy(tf.keras.mixed_precision.Policy(name))
