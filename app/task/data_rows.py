"""Which rows of the training data the samples the sentinel names came from.

The sentinel's replay sees the failing batch as the pipeline shuffled it, so by itself it
can only say where in the epoch a sample sat; a user repairs data by row.  When the
training data are in-memory arrays (the built-in sets, a dataset function returning NumPy
arrays) their rows are found by content, after a fault only: every row of ``x_train`` and
``y_train`` that holds a NaN or an inf, and the rows equal, bit for bit, to the batch's
samples (the pipeline gathers rows without changing a bit, so a sample and its row are
identical).  Nothing is kept or computed on an ordinary step, and no array is copied: these
are the arrays the pipeline gathers from.  A pipeline that shuffles in a buffer (an image
folder, a user's ``tf.data``) has no rows to name.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

# Columns compared at a time while narrowing the rows that could equal a sample: one
# block over every row costs n * 256 comparisons, and after it few rows are left.
_BLOCK = 256
# Elements tested for NaN and inf at a time when scanning the data.
_SCAN_ELEMENTS = 1 << 24


class DataRows:
    """The training arrays as the pipeline gathers from them, in the data's own row order.
    ``unread``: (x, y) rows of the same data after those (a run or ``check`` that reads
    fewer rows than the data has), as the data holds them: scanned for NaN and inf, so the
    rows named are all of the data's, never searched for a sample."""

    def __init__(self, x, y, names=("x_train", "y_train"), unread=None):
        self.arrays = [np.asarray(x), np.asarray(y)]
        self.unread = [np.asarray(a) for a in unread] if unread is not None else None
        self.names = names
        self._bad: Optional[List[np.ndarray]] = None

    def __len__(self) -> int:
        return len(self.arrays[0]) + (len(self.unread[0]) if self.unread is not None else 0)

    def nonfinite(self) -> List[int]:
        """Every row with a NaN or an inf in its features or its label, in order."""
        bad = self._nonfinite_by_array()
        return [int(i) for i in np.flatnonzero(bad[0] | bad[1])]

    def holding(self) -> str:
        """Which arrays hold the non-finite rows: 'x_train', 'y_train' or both."""
        bad = self._nonfinite_by_array()
        return " and ".join(n for n, b in zip(self.names, bad) if b.any()) or self.names[0]

    def rows_of(self, x, y, samples: List[int]) -> List[int]:
        """The rows equal to the batch's ``samples`` (positions in ``x`` and ``y``), in the
        samples' order, each once; a sample no row equals (the pipeline changed it) adds
        none.  A non-finite sample is looked for among the non-finite rows only."""
        read = len(self.arrays[0])   # the rows the pipeline gathers from
        bad_read = np.array([r for r in self.nonfinite() if r < read], np.int64)
        found: List[int] = []
        for i in samples:
            wanted = [np.asarray(x)[i], np.asarray(y)[i]]
            finite = all(np.isfinite(w).all() for w in wanted if _floating(w))
            candidates = np.arange(read) if finite else bad_read
            for array, sample in zip(self.arrays, wanted):
                candidates = _equal_rows(array, sample, candidates)
            found += [int(r) for r in candidates if int(r) not in found]
        return found

    def _nonfinite_by_array(self) -> List[np.ndarray]:
        if self._bad is None:
            self._bad = [_nonfinite_rows(a) for a in self.arrays]
            if self.unread is not None:
                self._bad = [np.concatenate([b, _nonfinite_rows(a)])
                             for b, a in zip(self._bad, self.unread)]
        return self._bad


def _floating(a) -> bool:
    return np.issubdtype(np.asarray(a).dtype, np.floating)


def _nonfinite_rows(a: np.ndarray) -> np.ndarray:
    """Per row, does it hold a NaN or an inf; read in slices of rows, so the test's
    temporary stays small beside a training set of gigabytes."""
    bad = np.zeros(len(a), bool)
    if not _floating(a) or not len(a):
        return bad
    flat = a.reshape(len(a), -1)
    step = max(1, _SCAN_ELEMENTS // max(1, flat.shape[1]))
    for start in range(0, len(flat), step):
        bad[start:start + step] = ~np.isfinite(flat[start:start + step]).all(axis=1)
    return bad


def _bits(a: np.ndarray) -> np.ndarray:
    """``a``'s rows as unsigned integers of its width, one row per sample: compared so,
    NaN equals NaN bit for bit, as a gathered sample equals its row."""
    a = np.ascontiguousarray(a)
    if a.dtype.kind == "f":
        a = a.view(f"u{a.dtype.itemsize}")
    return a.reshape(len(a), -1) if a.ndim else a.reshape(1, 1)


def _equal_rows(array: np.ndarray, sample, candidates: np.ndarray) -> np.ndarray:
    """The rows among ``candidates`` of ``array`` equal to ``sample``, bit for bit (the
    sample cast to the array's dtype first: a label the pipeline made int32 from uint8)."""
    table = _bits(array)
    wanted = _bits(np.asarray(sample).astype(array.dtype)[None])[0]
    if wanted.shape[0] != table.shape[1]:
        return candidates[:0]
    everything = len(candidates) == len(table)
    for start in range(0, table.shape[1], _BLOCK):
        if not len(candidates):
            break
        block = slice(start, start + _BLOCK)
        rows = table[:, block] if everything else table[candidates, block]
        candidates = candidates[(rows == wanted[block]).all(axis=1)]
        everything = False
    return candidates


def unread_rows(x, y, used: Optional[int]):
    """The rows of the data's ``x`` and ``y`` past the first ``used`` (the rows a run reads),
    when there are any and either array can hold a NaN (a floating one): views, no copy."""
    x, y = np.asarray(x), np.asarray(y)
    if used is None or used >= len(x) or not (_floating(x) or _floating(y)):
        return None
    return x[used:], y[used:]
