"""A model whose training step never ends: a stand-in for a kernel deadlocked at a barrier
(TF 2.9's bfloat16 convolutions on AMX, docs/image.md) or a collective whose peer is gone.

Its layer asks Python from inside the step (``tf.py_function``) whether to hang: on the
``STUCK_AT``-th batch of ``STUCK_ROWS`` rows (the run's batches; the job's own checks run
the model on two rows) it creates the file named in ``STUCK_MARK`` and the step then waits
to take an element from a queue nothing is ever put into: a wait in TensorFlow's C++, where
the thread that started the step (eager or not) never runs a Python signal handler.  Without
``STUCK_MARK`` it trains like any model; with ``STUCK_HANG=0`` it marks that batch and
goes on, each later step spending ``STUCK_SLOW`` seconds (default 0.3) in that Python
function: a signal then lands, almost always, while TensorFlow's C++ is running Python code
of the model's (a test's sign that the steps have begun, and the moment to Ctrl-C)."""
import itertools
import os
import time

import tensorflow as tf

_batches = itertools.count(1)


def _hangs_now(x):
    mark = os.environ.get("STUCK_MARK")
    if not mark or x.shape[0] != int(os.environ["STUCK_ROWS"]):
        return False
    batch = next(_batches)
    at = int(os.environ.get("STUCK_AT", "1"))
    if batch == at:
        open(mark, "w").close()
        return os.environ.get("STUCK_HANG", "1") != "0"
    if batch > at:   # only with STUCK_HANG=0: the hanging step never returns
        time.sleep(float(os.environ.get("STUCK_SLOW", "0.3")))
    return False


class Stuck(tf.keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.never = tf.queue.FIFOQueue(1, tf.float32, shapes=[])   # nothing is put into it

    def call(self, x):
        hang = tf.py_function(_hangs_now, [x], tf.bool)
        hang.set_shape([])
        waited = tf.cond(hang, self.never.dequeue, lambda: tf.constant(0.0))
        return x + tf.cast(waited, x.dtype)


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = Stuck(name="stuck")(x)
    outputs = tf.keras.layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs, name="stuck")
