"""A model of two inputs, numbers and token ids, and its data in each form a user has it:
a dict of arrays, a tf.data dataset of dict (or tuple) features.

The classes are learnable from either input alone, weakly: the numbers are a class
prototype plus heavy noise, and one of the three ids is drawn from the class's own tenth of
the vocabulary, so a model that reads both inputs reaches high accuracy in a few epochs.
"""
import numpy as np
import tensorflow as tf

CLASSES = 4
VOCABULARY = 40
NUM, IDS = 8, 3


def _draw(n, seed, nan_rows=()):
    protos = np.random.default_rng(7).normal(0, 1, size=(CLASSES, NUM))
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, size=n)
    num = (protos[y] + rng.normal(0, 1.0, size=(n, NUM))).astype(np.float32)
    ids = rng.integers(0, VOCABULARY, size=(n, IDS)).astype(np.int64)
    ids[:, 0] = y * (VOCABULARY // CLASSES) + rng.integers(0, VOCABULARY // CLASSES, size=n)
    num[list(nan_rows)] = np.nan
    return {"num": num, "ids": ids}, y.astype(np.int64)


def arrays(seed=0):
    """((x_train, y_train), (x_val, y_val)), x a dict of arrays."""
    return _draw(512, seed), _draw(128, seed + 1)


def nan_arrays():
    """As ``arrays``, with NaN in the numbers of training rows 100 and 300."""
    return _draw(512, 0, nan_rows=(100, 300)), _draw(128, 1)


def datasets():
    """Unbatched tf.data datasets of ({"num", "ids"}, label)."""
    return tuple(tf.data.Dataset.from_tensor_slices(part) for part in arrays())


def tuple_datasets():
    """Unbatched tf.data datasets of ((num, ids), label): the inputs in the model's order."""
    return tuple(tf.data.Dataset.from_tensor_slices(((x["num"], x["ids"]), y))
                 for x, y in arrays())


def mismatched_keys():
    """A mistake: the validation inputs are named otherwise."""
    (xtr, ytr), (xva, yva) = arrays()
    return (xtr, ytr), ({"num": xva["num"], "tokens": xva["ids"]}, yva)


def build(input_shape, num_classes):
    num = tf.keras.Input(input_shape["num"], name="num")
    ids = tf.keras.Input(input_shape["ids"], name="ids", dtype="int64")
    embedded = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCABULARY, 8)(ids))
    h = tf.keras.layers.Concatenate()([num, embedded])
    h = tf.keras.layers.Dense(64, activation="relu")(h)
    out = tf.keras.layers.Dense(num_classes, dtype="float32", name="predictions")(h)
    return tf.keras.Model({"num": num, "ids": ids}, out)


def build_ordered(input_shape, num_classes):
    """The same model for tuple features: its inputs in a list, numbers first."""
    num_shape, ids_shape = input_shape
    num = tf.keras.Input(num_shape, name="num")
    ids = tf.keras.Input(ids_shape, name="ids", dtype="int64")
    embedded = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCABULARY, 8)(ids))
    h = tf.keras.layers.Dense(64, activation="relu")(
        tf.keras.layers.Concatenate()([num, embedded]))
    return tf.keras.Model([num, ids], tf.keras.layers.Dense(num_classes, dtype="float32")(h))


def fixed(num_classes):
    """The dict model with its shapes written in, whatever data it is given."""
    return build({"num": (NUM,), "ids": (IDS,)}, num_classes)


def heads(input_shape, num_classes):
    """Two heads in a dict: a model of several outputs, which tfmp does not train."""
    inputs = tf.keras.Input(input_shape)
    h = tf.keras.layers.Dense(16, activation="relu")(tf.keras.layers.Flatten()(inputs))
    return tf.keras.Model(inputs, {"classes": tf.keras.layers.Dense(num_classes)(h),
                                   "score": tf.keras.layers.Dense(1)(h)})
