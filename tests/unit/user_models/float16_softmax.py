"""A model whose softmax runs in the policy's 16-bit dtype: its output is float16."""
import tensorflow as tf


def build(input_shape, num_classes):
    return tf.keras.Sequential([
        tf.keras.Input(shape=input_shape),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(num_classes, activation="softmax", name="class_probs"),
    ])


def unnamed(input_shape, num_classes):
    """The same with Keras' automatic layer names: the softmax is the second 'dense'."""
    return tf.keras.Sequential([
        tf.keras.Input(shape=input_shape),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(num_classes, activation="softmax"),
    ])
