"""Models whose memory is almost all activations: one wide layer at full resolution (tens of
MB a sample) and little compute, so a tune under a small budget finds its boundary in a few
cheap trials (tests/unit/tuner/test_tune_real.py, tests/image/test_tune_image.py).

``build`` is a convolution; ``dense`` the same width as a Dense layer applied at every pixel,
which TF 2.9 runs in bfloat16 on any CPU (its bfloat16 convolutions need oneDNN, which it
turns on only on CPUs with AVX-512), so a tune of it measures both precisions everywhere."""
import tensorflow as tf

layers = tf.keras.layers


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = layers.Conv2D(1024, 3, padding="same", activation="relu")(inputs)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(num_classes)(x)
    return tf.keras.Model(inputs, layers.Activation("softmax", dtype="float32")(x))


def dense(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = layers.Dense(1024, activation="relu")(inputs)   # at every pixel: (h, w, 1024)
    x = layers.GlobalMaxPooling2D()(x)
    x = layers.Dense(num_classes)(x)
    return tf.keras.Model(inputs, layers.Activation("softmax", dtype="float32")(x))
