"""A user's model with a custom layer that respects the layer's compute dtype.

What `docs/your-model.md` recommends: make every tensor the layer creates itself in the
layer's ``compute_dtype`` (here a learned scale through ``add_weight``, which Keras casts,
and a constant cast with ``tf.cast``), and keep the output layer float32.
"""
import tensorflow as tf


class ScaledShift(tf.keras.layers.Layer):
    """y = x * scale + 0.1, computed in the layer's compute dtype."""

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        shift = tf.cast(tf.constant(0.1), self.compute_dtype)
        return x * self.scale + shift


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = tf.keras.layers.Dense(64, activation="relu")(x)
    x = ScaledShift(name="scaled_shift")(x)
    x = tf.keras.layers.Dense(num_classes)(x)
    outputs = tf.keras.layers.Activation("softmax", dtype="float32", name="probabilities")(x)
    return tf.keras.Model(inputs, outputs, name="policy_aware")
