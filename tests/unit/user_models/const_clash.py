"""The classic mixed-precision bug: a custom layer adds a float32 tensor it made itself
inside call() to its 16-bit input ("expected half but got float")."""
import tensorflow as tf


class AddBias(tf.keras.layers.Layer):
    def call(self, x):
        return x + tf.constant(0.5, dtype=tf.float32)   # float32 whatever the policy


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = tf.keras.layers.Dense(32, activation="relu")(x)
    x = AddBias(name="add_bias")(x)
    x = tf.keras.layers.Dense(num_classes)(x)
    outputs = tf.keras.layers.Activation("softmax", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs)
