"""A user's custom layer that breaks under mixed precision: it adds a float32 constant to
its (float16) input inside ``call``.  Keras 2 stops with a dtype clash; where the two are
promoted instead, the layer hands on float32.  ``check`` names the layer either way."""
import tensorflow as tf


class AddOffset(tf.keras.layers.Layer):
    def call(self, x):
        return x + tf.constant(0.5)   # float32, whatever the policy: the bug


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = tf.keras.layers.Dense(16, activation="relu")(x)
    x = AddOffset(name="add_offset")(x)
    x = tf.keras.layers.Dense(num_classes)(x)
    outputs = tf.keras.layers.Activation("softmax", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs)
