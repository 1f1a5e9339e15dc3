"""What a user drops into /workspace: a model with a custom layer that respects the
layer's compute dtype, and a float32 output."""
import tensorflow as tf


class Gate(tf.keras.layers.Layer):
    def build(self, input_shape):
        self.w = self.add_weight(name="w", shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * tf.sigmoid(self.w) * tf.cast(2.0, self.compute_dtype)


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = tf.keras.layers.Dense(64, activation="relu")(x)
    x = Gate(name="gate")(x)
    x = tf.keras.layers.Dense(num_classes)(x)
    return tf.keras.Model(inputs, tf.keras.layers.Activation("softmax", dtype="float32")(x))
