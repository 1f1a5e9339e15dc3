"""A user's custom layer that breaks under mixed precision: it adds a float32 constant to
its (float16) input inside ``call``.  Keras 2 stops with a dtype clash; where the two are
promoted instead, the layer hands on float32.  ``check`` names the layer either way.

``nested`` hides the same fault in a layer of layers: one inner layer made in ``__init__``,
the others in ``build`` (``--float32-layers block`` must reach all three); ``twice`` in two
(``offset`` names both, ``shift_a/offset`` one); ``sub_models`` in one of two nested
functional models, made before they have a name to be part of their layers' paths."""
import tensorflow as tf


class AddOffset(tf.keras.layers.Layer):
    def call(self, x):
        return x + tf.constant(0.5)   # float32, whatever the policy: the bug


class Block(tf.keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.offset = AddOffset(name="inner_offset")

    def build(self, input_shape):
        self.dense = tf.keras.layers.Dense(int(input_shape[-1]), name="inner_dense")
        self.late_offset = AddOffset(name="late_offset")
        super().build(input_shape)

    def call(self, x):
        return self.late_offset(self.dense(self.offset(x)))


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = tf.keras.layers.Dense(16, activation="relu")(x)
    x = AddOffset(name="add_offset")(x)
    x = tf.keras.layers.Dense(num_classes)(x)
    outputs = tf.keras.layers.Activation("softmax", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs)


def nested(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = tf.keras.layers.Dense(16, activation="relu", name="hidden")(x)
    x = Block(name="block")(x)
    x = tf.keras.layers.Dense(num_classes)(x)
    outputs = tf.keras.layers.Activation("softmax", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs)


class Shift(tf.keras.layers.Layer):
    """A layer of layers whose one inner layer, 'offset', is the faulty AddOffset."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.offset = AddOffset(name="offset")

    def call(self, x):
        return self.offset(x)


def twice(input_shape, num_classes):
    """Two Shift layers: 'offset' names two layers, 'shift_a/offset' one."""
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = tf.keras.layers.Dense(16, activation="relu", name="hidden")(x)
    x = Shift(name="shift_b")(Shift(name="shift_a")(x))
    x = tf.keras.layers.Dense(num_classes)(x)
    outputs = tf.keras.layers.Activation("softmax", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs)


def _sub_model(name, offset, input_shape):
    """A functional model of one layer named 'offset', made apart and called as a layer."""
    inputs = tf.keras.Input(shape=input_shape)
    return tf.keras.Model(inputs, offset(inputs), name=name)


def sub_models(input_shape, num_classes):
    """Two nested functional models with a layer named 'offset' each: sub_a's is the faulty
    AddOffset, sub_b's a Dense that computes in 16 bits as well as any."""
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    x = _sub_model("sub_a", AddOffset(name="offset"), (16,))(x)
    x = _sub_model("sub_b", tf.keras.layers.Dense(16, name="offset"), (16,))(x)
    x = tf.keras.layers.Dense(num_classes)(x)
    outputs = tf.keras.layers.Activation("softmax", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs)
