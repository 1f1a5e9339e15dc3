"""The on-disk formats users bring (Keras' Fashion-MNIST .gz files, the CIFAR-10 python
batches) and the download path, with Keras' loader replaced: no network here."""
import gzip
import os
import pickle

import numpy as np
import pytest
import tensorflow as tf

from app.task import data
from app.core.errors import UsageError


def _write_idx(path, array, magic):
    """An IDX file as Keras downloads it: 4-byte magic, a 4-byte size per dimension, bytes."""
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_gz_files_are_read(tmp_path):
    rng = np.random.default_rng(1)
    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    x_train = rng.integers(0, 256, (30, 28, 28), dtype=np.uint8)
    y_train = rng.integers(0, 10, 30, dtype=np.uint8)
    x_test = rng.integers(0, 256, (7, 28, 28), dtype=np.uint8)
    y_test = rng.integers(0, 10, 7, dtype=np.uint8)
    _write_idx(folder / "train-images-idx3-ubyte.gz", x_train, 2051)
    _write_idx(folder / "train-labels-idx1-ubyte.gz", y_train, 2049)
    _write_idx(folder / "t10k-images-idx3-ubyte.gz", x_test, 2051)
    _write_idx(folder / "t10k-labels-idx1-ubyte.gz", y_test, 2049)

    (xtr, ytr), (xte, yte) = data.load_arrays("fashion_mnist", str(tmp_path), offline=True)
    assert np.array_equal(xtr, x_train) and np.array_equal(ytr, y_train)
    assert np.array_equal(xte, x_test) and np.array_equal(yte, y_test)


def test_truncated_fashion_gz_is_reported_as_corrupt(tmp_path):
    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    _write_idx(folder / "train-labels-idx1-ubyte.gz", np.zeros(5, np.uint8), 2049)
    (folder / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(UsageError, match="corrupt"):
        data.load_arrays("fashion_mnist", str(tmp_path), offline=True)


def _cifar_batch(rng, n):
    images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    # CIFAR-10's python batches store each image channel-first, flattened: R plane, G, B.
    flat = images.transpose(0, 3, 1, 2).reshape(n, 3 * 32 * 32)
    labels = rng.integers(0, 10, n).tolist()
    return images, labels, {b"data": flat, b"labels": labels}


def test_cifar10_python_batches_are_read_channels_last(tmp_path):
    rng = np.random.default_rng(2)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    train_images, train_labels = [], []
    for i in range(1, 6):
        images, labels, batch = _cifar_batch(rng, 4)
        train_images.append(images)
        train_labels += labels
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch))
    test_images, test_labels, batch = _cifar_batch(rng, 3)
    (folder / "test_batch").write_bytes(pickle.dumps(batch))

    (xtr, ytr), (xte, yte) = data.load_arrays("cifar10", str(tmp_path), offline=True)
    assert xtr.shape == (20, 32, 32, 3) and xte.shape == (3, 32, 32, 3)
    assert np.array_equal(xtr, np.concatenate(train_images))  # pixels land where they were
    assert ytr.tolist() == train_labels and yte.tolist() == test_labels


def test_download_is_stored_as_npz_and_read_from_disk_afterwards(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    arrays = ((rng.integers(0, 256, (12, 28, 28), dtype=np.uint8), rng.integers(0, 10, 12)),
              (rng.integers(0, 256, (4, 28, 28), dtype=np.uint8), rng.integers(0, 10, 4)))
    calls = []

    def fake_load_data():
        calls.append(1)
        return arrays

    monkeypatch.setattr(tf.keras.datasets.mnist, "load_data", fake_load_data)
    data_dir = tmp_path / "data"
    (xtr, _), _ = data.load_arrays("mnist", str(data_dir), data_dir_explicit=False)
    assert calls == [1] and np.array_equal(xtr, arrays[0][0])
    assert sorted(os.listdir(data_dir)) == ["mnist.npz"]  # no temporary file left

    (xtr2, _), _ = data.load_arrays("mnist", str(data_dir), offline=True)
    assert calls == [1], "the stored file must be used instead of downloading again"
    assert np.array_equal(xtr2, arrays[0][0])


def test_failed_download_says_what_to_do_and_leaves_no_folder(tmp_path, monkeypatch):
    def offline_load_data():
        raise OSError("network is unreachable")

    monkeypatch.setattr(tf.keras.datasets.cifar10, "load_data", offline_load_data)
    data_dir = tmp_path / "data"
    with pytest.raises(UsageError) as info:
        data.load_arrays("cifar10", str(data_dir), data_dir_explicit=False)
    line = info.value.line()
    assert "download failed" in line and "network is unreachable" in line
    assert "cifar10.npz" in line and "\n" not in line
    assert not data_dir.exists()
