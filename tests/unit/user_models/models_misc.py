"""Model functions for the spec and error tests."""
import tensorflow as tf


def logits_16bit(input_shape, num_classes):
    """Output layer left in the policy's dtype: float16/bfloat16 logits."""
    return tf.keras.Sequential([tf.keras.Input(shape=input_shape), tf.keras.layers.Flatten(),
                                tf.keras.layers.Dense(32, activation="relu"),
                                tf.keras.layers.Dense(num_classes, name="logits")])


def compiled(input_shape, num_classes):
    """Comes compiled: its optimizer (SGD), loss and metrics are used."""
    model = logits_16bit(input_shape, num_classes)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def needs_more(input_shape, num_classes, depth):
    raise AssertionError("never called: 'depth' cannot be given")


def not_a_model(input_shape):
    return "a string"


def three_outputs(input_shape):
    return tf.keras.Sequential([tf.keras.Input(shape=input_shape), tf.keras.layers.Flatten(),
                                tf.keras.layers.Dense(3)])


def no_flatten(input_shape, num_classes):
    """The classifier head on an image's grid: a row of scores per pixel, not per sample."""
    return tf.keras.Sequential([tf.keras.Input(shape=input_shape),
                                tf.keras.layers.Dense(num_classes)])


def broken(input_shape, num_classes):
    return undefined_helper(input_shape)  # noqa: F821 - the user's bug, on purpose


NOT_CALLABLE = 42


def top2(y_true, y_pred):
    """A metric function of the user's, named with --metrics MODULE:OBJECT."""
    return tf.keras.metrics.sparse_top_k_categorical_accuracy(y_true, y_pred, k=2)


# Made when the module is imported, before any run sets its policy: every layer float32
# (under float32 whatever policy the importing process holds then, so no test order
# changes what it stands for).
_POLICY_THEN = tf.keras.mixed_precision.global_policy()
tf.keras.mixed_precision.set_global_policy("float32")
MADE_AT_IMPORT = tf.keras.Sequential([tf.keras.Input(shape=(28, 28, 1)),
                                      tf.keras.layers.Flatten(),
                                      tf.keras.layers.Dense(10, name="made_early")])
tf.keras.mixed_precision.set_global_policy(_POLICY_THEN)


def made_at_import(input_shape, num_classes):
    """Returns the model made at import: under a mixed policy it computes in float32."""
    return MADE_AT_IMPORT


def float32_on_purpose(input_shape, num_classes):
    """Its one matrix layer made float32 (``dtype="float32"``); with ``--float32-layers d1``
    the other one too: every layer float32, as the user asked."""
    return tf.keras.Sequential([tf.keras.Input(shape=input_shape),
                                tf.keras.layers.Dense(16, activation="relu", name="d1"),
                                tf.keras.layers.Dense(num_classes, name="out",
                                                      dtype="float32")])


def hidden_logits(input_shape, num_classes):
    """Two named Dense layers, 'hidden' and 'logits': the smallest model whose layer names
    a test can get right or wrong."""
    inp = tf.keras.Input(input_shape)
    hidden = tf.keras.layers.Dense(8, activation="relu", name="hidden")(inp)
    return tf.keras.Model(inp, tf.keras.layers.Dense(num_classes, name="logits")(hidden))
