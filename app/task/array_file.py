"""A dataset saved as NumPy arrays in one ``.npz`` file, given as ``--dataset path/to/data.npz``.

The arrays are named as Keras' own dataset files name them, so such a file (``mnist.npz``)
works as it is, and ``np.savez("data.npz", x_train=..., y_train=..., x_val=..., y_val=...)``
makes one:

    x_train, y_train              the training samples and their labels
    x_val, y_val                  the validation part (or x_test, y_test, as Keras names it)
    sample_weight_train, ...      optional: a weight a sample, for either part
    x_train/NAME, x_val/NAME      a model of several inputs: one array an input, by its name

The file is opened when the spec is resolved, reading only the archive's list of arrays, so a
missing, corrupt or wrongly laid-out file is one line before anything is written; the
arrays are read when the data is loaded.  Nothing pickled is ever loaded: a pickle runs code.
"""
from __future__ import annotations

import os
import zipfile
import zlib
from typing import List, Optional

from app.core.errors import UsageError

SUFFIX = ".npz"
LAYOUT = ("a NumPy .npz file of arrays x_train, y_train and x_val, y_val (or x_test, y_test), "
          "e.g. np.savez('data.npz', x_train=x[:n], y_train=y[:n], x_val=x[n:], y_val=y[n:]); "
          "optionally sample_weight_train and sample_weight_val, and x_train/NAME arrays for "
          "a model of several inputs")
# The validation part's names, in the order they are looked for.
VALIDATION_PARTS = ("val", "test")


def is_array_file(spec) -> bool:
    """Does the dataset spec name an .npz file (rather than a built-in or MODULE:FUNCTION)?"""
    return isinstance(spec, str) and spec.lower().endswith(SUFFIX)


def _named(spec: str) -> str:
    return f"dataset file {spec!r}"


def _open(spec: str):
    """The archive, lazily: numpy reads its directory now and each array when asked."""
    import numpy as np

    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        raise UsageError(f"{_named(spec)} is a folder, not a file", LAYOUT)
    if not os.path.exists(path):
        raise UsageError(f"{_named(spec)} does not exist",
                         f"an existing .npz file, relative to the current directory "
                         f"({os.getcwd()}) or absolute")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(6)
    except OSError as exc:
        raise UsageError(f"{_named(spec)} cannot be read: {exc.strerror}",
                         "a file readable by this user") from None
    if magic == b"\x93NUMPY":
        raise UsageError(f"{_named(spec)} holds one array (an .npy file), not named arrays",
                         LAYOUT)
    if not zipfile.is_zipfile(path):
        raise UsageError(f"{_named(spec)} is not a NumPy .npz archive (not a zip file: "
                         "truncated, or another format)", LAYOUT)
    try:
        archive = np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise UsageError(f"{_named(spec)} is not a NumPy .npz archive ({_why(exc)})",
                         LAYOUT) from None
    return archive


def _features(files: List[str], part: str) -> Optional[List[str]]:
    """The names that hold ``x_<part>``: itself, or ``x_<part>/NAME`` for each input."""
    if f"x_{part}" in files:
        return [f"x_{part}"]
    inputs = sorted(f for f in files if f.startswith(f"x_{part}/") and len(f) > len(part) + 3)
    return inputs or None


def _validation_part(files: List[str]) -> Optional[str]:
    for part in VALIDATION_PARTS:
        if _features(files, part) and f"y_{part}" in files:
            return part
    return None


def check_layout(spec: str) -> str:
    """The name of the file's validation part ('val' or 'test'); one line when the arrays
    a training run needs are not all there."""
    with _open(spec) as archive:
        return _validation_of(list(archive.files), spec)


def _validation_of(files: List[str], spec: str) -> str:
    """``check_layout`` on the archive's list of arrays."""
    held = ", ".join(sorted(files)[:12]) + (", ..." if len(files) > 12 else "") or "no arrays"
    missing = [name for name, there in (("x_train", _features(files, "train")),
                                        ("y_train", "y_train" in files)) if not there]
    if missing:
        raise UsageError(f"{_named(spec)} holds {held}: {' and '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} missing", LAYOUT)
    part = _validation_part(files)
    if part is None:
        raise UsageError(f"{_named(spec)} holds {held}: the validation part is missing "
                         "(x_val and y_val, or x_test and y_test)", LAYOUT)
    return part


def load(spec: str):
    """((x_train, y_train[, w]), (x_val, y_val[, w])), as a dataset function returns them;
    the features a dict of arrays when the file holds one an input."""
    with _open(spec) as archive:
        files = list(archive.files)
        part = _validation_of(files, spec)
        try:
            return tuple(_part(archive, files, name, spec) for name in ("train", part))
        except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError) as exc:
            # zlib: an np.savez_compressed file whose bytes were damaged
            raise UsageError(f"{_named(spec)} cannot be read ({_why(exc)})", LAYOUT) from None


def _why(exc: BaseException) -> str:
    why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
    if "allow_pickle" in why or "Object arrays" in why or "pickled" in why:
        return "an array holds Python objects, which are never loaded: a pickle runs code"
    return why


def _part(archive, files: List[str], part: str, spec: str):
    names = _features(files, part)
    x = (archive[names[0]] if names == [f"x_{part}"]
         else {n.split("/", 1)[1]: archive[n] for n in names})
    y = archive[f"y_{part}"]
    weight = f"sample_weight_{part}"
    return (x, y, archive[weight]) if weight in files else (x, y)
