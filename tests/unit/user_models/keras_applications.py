"""Keras' own applications, built as a user would (no weights download): models the user
cannot edit without rebuilding them, for ``--float32-layers``."""
import tensorflow as tf


def mobilenet_v2(input_shape, num_classes):
    """Its classifier 'predictions' is a Dense softmax: float16 under mixed_float16."""
    return tf.keras.applications.MobileNetV2(weights=None, input_shape=tuple(input_shape),
                                             classes=num_classes)
