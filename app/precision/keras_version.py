"""Which Keras runs: 2 (TF 2.9-2.15, ``tf.keras``) or 3 (TF 2.16+).  The one place that
asks; the seams that differ (loss scaling, checkpoints, the loops) read it from here."""
from __future__ import annotations

import tensorflow as tf

KERAS_MAJOR = int(str(getattr(tf.keras, "__version__", "2")).split(".")[0])
IS_KERAS3 = KERAS_MAJOR >= 3
