"""Text classification as users write it: raw strings in, a TextVectorization layer inside
the model (Keras 2 lists its vocabulary among the model's weights as a handler that is no
variable), the data as string arrays (an object array, as pandas gives) or tf.data."""
import numpy as np
import tensorflow as tf

POSITIVE, NEGATIVE = ["good", "great", "fine"], ["bad", "awful", "poor"]
FILLER = ["the", "a", "movie", "plot", "was", "is", "and", "it"]
VOCABULARY = 20   # not a multiple of 8: check's Embedding finding


def _texts(n, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    texts = []
    for label in y:
        words = list(rng.choice(FILLER, size=5)) + [rng.choice(POSITIVE if label else NEGATIVE)]
        rng.shuffle(words)
        texts.append(" ".join(words))
    return np.array(texts, dtype=object), y


def arrays():
    """((texts, labels), (texts, labels)), the texts an object array of Python strings."""
    return _texts(1024, 0), _texts(256, 1)


def datasets():
    return tuple(tf.data.Dataset.from_tensor_slices((x.astype(str), y)) for x, y in arrays())


def build(num_classes):
    vectorize = tf.keras.layers.TextVectorization(max_tokens=VOCABULARY,
                                                  output_sequence_length=6)
    vectorize.adapt(_texts(1024, 0)[0].astype(str))
    text = tf.keras.Input((), dtype=tf.string, name="text")
    h = tf.keras.layers.Embedding(VOCABULARY, 8)(vectorize(text))
    h = tf.keras.layers.GlobalAveragePooling1D()(h)
    return tf.keras.Model(text, tf.keras.layers.Dense(num_classes, dtype="float32")(h))
