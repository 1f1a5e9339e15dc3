"""A model whose memory is almost all activations: one wide convolution at full resolution
(tens of MB a sample) and little compute, so a tune under
a small budget finds its boundary in a few cheap trials (tests/unit/tuner/test_tune_real.py)."""
import tensorflow as tf

layers = tf.keras.layers


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = layers.Conv2D(1024, 3, padding="same", activation="relu")(inputs)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(num_classes)(x)
    return tf.keras.Model(inputs, layers.Activation("softmax", dtype="float32")(x))
