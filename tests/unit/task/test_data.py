"""Data loading: synthetic, standard files, image folders, and bad input."""
import os

import numpy as np
import pytest

from app.task import data
from app.core.errors import UsageError


def test_synthetic_is_deterministic_and_shaped():
    a = data.synthetic_arrays((784,), n_train=64, n_val=16, seed=3)
    b = data.synthetic_arrays((784,), n_train=64, n_val=16, seed=3)
    assert np.array_equal(a[0][0], b[0][0])
    assert a[0][0].shape == (64, 784) and a[0][0].dtype == np.float32
    bundle = data.load("synthetic", (32, 32, 3), 16, max_train_samples=40, max_val_samples=8)
    x, y = next(iter(bundle.train))
    assert tuple(x.shape) == (16, 32, 32, 3) and x.dtype.name == "float32"
    assert bundle.train_samples == 40 and bundle.num_classes == 10


def test_standard_npz_is_read_offline(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "mnist.npz",
             x_train=rng.integers(0, 255, (50, 28, 28), dtype=np.uint8),
             y_train=rng.integers(0, 10, 50), x_test=rng.integers(0, 255, (10, 28, 28), dtype=np.uint8),
             y_test=rng.integers(0, 10, 10))
    bundle = data.load("mnist", (784,), 8, str(tmp_path), offline=True)
    x, _ = next(iter(bundle.train))
    assert tuple(x.shape) == (8, 784)
    assert float(np.max(x)) <= 1.0


def test_missing_file_offline_names_file_and_folder(tmp_path):
    with pytest.raises(UsageError) as info:
        data.load("mnist", (784,), 8, str(tmp_path), offline=True)
    assert "mnist.npz" in str(info.value) and str(tmp_path) in str(info.value)


def test_missing_data_dir(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        data.load("mnist", (784,), 8, str(tmp_path / "nope"), offline=True)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(UsageError, match="data directory '.*a-file' is a file, not a folder"):
        data.load("mnist", (784,), 8, str(tmp_path / "a-file"), offline=True)


def test_corrupt_file(tmp_path):
    (tmp_path / "mnist.npz").write_bytes(b"this is not a zip file")
    with pytest.raises(UsageError, match="corrupt"):
        data.load("mnist", (784,), 8, str(tmp_path), offline=True)


def test_image_folder(tmp_path):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    for cls, level in (("cats", 30), ("dogs", 220)):
        os.makedirs(tmp_path / cls)
        for i in range(10):
            img = np.clip(rng.normal(level, 10, (20, 20, 3)), 0, 255).astype(np.uint8)
            tf.io.write_file(str(tmp_path / cls / f"{i}.png"), tf.io.encode_png(img))
    bundle = data.load("images", (32, 32, 3), 4, image_dir=str(tmp_path))
    assert bundle.num_classes == 2 and bundle.class_names == ["cats", "dogs"]
    assert bundle.train_samples + bundle.val_samples == 20
    x, y = next(iter(bundle.train))
    assert tuple(x.shape[1:]) == (32, 32, 3) and x.dtype.name == "float32"
    assert float(np.max(x)) <= 1.0


def _noise_pngs(folder, per_class, classes=("cats", "dogs")):
    """``per_class`` 12x12 PNGs of noise in a subfolder per class."""
    import tensorflow as tf

    rng = np.random.default_rng(len(classes))
    for cls in classes:
        os.makedirs(folder / cls, exist_ok=True)
        for i in range(per_class):
            img = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
            tf.io.write_file(str(folder / cls / f"{i}.png"), tf.io.encode_png(img))


@pytest.mark.parametrize("what", ["missing", "file", "unreadable"])
def test_an_image_folder_that_is_not_one_is_named(tmp_path, what):
    """The line says which: not there, a file, or a folder this user cannot list (a mount
    owned by another UID; root lists any folder, so that case needs the image's user)."""
    path = tmp_path / "images"
    if what == "file":
        path.write_text("not a folder")
    elif what == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root can list a folder without read permission")
        (path / "cat").mkdir(parents=True)
        path.chmod(0o300)
    try:
        with pytest.raises(UsageError) as info:
            data.load("images", (32, 32, 3), 4, image_dir=str(path))
    finally:
        if what == "unreadable":
            path.chmod(0o700)
    expected = {"missing": f"image directory '{path}' does not exist",
                "file": f"image directory '{path}' is a file, not a folder",
                "unreadable": f"image directory '{path}' cannot be read: Permission denied"}[what]
    assert str(info.value).startswith("error: " + expected), str(info.value)


def test_an_image_that_does_not_decode_is_named_at_load(tmp_path):
    """A text file named .png and a truncated GIF named .jpg: the training stopped midway
    in TensorFlow's "Invalid GIF data" traceback."""
    _noise_pngs(tmp_path, 6)
    (tmp_path / "cats" / "notes.png").write_text("not an image")
    (tmp_path / "dogs" / "cut.jpg").write_bytes(b"GIF89a and then nothing")
    with pytest.raises(UsageError) as caught:
        data.load("images", (32, 32, 3), 4, image_dir=str(tmp_path))
    assert str(caught.value) == (
        f"error: image directory {str(tmp_path)!r}: 2 file(s) cannot be decoded as images: "
        f"{os.path.join('cats', 'notes.png')}, {os.path.join('dogs', 'cut.jpg')}; allowed: "
        "JPEG, PNG, BMP or GIF files: repair, convert or remove those")
    (tmp_path / "cats" / "notes.png").unlink()
    (tmp_path / "dogs" / "cut.jpg").unlink()
    bundle = data.load("images", (32, 32, 3), 4, image_dir=str(tmp_path))
    assert bundle.train_samples + bundle.val_samples == 12
    # The check was the first epoch's decoding, not one more: the images are cached by it.
    for png in tmp_path.glob("*/*.png"):
        png.unlink()
    assert sum(int(x.shape[0]) for x, _ in bundle.train) == bundle.train_samples
    assert sum(int(x.shape[0]) for x, _ in bundle.val) == bundle.val_samples


def test_an_image_folder_too_large_for_memory_is_decoded_each_epoch(tmp_path, monkeypatch):
    """The decoded images were kept in memory as float32 whatever their number, and the
    whole training set again in the shuffle buffer: 8 bytes a pixel and channel, so an image
    folder of ImageNet's kind filled the memory while it loaded (165 MiB for 3,000 images
    at 64x64, tests/benchmarks/bench_image_cache.py; 66 MiB now).  They are kept as bytes,
    and only while they fit in half the memory free; else read again each epoch."""
    import tensorflow as tf

    _noise_pngs(tmp_path, 10)                  # 20 images, 16 of them for training
    per_image = 32 * 32 * 3
    monkeypatch.setattr(data.memory, "available_bytes", lambda: 30 * per_image)
    bundle = data.load("images", (32, 32, 3), 4, image_dir=str(tmp_path))
    assert bundle.notes == [
        "the 20 images decoded at 32x32 would take 0 MiB, more than half of the 0 MiB free: "
        "they are decoded again each epoch instead of kept in memory, and shuffled 3 at a "
        "time (a smaller --image-size keeps them)"]
    for _ in range(2):
        x, _ = next(iter(bundle.train))
        assert x.dtype == tf.float32 and 0.0 <= float(tf.reduce_min(x)) <= float(
            tf.reduce_max(x)) <= 1.0
        assert sum(int(x.shape[0]) for x, _ in bundle.train) == bundle.train_samples
    for png in tmp_path.glob("*/*.png"):       # read from the folder every epoch
        png.unlink()
    with pytest.raises(tf.errors.NotFoundError):
        sum(int(x.shape[0]) for x, _ in bundle.train)
    # With the memory there, they are kept (test_an_image_that_does_not_decode_is_named_at_load
    # reads a cached set after its files are gone) and nothing is said.
    _noise_pngs(tmp_path, 10)
    monkeypatch.setattr(data.memory, "available_bytes", lambda: 2 ** 30)
    assert data.load("images", (32, 32, 3), 4, image_dir=str(tmp_path)).notes == []


def test_in_memory_batches_cover_every_row_once_in_a_new_order_each_epoch():
    from app.task.data import make_dataset

    x = np.arange(70, dtype=np.float32).reshape(70, 1)
    y = np.arange(70) % 7

    def epochs(ds, k=3):
        return [np.concatenate([b[0].numpy()[:, 0] for b in ds]).astype(int) for _ in range(k)]

    ds = make_dataset(x, y, 16, shuffle=True, seed=3)
    assert int(ds.cardinality()) == 5                  # known to Keras: 4 full batches + 6
    assert [int(b[0].shape[0]) for b in make_dataset(x, y, 16, shuffle=True)] == [16] * 4 + [6]
    orders = epochs(ds)
    for order in orders:                               # every row once, labels still aligned
        assert sorted(order) == list(range(70))
    first = next(iter(make_dataset(x, y, 16, shuffle=True, seed=3)))
    assert np.array_equal(first[1].numpy(), first[0].numpy()[:, 0].astype(int) % 7)
    assert len({tuple(o) for o in orders}) == 3        # reshuffled every epoch
    assert [list(o) for o in epochs(make_dataset(x, y, 16, shuffle=True, seed=3))] == \
        [list(o) for o in orders]                      # the same orders for the same seed
    assert epochs(make_dataset(x, y, 16, shuffle=True, seed=4), 1)[0].tolist() != orders[0].tolist()
    assert epochs(make_dataset(x, y, 16, shuffle=False), 1)[0].tolist() == list(range(70))


def test_missing_default_data_dir_offline_names_the_file_not_a_flag(tmp_path):
    # The workspace's own data folder, not made yet: the user gave no --data-dir to omit.
    folder = str(tmp_path / "ws" / "data")
    with pytest.raises(UsageError) as info:
        data.load("mnist", (784,), 8, folder, offline=True, data_dir_explicit=False)
    line = info.value.line()
    assert "mnist.npz" in line and folder in line and "downloads are off" in line
    assert "--data-dir" not in line
    assert not os.path.exists(folder)


def test_an_image_folder_too_small_to_keep_validation_images_says_so(tmp_path):
    """Four images: Keras keeps int(20%) = none for validation and said "No images found"
    of the folder whose four training images it had just listed."""
    _noise_pngs(tmp_path, 2)
    with pytest.raises(UsageError) as caught:
        data.load("images", (32, 32, 3), 4, image_dir=str(tmp_path))
    assert str(caught.value) == (
        f"error: image directory {str(tmp_path)!r} has 4 image(s): too few to keep 20% of "
        "them for validation (that is none); allowed: 5 images or more in its class "
        "subfolders, better dozens a class")
    _noise_pngs(tmp_path, 1, classes=("birds",))
    bundle = data.load("images", (32, 32, 3), 4, image_dir=str(tmp_path))
    assert (bundle.train_samples, bundle.val_samples) == (4, 1)
