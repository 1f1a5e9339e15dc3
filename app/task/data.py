"""Datasets, offline first.

Standard files are read from the data directory (``mnist.npz``; ``fashion-mnist/*.gz`` or
``fashion_mnist.npz``; ``cifar-10-batches-py/`` or ``cifar10.npz``).  When a file is missing
and downloads are allowed, Keras' own loader fetches it and the arrays are stored in the data
directory as ``<name>.npz`` (written to a temporary name, then renamed).  ``synthetic`` needs no files; ``images`` reads a folder with
one subfolder of images per class.  Inputs are float32 in [0, 1].
"""
from __future__ import annotations

import gzip
import os
import pickle
import zipfile
from dataclasses import dataclass, field

import numpy as np

from app.core import catalog as registry
from app.core.errors import UsageError
from app.machine import memory
from app.task.data_rows import DataRows, listed, unread_rows

SYNTHETIC_TRAIN, SYNTHETIC_VAL = 2048, 512
# An image folder keeps this share of its images for validation (Keras' validation_split).
VALIDATION_SPLIT = 0.2
# An image folder's decoded images are kept in memory (one byte a pixel and channel) when
# they take at most this share of the memory free at load; else they are decoded each epoch.
IMAGE_CACHE_SHARE = 0.5
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")   # the ones Keras reads
_ALLOWED_FIX = ("delete the file to download it again, or replace it with the standard "
                "Keras dataset file")


@dataclass
class DataBundle:
    train: object          # tf.data.Dataset of (x float32, y int32) batches
    val: object
    input_shape: tuple
    num_classes: int
    train_samples: int
    val_samples: int
    class_names: list | None = None
    # "sparse" integer class ids, "onehot" rows, "multilabel" multi-hot rows (0/1, any number
    # of 1s), "binary" 0/1 with two classes, "other" (regression targets and the like: no
    # class count to check against the model)
    label_kind: str = "sparse"
    # tf.data pipelines of unknown size are counted once when loaded; None = not counted
    sample_batch: tuple | None = None   # (x, y[, w]) of a few training samples, for build/check
    # The training arrays the pipeline gathers from (app.task.data_rows.DataRows), so the
    # sentinel can name a faulty sample's row; None for a pipeline that shuffles in a buffer
    train_rows: object | None = None
    # What the run should say of the data (a user's dataset that came batched)
    notes: list = field(default_factory=list)
    # The training batches are (x, y, sample_weight): a weight a sample, as Keras' fit takes
    weighted: bool = False
    # --class-weight: each class's weight (app.task.class_weights), by class id
    class_weight: list | None = None


def shape_json(shape):
    """A bundle's ``input_shape`` for JSON: ``[28, 28, 1]``, or for a model of several inputs
    ``{"a": [8], "b": [4]}`` (a dict of features) or ``[[8], [4]]`` (a tuple)."""
    if isinstance(shape, dict):
        return {k: list(v) for k, v in shape.items()}
    if several_inputs(shape):
        return [list(v) for v in shape]
    return list(shape)


def shape_text(shape) -> str:
    """``28x28x1``, or ``a 8, b 4`` for several inputs."""
    if isinstance(shape, dict):
        return ", ".join(f"{k} {'x'.join(map(str, v)) or 'scalar'}" for k, v in shape.items())
    if several_inputs(shape):
        return ", ".join("x".join(map(str, v)) or "scalar" for v in shape)
    return "x".join(map(str, shape))


def several_inputs(shape) -> bool:
    """Is ``input_shape`` a structure of shapes (a model of several inputs)?"""
    return isinstance(shape, dict) or (isinstance(shape, (tuple, list)) and bool(shape)
                                       and all(isinstance(v, (tuple, list)) for v in shape))


# ---- reading standard files --------------------------------------------------------------

def _corrupt(path: str, why: str) -> UsageError:
    return UsageError(f"data file {path!r} is corrupt or not a dataset file ({why})", _ALLOWED_FIX)


def _load_npz(path: str):
    try:
        with np.load(path, allow_pickle=False) as f:
            return (f["x_train"], f["y_train"]), (f["x_test"], f["y_test"])
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise _corrupt(path, type(exc).__name__ + ": " + str(exc).splitlines()[0][:120]) from None
    except KeyError as exc:
        raise _corrupt(path, f"missing array {exc}") from None


def _consistent(path: str, arrays):
    """``arrays`` as read from ``path``, when each part holds one label a sample; a file of
    the right layout whose parts disagree is as corrupt as a truncated one (it would train
    on the labels there are, or on none)."""
    for part, (x, y) in zip(("train", "test"), arrays):
        if x.ndim < 2 or len(x) != len(y) or not len(x):
            raise _corrupt(path, f"x_{part} holds {len(x)} sample(s) of shape "
                                 f"{tuple(x.shape[1:])}, y_{part} {len(y)} label(s)")
    return arrays


def _read_idx_gz(path: str, offset: int, shape=None):
    try:
        with gzip.open(path, "rb") as fh:
            arr = np.frombuffer(fh.read(), np.uint8, offset=offset)
        return arr.reshape(shape) if shape else arr
    except (OSError, EOFError, ValueError) as exc:
        raise _corrupt(path, type(exc).__name__) from None


def _load_fashion_dir(folder: str):
    f = lambda n: os.path.join(folder, n)  # noqa: E731
    ytr = _read_idx_gz(f("train-labels-idx1-ubyte.gz"), 8)
    xtr = _read_idx_gz(f("train-images-idx3-ubyte.gz"), 16, (len(ytr), 28, 28))
    yte = _read_idx_gz(f("t10k-labels-idx1-ubyte.gz"), 8)
    xte = _read_idx_gz(f("t10k-images-idx3-ubyte.gz"), 16, (len(yte), 28, 28))
    return (xtr, ytr), (xte, yte)


def _load_cifar_dir(folder: str):
    def batch(name):
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as fh:
                d = pickle.load(fh, encoding="bytes")
            return d[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), np.asarray(d[b"labels"])
        except Exception as exc:  # pickle raises many kinds
            raise _corrupt(path, type(exc).__name__) from None
    parts = [batch(f"data_batch_{i}") for i in range(1, 6)]
    xtr = np.concatenate([p[0] for p in parts])
    ytr = np.concatenate([p[1] for p in parts])
    return (xtr, ytr), batch("test_batch")


_STANDARD = {
    # name: [(relative path, reader)], first existing wins; the npz is also what we store
    "mnist": [("mnist.npz", _load_npz)],
    "fashion_mnist": [("fashion_mnist.npz", _load_npz), ("fashion-mnist", _load_fashion_dir)],
    "cifar10": [("cifar10.npz", _load_npz), ("cifar-10-batches-py", _load_cifar_dir)],
}


def _download(name: str, data_dir: str):
    """Fetch through Keras' loader and store as <data_dir>/<name>.npz (temp name + rename)."""
    import tensorflow as tf

    target = os.path.join(data_dir, f"{name}.npz")
    # Keras' loaders download into Keras' own cache (recent Keras refuses a path as the
    # file name), so the arrays are stored again here, in the standard npz layout.
    loader = {"mnist": tf.keras.datasets.mnist, "fashion_mnist": tf.keras.datasets.fashion_mnist,
              "cifar10": tf.keras.datasets.cifar10}[name]
    (xtr, ytr), (xte, yte) = loader.load_data()
    tmp = target + ".tmp.npz"
    np.savez(tmp, x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    os.replace(tmp, target)
    return (xtr, ytr), (xte, yte)


def load_arrays(name: str, data_dir: str, offline: bool = False, data_dir_explicit: bool = True):
    """((x_train, y_train), (x_test, y_test)) as stored, or a UsageError."""
    if not os.path.isdir(data_dir):
        if data_dir_explicit:
            what = "is a file, not a folder" if os.path.exists(data_dir) else "does not exist"
            raise UsageError(f"data directory {data_dir!r} {what}",
                             "an existing folder holding the dataset files (or omit --data-dir)")
        # The workspace's default folder, not there yet: offline, the line below names the
        # file and the folder; online, the download creates it.
    else:
        for rel, reader in _STANDARD[name]:
            path = os.path.join(data_dir, rel)
            if os.path.exists(path):
                return _consistent(path, reader(path))
    wanted = " or ".join(rel for rel, _ in _STANDARD[name])
    if offline:
        raise UsageError(f"dataset {name!r} not found: no {wanted} in {data_dir!r} and downloads "
                         "are off", f"put {wanted} into {data_dir!r}, or allow downloads")
    created = not os.path.isdir(data_dir)
    os.makedirs(data_dir, exist_ok=True)
    try:
        return _download(name, data_dir)
    except Exception as exc:
        if created and not os.listdir(data_dir):
            os.rmdir(data_dir)  # leave nothing behind for a download that never happened
        why = (str(exc).strip().splitlines() or [""])[0][:160]
        raise UsageError(f"dataset {name!r} not found: no {wanted} in {data_dir!r} and the download "
                         f"failed ({type(exc).__name__}: {why})",
                         f"put {wanted} into {data_dir!r} (copy it from a machine that is online)") \
            from None


# ---- synthetic --------------------------------------------------------------------------

def synthetic_arrays(input_shape, num_classes: int = 10, n_train: int = SYNTHETIC_TRAIN,
                     n_val: int = SYNTHETIC_VAL, seed: int = 0):
    """Learnable random data: one random prototype per class plus noise, from a fixed seed."""
    rng = np.random.default_rng(seed)
    protos = rng.uniform(0.0, 1.0, size=(num_classes,) + tuple(input_shape)).astype(np.float32)

    def draw(n):
        y = rng.integers(0, num_classes, size=n).astype(np.int32)
        noise = rng.normal(0.0, 0.35, size=(n,) + tuple(input_shape)).astype(np.float32)
        return np.clip(protos[y] + noise, 0.0, 1.0).astype(np.float32), y
    return draw(n_train), draw(n_val)


# ---- tf.data ----------------------------------------------------------------------------

def _prepare(x: np.ndarray, input_shape) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    x = x.astype(np.float32, copy=False)
    return x.reshape((len(x),) + tuple(input_shape))


def make_dataset(x, y, batch_size: int, shuffle: bool, seed: int = 0, flat_labels: bool = True,
                 weights=None):
    """Batches of in-memory arrays: one permutation of the row indices per epoch, cut into
    batches, rows gathered a whole batch at a time, prefetched.

    Every per-element tf.data step costs CPU that a 2-core machine otherwise gives to the
    training step: ``from_tensor_slices().shuffle().batch()`` runs each sample through the
    pipeline (measured here: half the samples/s of gathering whole batches), and even
    ``range(n).shuffle(n)`` of the indices alone costs ~2% of an MLP epoch.  So the
    permutation is drawn in one op (``argsort`` of stateless uniform keys), seeded by
    ``seed`` and an epoch counter: a new order every epoch (a random op with a fixed seed
    inside a dataset function would repeat the same order each epoch), the same orders on
    every run and on every worker of a multi-worker job (sharding by batch needs that).
    With ``weights`` (one a sample) the batches are ``(x, y, sample_weight)``."""
    import tensorflow as tf

    n = len(y)
    xt = tf.nest.map_structure(tf.constant, x)   # one array, or a dict of them (several inputs)
    # Built-ins: integer class ids.  User data arrives prepared (one-hot rows, float targets).
    yt = tf.constant(np.asarray(y).astype(np.int32).reshape(-1) if flat_labels else y)
    with tf.device("/cpu:0"):   # read by the input pipeline, which runs on the CPU
        epochs = tf.Variable(0, dtype=tf.int64, trainable=False, name="data_epoch")

    def order(_):
        if not shuffle:
            return tf.range(n, dtype=tf.int64)
        epoch = epochs.assign_add(1)
        keys = tf.random.stateless_uniform([n], seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
        return tf.argsort(keys, stable=True)

    def batches(indices):
        full = n // batch_size * batch_size
        out = tf.data.Dataset.from_tensor_slices(tf.reshape(indices[:full], (-1, batch_size)))
        if n > full:   # the smaller last batch
            out = out.concatenate(tf.data.Dataset.from_tensors(indices[full:]))
        return out

    # flat_map hides the number of batches; Keras' fit needs it (with an unknown count it
    # takes the first epoch's, then stops the next epochs' metrics early with a warning).
    indices = (tf.data.Dataset.range(1).map(order).prefetch(1).flat_map(batches)
               .apply(tf.data.experimental.assert_cardinality(-(-n // batch_size))))
    # The arrays enter as a dataset element, not as constants captured by the map function:
    # tf.data's default graph rewrites serialize the pipeline's graph on every new iterator
    # (every epoch), and a captured constant is the whole array, copied each time.  With
    # the rewrites off that copy is gone too (they have nothing to gain on this pipeline).
    parts = (xt, yt) if weights is None else (xt, yt, tf.constant(weights, tf.float32))
    ds = tf.data.Dataset.zip((indices, tf.data.Dataset.from_tensors(parts).repeat()))
    ds = ds.map(lambda i, rows: tf.nest.map_structure(lambda a: tf.gather(a, i), rows),
                num_parallel_calls=tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    # The epoch counter is state outside the pipeline: a copy of the pipeline (a
    # strategy distributing it) starts its own count, which is what it should do.
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def _image_folder(image_dir: str, image_size: int, batch_size: int, seed: int, max_train, max_val):
    import tensorflow as tf

    allowed = "a folder with one subfolder of images per class"
    if not os.path.exists(image_dir):
        raise UsageError(f"image directory {image_dir!r} does not exist", allowed)
    if not os.path.isdir(image_dir):
        raise UsageError(f"image directory {image_dir!r} is a file, not a folder", allowed)
    try:
        entries = os.listdir(image_dir)
    except OSError as exc:   # no read permission for this user (a mount owned by another UID)
        raise UsageError(f"image directory {image_dir!r} cannot be read: {exc.strerror}",
                         allowed + ", readable by this user") from None
    classes = sorted(d for d in entries if os.path.isdir(os.path.join(image_dir, d)))
    if len(classes) < 2:
        raise UsageError(f"image directory {image_dir!r} has {len(classes)} class subfolders",
                         "a folder with at least two subfolders of images, one per class")
    kw = dict(labels="inferred", label_mode="int", image_size=(image_size, image_size),
              batch_size=None, seed=seed, validation_split=VALIDATION_SPLIT, color_mode="rgb")
    found = _count_images(image_dir, classes)
    if 0 < found < 1 / VALIDATION_SPLIT:
        # Keras keeps int(20% of the images) for validation, none of fewer than five, and
        # then says "No images found" of a folder whose images it has listed.
        raise UsageError(f"image directory {image_dir!r} has {found} image(s): too few to "
                         f"keep {VALIDATION_SPLIT:.0%} of them for validation (that is none)",
                         f"{round(1 / VALIDATION_SPLIT)} images or more in its class "
                         "subfolders, better dozens a class")
    try:
        train = tf.keras.utils.image_dataset_from_directory(image_dir, subset="training", **kw)
        val = tf.keras.utils.image_dataset_from_directory(image_dir, subset="validation", **kw)
    except ValueError as exc:
        raise UsageError(f"image directory {image_dir!r} is not usable ({exc})",
                         "jpeg/png/bmp/gif images in class subfolders") from None
    n_train = int(train.cardinality().numpy())
    n_val = int(val.cardinality().numpy())
    if max_train:
        train, n_train = train.take(max_train), min(n_train, max_train)
    if max_val:
        val, n_val = val.take(max_val), min(n_val, max_val)
    files = list(getattr(train, "file_paths", [])) + list(getattr(val, "file_paths", []))
    cached, buffer, note = _image_memory(n_train + n_val, n_train, image_size)
    # Decoded and resized images as bytes (Keras gives float32 0..255): a quarter of the
    # memory of float32 pixels, scaled to 0..1 after the cache.
    as_bytes = lambda x, y: (tf.cast(tf.clip_by_value(tf.round(x), 0, 255), tf.uint8),  # noqa: E731
                             tf.cast(y, tf.int32))
    scale = lambda x, y: (tf.cast(x, tf.float32) / 255.0, y)  # noqa: E731
    train = train.map(as_bytes, num_parallel_calls=tf.data.AUTOTUNE)
    val = val.map(as_bytes, num_parallel_calls=tf.data.AUTOTUNE)
    if cached:
        train, val = train.cache(), val.cache()
    for part in (train, val):
        _decoded(part, files, image_dir)
    train = (train.shuffle(buffer, seed=seed).map(scale).batch(batch_size)
             .prefetch(tf.data.AUTOTUNE))
    val = val.map(scale).batch(batch_size).prefetch(tf.data.AUTOTUNE)
    return DataBundle(train, val, (image_size, image_size, 3), len(classes), n_train, n_val,
                      classes, notes=[note] if note else [])


def _image_memory(images: int, train_images: int, image_size: int) -> tuple:
    """(keep the decoded images in memory, the shuffle buffer, the note when not kept).
    They are kept, and the whole training set shuffled each epoch (the buffer holds the
    cached images, not copies), unless they would take more than ``IMAGE_CACHE_SHARE`` of
    the memory free now (a container's limit counted), as an image folder of ImageNet's
    kind at 224x224 would (150 KB an image); then they are decoded each epoch, shuffled in a
    buffer of a tenth of the free memory."""
    per_image = image_size * image_size * 3
    need = images * per_image
    free = memory.available_bytes()
    if free is None or need <= IMAGE_CACHE_SHARE * free:
        return True, max(train_images, 1), None
    buffer = max(1, min(train_images, int(0.1 * free) // per_image))
    return False, buffer, (
        f"the {images:,} images decoded at {image_size}x{image_size} would take "
        f"{memory.format_size(need)}, more than half of the {memory.format_size(free)} free: "
        f"they are decoded again each epoch instead of kept in memory, and shuffled "
        f"{buffer:,} at a time (a smaller --image-size keeps them)")


def _count_images(image_dir: str, classes) -> int:
    """The files Keras' image_dataset_from_directory takes: those in the class subfolders
    (and below) with an image extension."""
    count = 0
    for cls in classes:
        for _, _, names in os.walk(os.path.join(image_dir, cls), followlinks=True):
            count += sum(1 for n in names if n.lower().endswith(IMAGE_EXTENSIONS))
    return count


def _decoded(images, files, image_dir: str) -> None:
    """Read ``images`` (the decoded images, behind ``cache()`` when they are kept) once to
    its end: that fills the cache the first epoch would fill, and an image that does not
    decode (a text file named .png, a truncated GIF) stops the load here in one line naming
    it, not the training midway with TensorFlow's "Invalid GIF data" traceback."""
    import tensorflow as tf

    try:
        images.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
    except tf.errors.InvalidArgumentError as exc:
        bad = [os.path.relpath(f, image_dir) for f in files if not _decodes(f)]
        first = (exc.message or str(exc)).strip().splitlines()[0][:160]
        raise UsageError(
            f"image directory {image_dir!r}: "
            + (f"{len(bad)} file(s) cannot be decoded as images: {listed(bad)}" if bad else
               f"an image cannot be decoded ({first})"),
            "JPEG, PNG, BMP or GIF files: repair, convert or remove those") from None


def _decodes(path: str) -> bool:
    import tensorflow as tf

    try:
        tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        return True
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
        return False


def load(dataset: str, input_shape, batch_size: int, data_dir: str | None = None, *,
         image_dir: str | None = None, max_train_samples: int | None = None,
         max_val_samples: int | None = None, seed: int = 0, offline: bool = False,
         data_dir_explicit: bool = True, num_classes: int = 10) -> DataBundle:
    """Load ``dataset`` as batched tf.data pipelines shaped for a model with ``input_shape``."""
    if dataset == "images":
        return _image_folder(image_dir, int(input_shape[0]), batch_size, seed,
                             max_train_samples, max_val_samples)
    unread = None
    if dataset == "synthetic":
        n_tr = max_train_samples or SYNTHETIC_TRAIN
        n_va = max_val_samples or SYNTHETIC_VAL
        (xtr, ytr), (xva, yva) = synthetic_arrays(input_shape, num_classes, n_tr, n_va, seed)
    elif dataset in _STANDARD:
        (xtr, ytr), (xva, yva) = load_arrays(dataset, data_dir, offline, data_dir_explicit)
        unread = unread_rows(xtr, ytr, max_train_samples)   # the standard files are uint8: none
        xtr, ytr = xtr[:max_train_samples], ytr[:max_train_samples]
        xva, yva = xva[:max_val_samples], yva[:max_val_samples]
        expected = int(np.prod(input_shape))
        if int(np.prod(xtr.shape[1:])) != expected:
            raise UsageError(f"dataset {dataset!r} has samples of shape {tuple(xtr.shape[1:])}, "
                             f"the model needs {tuple(input_shape)}",
                             registry.pairings_hint())
        num_classes = int(max(ytr.max(), yva.max())) + 1
    else:
        names = ", ".join(registry.DATASET_NAMES)
        raise UsageError(f"dataset must be one of {names}. Received: dataset={dataset!r}", names)
    xtr, xva = _prepare(xtr, input_shape), _prepare(xva, input_shape)
    return DataBundle(make_dataset(xtr, ytr, batch_size, True, seed),
                      make_dataset(xva, yva, batch_size, False),
                      tuple(input_shape), num_classes, len(xtr), len(xva),
                      sample_batch=(xtr[:8], np.asarray(ytr[:8]).astype(np.int32).reshape(-1)),
                      train_rows=DataRows(xtr, ytr, unread=unread))
