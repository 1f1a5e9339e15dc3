"""Dataset functions as users write them: arrays like keras.datasets, or tf.data pipelines.

The data is learnable: class c is a fixed random prototype plus noise (as the built-in
synthetic set), so a small model reaches high accuracy in a few epochs.
"""
import numpy as np
import tensorflow as tf

SHAPE = (8, 8, 1)
CLASSES = 4


def _draw(n, seed):
    protos = np.random.default_rng(123).uniform(0, 255, size=(CLASSES,) + SHAPE)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, size=n)
    x = np.clip(protos[y] + rng.normal(0, 40, size=(n,) + SHAPE), 0, 255).astype(np.uint8)
    return x, y.astype(np.uint8)


def arrays(seed=0):
    """((x_train, y_train), (x_val, y_val)) uint8 arrays, what load_data() returns."""
    return _draw(512, seed), _draw(128, seed + 1)


def unknown_size():
    """Unbatched tf.data datasets whose size tf.data cannot know (a filter)."""
    (xtr, ytr), (xva, yva) = arrays()
    keep_all = lambda x, y: tf.reduce_all(tf.shape(x) > 0)  # noqa: E731
    train = tf.data.Dataset.from_tensor_slices((xtr, ytr)).filter(keep_all)
    val = tf.data.Dataset.from_tensor_slices((xva, yva)).filter(keep_all)
    return train, val


def batched():
    """Batched datasets, as Keras' own loaders give them (the app takes them apart)."""
    (xtr, ytr), (xva, yva) = arrays()
    return (tf.data.Dataset.from_tensor_slices((xtr, ytr)).batch(32),
            tf.data.Dataset.from_tensor_slices((xva, yva)).batch(32))


def not_data():
    return {"x": [1, 2, 3]}


def raises(data_dir=None):
    raise RuntimeError("the bucket is not mounted")


def flat():
    """As ``arrays``, 8 features a sample (the first row of each image)."""
    (xtr, ytr), (xva, yva) = arrays()
    return (xtr[:, 0, :, 0], ytr), (xva[:, 0, :, 0], yva)


def tiny_bits():
    """64 samples of 4 features, labelled by the first (two classes); validation: 16 of
    them.  For tests that stop before or at the first step."""
    x = np.random.default_rng(0).random((64, 4)).astype("float32")
    y = (x[:, 0] > 0.5).astype("int32")
    return (x, y), (x[:16], y[:16])
