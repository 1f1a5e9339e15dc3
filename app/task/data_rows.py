"""Which rows of the training data the samples the sentinel names came from, and which rows
hold NaN or inf.

The sentinel's replay sees the failing batch as the pipeline shuffled it, so by itself it
can only say where in the epoch a sample sat; a user repairs data by row.  When the
training data are in-memory arrays (the built-in sets, a dataset function returning NumPy
arrays) their rows are found by content, after a fault only: every row of ``x_train`` and
``y_train`` that holds a NaN or an inf, and the rows equal, bit for bit, to the batch's
samples (the pipeline gathers rows without changing a bit, so a sample and its row are
identical).  Nothing is kept or computed on an ordinary step, and no array is copied: these
are the arrays the pipeline gathers from.  A pipeline that shuffles in a buffer (an image
folder, a user's ``tf.data``) has no rows to name; a user's ``tf.data`` dataset is checked
for NaN and inf in the pass that counts it at load (``app.task.user_data``), and its
elements that hold one are named by their place in it (``DatasetElements``).
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

# Rows (elements) that hold NaN or inf kept by number in a report (metrics.json, check's
# JSON), and the first of them a report's text names.
MOST_LISTED = 1000
SHOWN = 12
# Columns compared at a time while narrowing the rows that could equal a sample: one
# block over every row costs n * 256 comparisons, and after it few rows are left.
_BLOCK = 256
# Elements tested for NaN and inf at a time when scanning the data.
_SCAN_ELEMENTS = 1 << 24


class _BadRows:
    """What a data fault's report says of the data: how many rows (elements) hold NaN or
    inf, and which."""
    noun = "row"

    def nonfinite(self) -> List[int]:
        raise NotImplementedError

    def nonfinite_total(self) -> int:
        return len(self.nonfinite())

    def holding(self) -> str:
        raise NotImplementedError

    # True when only the first rows were read (check's few steps on a tf.data dataset).
    first_only = False

    def count_text(self) -> str:
        """'2 of the 512 training rows hold NaN or inf'."""
        n = self.nonfinite_total()
        return (f"{n} of the {'first ' if self.first_only else ''}{len(self)} training "
                f"{self.noun}s {'holds' if n == 1 else 'hold'} NaN or inf")

    def list_text(self, most: int = SHOWN) -> str:
        """'rows 97, 301 of x_train', the first ``most`` of them and how many more."""
        return rows_in(self.nonfinite()[:most], self.holding(), self.nonfinite_total(),
                       self.noun, most)


class DataRows(_BadRows):
    """The training arrays as the pipeline gathers from them, in the data's own row order.
    ``unread``: (x, y) rows of the same data after those (a run or ``check`` that reads
    fewer rows than the data has), as the data holds them: scanned for NaN and inf, so the
    rows named are all of the data's, never searched for a sample."""

    def __init__(self, x, y, names=("x_train", "y_train"), unread=None):
        # x: one array, or a dict of them (a model of several inputs), each named apart.
        self.arrays = [np.asarray(a) for a in _parts(x)] + [np.asarray(y)]
        self.unread = ([np.asarray(a) for a in _parts(unread[0])] + [np.asarray(unread[1])]
                       if unread is not None else None)
        self.names = tuple(_part_names(x, names[0])) + (names[1],)
        self.data_name = names[0]   # the features as a whole, for rows named by sample
        self._bad: Optional[List[np.ndarray]] = None

    def __len__(self) -> int:
        return len(self.arrays[0]) + (len(self.unread[0]) if self.unread is not None else 0)

    def nonfinite(self) -> List[int]:
        """Every row with a NaN or an inf in its features or its label, in order."""
        return [int(i) for i in np.flatnonzero(np.logical_or.reduce(
            self._nonfinite_by_array()))]

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
            wanted = [np.asarray(a)[i] for a in _parts(x)] + [np.asarray(y)[i]]
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


def _parts(x) -> list:
    """The arrays of ``x``: itself, or a dict's values in key order (as tf.nest orders them)."""
    return [x[k] for k in sorted(x)] if isinstance(x, dict) else [x]


def _part_names(x, name: str) -> list:
    """'x_train', or "x_train['ids']" for each array of a dict."""
    return [f"{name}[{k!r}]" for k in sorted(x)] if isinstance(x, dict) else [name]


def _floating(a) -> bool:
    return np.issubdtype(np.asarray(a).dtype, np.floating)


def _nonfinite_rows(a: np.ndarray) -> np.ndarray:
    """``nonfinite_rows`` of a floating array; no row of another holds a NaN."""
    return nonfinite_rows(a) if _floating(a) else np.zeros(len(a), bool)


def nonfinite_rows(a: np.ndarray) -> np.ndarray:
    """Per row (the first axis), does it hold a NaN or an inf; read in slices of rows, so
    the test's temporary stays small beside a training set of gigabytes."""
    bad = np.zeros(len(a), bool)
    if not len(a):
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


class DatasetElements(_BadRows):
    """A user's ``tf.data`` training dataset: how many elements it has, and the places in it
    (in its own order, before the app shuffles) of the elements that hold NaN or inf, the
    first ``len(bad)`` of ``bad_total``: found in the pass that counts it at load, so no
    element is read again.  Its samples are not searched for (``rows_of`` finds none)."""
    noun = "element"
    names = ("the training dataset",)
    data_name = names[0]

    def __init__(self, total: int, bad: List[int], bad_total: int, first_only: bool = False):
        self.total, self.bad, self.bad_total = total, list(bad), bad_total
        self.first_only = first_only   # the dataset was cut to its first ``total`` elements

    def __len__(self) -> int:
        return self.total

    def nonfinite(self) -> List[int]:
        return self.bad

    def nonfinite_total(self) -> int:
        return self.bad_total

    def holding(self) -> str:
        return self.names[0]

    def rows_of(self, x, y, samples: List[int]) -> List[int]:
        return []


def rows_in(rows: List[int], data: str, total: Optional[int] = None, noun: str = "row",
            most: int = SHOWN) -> str:
    """'row 4711 of x_train', or 'rows 97, 301 and 3 more of x_train' (``total``: how many
    there are, when ``rows`` lists only the first of them)."""
    if len(rows) == 1 and not (total or 0) > 1:
        return f"{noun} {rows[0]} of {data}"
    return f"{noun}s {listed(rows, total, most)} of {data}"


def listed(items: List[int], total: Optional[int] = None, most: int = SHOWN) -> str:
    """'5, 9, 12', or the first ``most`` and 'and N more'."""
    shown = items[:most]
    more = max(total or 0, len(items)) - len(shown)
    return ", ".join(str(i) for i in shown) + (f" and {more} more" if more else "")


def unread_rows(x, y, used: Optional[int]):
    """The rows of the data's ``x`` and ``y`` past the first ``used`` (the rows a run reads),
    when there are any and either array can hold a NaN (a floating one): views, no copy."""
    y = np.asarray(y)
    if used is None or used >= len(y) or not any(
            _floating(a) for a in _parts(x) + [y]):
        return None
    if isinstance(x, dict):
        return {k: np.asarray(a)[used:] for k, a in x.items()}, y[used:]
    return np.asarray(x)[used:], y[used:]
