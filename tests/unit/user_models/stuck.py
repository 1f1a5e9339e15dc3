"""A model whose training step never ends: a stand-in for a kernel deadlocked at a barrier
(TF 2.9's bfloat16 convolutions on AMX, docs/image.md) or a collective whose peer is gone.

Its layer calls Python from inside the step (``tf.py_function``). On the ``STUCK_AT``-th
batch of ``STUCK_ROWS`` rows (the run's batches; the job's own checks run the model on two
rows) it creates the file named in ``STUCK_MARK`` and sleeps: the main thread waits inside
TensorFlow's executor the whole time and never runs a Python signal handler.  Without
``STUCK_MARK`` it trains like any model."""
import itertools
import os
import time

import tensorflow as tf

_batches = itertools.count(1)


def _hang(x):
    mark = os.environ.get("STUCK_MARK")
    if (mark and x.shape[0] == int(os.environ["STUCK_ROWS"])
            and next(_batches) == int(os.environ.get("STUCK_AT", "1"))):
        open(mark, "w").close()
        time.sleep(600)
    return x


class Stuck(tf.keras.layers.Layer):
    def call(self, x):
        y = tf.py_function(_hang, [x], x.dtype)
        y.set_shape(x.shape)
        return y


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = Stuck(name="stuck")(x)
    outputs = tf.keras.layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs, name="stuck")
