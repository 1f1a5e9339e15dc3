"""A subclassed model with a nested block; one layer casts its result to float32 (not
policy-aware), and the output is a float32 softmax."""
import tensorflow as tf


class UpcastScale(tf.keras.layers.Layer):
    """Computes in the policy's dtype but returns float32: the next layer casts it back."""

    def call(self, x):
        return tf.cast(x * 2.0, tf.float32)


class Block(tf.keras.layers.Layer):
    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.dense = tf.keras.layers.Dense(units, activation="relu", name="inner_dense")
        self.upcast = UpcastScale(name="upcast")

    def call(self, x):
        return self.upcast(self.dense(x))


class Net(tf.keras.Model):
    def __init__(self, num_classes):
        super().__init__(name="net")
        self.flatten = tf.keras.layers.Flatten()
        self.block = Block(16, name="block")
        self.head = tf.keras.layers.Dense(num_classes, name="head")
        self.probs = tf.keras.layers.Activation("softmax", dtype="float32", name="probs")

    def call(self, x):
        return self.probs(self.head(self.block(self.flatten(x))))


def build(num_classes):
    return Net(num_classes)
