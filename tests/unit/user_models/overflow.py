"""A policy-aware layer whose values leave float16's range (above 65504): fine in float32,
infinite in float16."""
import tensorflow as tf


class Amplify(tf.keras.layers.Layer):
    def call(self, x):
        return x * tf.cast(1e5, self.compute_dtype) + tf.cast(1e5, self.compute_dtype)


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = Amplify(name="amplify")(x)
    x = tf.keras.layers.Dense(num_classes)(x)
    outputs = tf.keras.layers.Activation("softmax", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs)
