"""Data with a weight a sample, in each form a user has it: (x, y, sample_weight) arrays and
tf.data of (features, label, sample_weight).

Built so that only the weights decide what is right: samples near one prototype are
labelled 1 seven times in ten and 0 three times in ten, and each label-0 sample weighs 8
(2.4 against 0.7).  Trained on the weights, a model calls that region 0; without them, 1.
The validation set labels the region 0, beside two clean classes, so its accuracy is near
1.0 with the weights and near 0.5 without them.
"""
import numpy as np
import tensorflow as tf

CLASSES = 4
FEATURES = 8
HEAVY = 8.0


def _draw(n, seed, training=True, nan_rows=()):
    protos = np.random.default_rng(11).normal(0, 2.0, size=(3, FEATURES))
    rng = np.random.default_rng(seed)
    region = rng.integers(0, 3, size=n)            # 0: the contested one; 1, 2: clean
    x = (protos[region] + rng.normal(0, 0.5, size=(n, FEATURES))).astype(np.float32)
    y = region + 1                                  # clean classes 2 and 3
    contested = region == 0
    if training:
        y[contested] = np.where(rng.random(contested.sum()) < 0.3, 0, 1)
    else:
        y[contested] = 0
    x[list(nan_rows)] = np.nan
    w = np.where(y == 0, HEAVY, 1.0).astype(np.float32)
    return x, y.astype(np.int64), w


def arrays(seed=0):
    """((x, y, w), (x_val, y_val)): the training samples weighted, the validation not."""
    x, y, w = _draw(512, seed)
    xv, yv, _ = _draw(192, seed + 1, training=False)
    return (x, y, w), (xv, yv)


def unweighted(seed=0):
    """The same samples without their weights: the control."""
    (x, y, _), val = arrays(seed)
    return (x, y), val


def weighted_validation(seed=0):
    """Both parts weighted, the weights as a column (n, 1), as some pipelines give them."""
    (x, y, w), (xv, yv) = arrays(seed)
    return (x, y, w[:, None]), (xv, yv, np.ones((len(yv), 1), np.float32))


def datasets(seed=0):
    """tf.data of (features, label, sample_weight) and of (features, label)."""
    train, val = arrays(seed)
    return tuple(tf.data.Dataset.from_tensor_slices(part) for part in (train, val))


def nan_arrays():
    """As ``arrays``, with NaN in training rows 40 and 200."""
    x, y, w = _draw(512, 0, nan_rows=(40, 200))
    xv, yv, _ = _draw(192, 1, training=False)
    return (x, y, w), (xv, yv)


class Batches(tf.keras.utils.Sequence):
    """The samples as a Keras Sequence of batches, the way Keras code often loads data: a
    new order each epoch (``on_epoch_end``), and the weights as a third part if given."""

    def __init__(self, x, y, w=None, batch_size=50, seed=0):
        super().__init__()
        self.x, self.y, self.w, self.batch_size = x, y, w, batch_size
        self.order = np.arange(len(y))
        self.rng = np.random.default_rng(seed)
        self.epochs_ended = 0

    def __len__(self):
        return -(-len(self.y) // self.batch_size)

    def __getitem__(self, i):
        rows = self.order[i * self.batch_size:(i + 1) * self.batch_size]
        batch = (self.x[rows], self.y[rows])
        return batch if self.w is None else batch + (self.w[rows],)

    def on_epoch_end(self):
        self.epochs_ended += 1
        self.rng.shuffle(self.order)


def sequences(seed=0):
    """(train, val) Keras Sequences: the training batches weighted, as ``arrays``."""
    (x, y, w), (xv, yv) = arrays(seed)
    return Batches(x, y, w), Batches(xv, yv)
