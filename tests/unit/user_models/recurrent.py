"""A sequence model of a user's kind: an LSTM over short sequences whose class shifts one
feature, learnable in a few epochs.  Keras 2.9's LSTM and GRU cannot be traced under
mixed_bfloat16 (cuDNN's fused op takes no bfloat16): ``auto`` must not pick it for them."""
import numpy as np
import tensorflow as tf

STEPS, FEATURES = 12, 4


def _draw(n, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    x = rng.normal(size=(n, STEPS, FEATURES)).astype(np.float32)
    x[:, :, 0] += np.where(y[:, None] == 1, 0.8, -0.8)
    return x, y


def arrays():
    return _draw(512, 0), _draw(128, 1)


def build(num_classes):
    inputs = tf.keras.Input((STEPS, FEATURES))
    h = tf.keras.layers.LSTM(16)(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes, dtype="float32")(h))


def build_generic(num_classes):
    """An LSTM Keras 2 will not run on cuDNN (recurrent_dropout): its generic loop only."""
    inputs = tf.keras.Input((STEPS, FEATURES))
    h = tf.keras.layers.LSTM(16, recurrent_dropout=0.1)(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes, dtype="float32")(h))
