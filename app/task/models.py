"""The built-in models (``app.core.catalog`` names them).  Every one ends in a separate float32
softmax, so the probabilities and the loss computed from them are float32 whatever the
global policy (the guide: keep the output layer in float32)."""
from __future__ import annotations

import tensorflow as tf

from app.core import catalog as registry
from app.core.errors import UsageError

layers = tf.keras.layers


def _output(x, num_classes: int):
    # Dense in the compute dtype (float16/bfloat16 math), softmax in float32.
    logits = layers.Dense(num_classes, name="logits")(x)
    return layers.Activation("softmax", dtype="float32", name="probabilities")(logits)


def mlp(input_shape, num_classes: int) -> tf.keras.Model:
    """The guide's 784-512-256-10 multilayer perceptron."""
    inputs = tf.keras.Input(shape=input_shape, dtype="float32", name="inputs")
    x = layers.Flatten()(inputs) if len(input_shape) > 1 else inputs
    x = layers.Dense(512, activation="relu")(x)
    x = layers.Dense(256, activation="relu")(x)
    return tf.keras.Model(inputs, _output(x, num_classes), name="mlp")


def cnn(input_shape, num_classes: int) -> tf.keras.Model:
    """The guide's Conv2D(32, 3) + Flatten + Dense."""
    inputs = tf.keras.Input(shape=input_shape, dtype="float32", name="inputs")
    x = layers.Conv2D(32, 3, activation="relu")(inputs)
    x = layers.Flatten()(x)
    return tf.keras.Model(inputs, _output(x, num_classes), name="cnn")


def _residual_block(x, channels: int, stride: int):
    shortcut = x
    y = layers.Conv2D(channels, 3, strides=stride, padding="same", use_bias=False)(x)
    y = layers.BatchNormalization()(y)
    y = layers.ReLU()(y)
    y = layers.Conv2D(channels, 3, padding="same", use_bias=False)(y)
    y = layers.BatchNormalization()(y)
    if stride != 1 or shortcut.shape[-1] != channels:
        shortcut = layers.Conv2D(channels, 1, strides=stride, use_bias=False)(shortcut)
        shortcut = layers.BatchNormalization()(shortcut)
    return layers.ReLU()(layers.Add()([y, shortcut]))


def resnet(input_shape, num_classes: int) -> tf.keras.Model:
    """A small residual CNN for 32x32x3 images.  Channel counts are multiples of 8 so
    cuDNN can map the convolutions onto Tensor Cores under float16."""
    inputs = tf.keras.Input(shape=input_shape, dtype="float32", name="inputs")
    x = layers.Conv2D(32, 3, padding="same", use_bias=False)(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    for channels, stride in ((32, 1), (64, 2), (128, 2)):
        x = _residual_block(x, channels, stride)
    x = layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, _output(x, num_classes), name="resnet")


# The built-in entries of the task registry (app/task/task.py), called like a user's model
# function: FUNCTION(input_shape, num_classes).
BUILDERS = {fn.__name__: fn for fn in (mlp, cnn, resnet)}
assert set(BUILDERS) == set(registry.MODEL_NAMES), "app.core.catalog and app.task.models disagree"


def input_shape_for(name: str, image_size: int = 32) -> tuple:
    return registry.builtin_input_shape(name, image_size)


def build_model(name: str, input_shape, num_classes: int) -> tf.keras.Model:
    """Build ``name`` under the current global dtype policy."""
    if name not in BUILDERS:
        names = ", ".join(registry.MODEL_NAMES)
        raise UsageError(f"model must be one of {names}. Received: model={name!r}", names)
    return BUILDERS[name](tuple(input_shape), int(num_classes))
