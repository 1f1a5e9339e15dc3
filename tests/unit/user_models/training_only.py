"""Layers whose ops run in training alone, which an inference call never reaches.

``build``: a custom layer that takes lgamma of its input in training only (TensorFlow has
no bfloat16 CPU kernel for Lgamma, in 2.9 or later).  ``augmented``: Keras' augmentation
layers, as image models start (RandomContrast runs AdjustContrastv2 in Keras 2, float32
only on a CPU; RandomRotation's transform takes no bfloat16).
"""
import tensorflow as tf


class LgammaWhenTraining(tf.keras.layers.Layer):
    """Noise that depends on the input, in training only (inference passes it through)."""

    def call(self, x, training=None):
        if training:
            return x + 1e-3 * tf.math.lgamma(tf.abs(x) + 1.0)
        return x


def build(input_shape, num_classes):
    inp = tf.keras.Input(input_shape)
    h = LgammaWhenTraining(name="lgamma_when_training")(inp)
    h = tf.keras.layers.Dense(32, activation="relu")(h)
    return tf.keras.Model(inp, tf.keras.layers.Dense(num_classes)(h))


def augmented(input_shape, num_classes):
    augment = tf.keras.Sequential([tf.keras.layers.RandomFlip("horizontal"),
                                   tf.keras.layers.RandomContrast(0.2)], name="augment")
    inp = tf.keras.Input(input_shape)
    h = tf.keras.layers.Flatten()(augment(inp))
    h = tf.keras.layers.Dense(32, activation="relu")(h)
    return tf.keras.Model(inp, tf.keras.layers.Dense(num_classes)(h))
