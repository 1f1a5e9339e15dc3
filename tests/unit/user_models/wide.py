"""Dense widths and Tensor Cores: 1000 units is a multiple of 8 (8 x 125), 500 is not."""
import tensorflow as tf


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = tf.keras.layers.Dense(1000, activation="relu", name="dense_1000")(x)
    x = tf.keras.layers.Dense(500, activation="relu", name="dense_500")(x)
    x = tf.keras.layers.Dense(num_classes)(x)
    outputs = tf.keras.layers.Activation("softmax", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs)
