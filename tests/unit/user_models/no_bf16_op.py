"""A custom layer whose op has no bfloat16 CPU kernel in TensorFlow 2.9 or 2.21 (Lgamma):
the model builds under mixed_bfloat16 and fails on its first batch."""
import tensorflow as tf


class LogGamma(tf.keras.layers.Layer):
    def call(self, x):
        return tf.math.lgamma(tf.nn.softplus(x) + 1.0)


def build(input_shape, num_classes):
    inputs = tf.keras.Input(input_shape)
    h = tf.keras.layers.Dense(32)(tf.keras.layers.Flatten()(inputs))
    h = LogGamma(name="log_gamma")(h)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes, dtype="float32")(h))


def rotated(input_shape, num_classes):
    """Keras 2.9's RandomRotation fails under mixed_bfloat16 as the model function calls it:
    the transform op it wires takes no bfloat16 (where Keras' own ops take it, it builds)."""
    inputs = tf.keras.Input(input_shape)
    h = tf.keras.layers.RandomRotation(0.1, name="rotate")(inputs)
    h = tf.keras.layers.Dense(32, activation="relu")(tf.keras.layers.Flatten()(h))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes, dtype="float32")(h))
