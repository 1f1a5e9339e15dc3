"""Model functions the app must refuse with one line (exit 2)."""
import tensorflow as tf


def needs_depth(input_shape, num_classes, depth):
    """``depth`` has no default and the app cannot give it."""
    raise AssertionError("never called")


def not_a_model(input_shape, num_classes):
    return {"layers": [tf.keras.layers.Dense(num_classes)]}


def seven_features(num_classes):
    """Its Input takes 7 features, whatever the data holds (8 in datasets.py:flat)."""
    return tf.keras.Sequential([tf.keras.Input((7,)), tf.keras.layers.Dense(num_classes)])
