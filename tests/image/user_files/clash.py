"""The bug check is for: a float32 constant added to a 16-bit tensor inside call()."""
import tensorflow as tf


class AddBias(tf.keras.layers.Layer):
    def call(self, x):
        return x + tf.constant(0.5, dtype=tf.float32)


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = AddBias(name="add_bias")(tf.keras.layers.Dense(32)(x))
    x = tf.keras.layers.Dense(num_classes)(x)
    return tf.keras.Model(inputs, tf.keras.layers.Activation("softmax", dtype="float32")(x))
