"""The training data's rows the sentinel names (app.task.data_rows): found by content, after
a fault, in the arrays the pipeline gathers from."""
from __future__ import annotations

import numpy as np
import pytest

from app.task.data_rows import DataRows, DatasetElements, unread_rows


def _data(n=300, width=700):
    # wider than one block of columns, so the narrowing runs over several blocks
    rng = np.random.default_rng(1)
    return rng.random((n, width)).astype("float32"), rng.integers(0, 10, n).astype("uint8")


def test_every_nonfinite_row_and_the_array_holding_it():
    x, y = _data()
    x[[17, 240]] = np.nan
    x[99, 650] = np.inf
    rows = DataRows(x, y)
    assert rows.nonfinite() == [17, 99, 240] and rows.holding() == "x_train"
    labels = np.linspace(0, 1, len(x)).astype("float32")
    labels[5] = np.nan
    both = DataRows(x, labels)
    assert both.nonfinite() == [5, 17, 99, 240] and both.holding() == "x_train and y_train"
    assert DataRows(*_data()).nonfinite() == []


def test_a_shuffled_batchs_samples_are_their_rows():
    x, y = _data()
    x[[17, 240]] = np.nan
    x[99, 650] = np.inf
    order = np.random.default_rng(2).permutation(len(x))
    batch = order[:32].tolist() + [240, 99]
    # As the pipeline delivers them: gathered rows, labels made int32.
    bx, by = x[batch], y[batch].astype("int32")
    rows = DataRows(x, y)
    assert rows.rows_of(bx, by, [32, 33]) == [240, 99]          # non-finite samples
    assert rows.rows_of(bx, by, [0, 5]) == [batch[0], batch[5]]  # finite ones, searched in all


def test_identical_rows_are_all_named_and_a_changed_sample_names_none():
    x, y = _data()
    x[50], y[50] = x[7], y[7]
    rows = DataRows(x, y)
    assert rows.rows_of(x[[7]], y[[7]], [0]) == [7, 50]
    assert rows.rows_of(x[[7]] * 2, y[[7]], [0]) == []
    assert rows.rows_of(x[[7]], (y[[7]] + 1) % 10, [0]) == []   # same features, other label


def test_samples_of_another_shape_name_no_row():
    x, y = _data()
    with pytest.raises(IndexError):
        DataRows(x, y).rows_of(x[:2, :10], y[:2], [3])
    assert DataRows(x, y).rows_of(x[:2, :10], y[:2], [1]) == []


def test_rows_past_the_ones_read_are_scanned_but_never_matched():
    x, y = _data()
    x[[10, 250]] = np.nan
    rows = DataRows(x[:200], y[:200], unread=unread_rows(x, y, 200))
    assert len(rows) == 300 and rows.nonfinite() == [10, 250]
    assert rows.rows_of(x[[250, 10]], y[[250, 10]], [0, 1]) == [10]   # row 250 was not read
    assert unread_rows(x, y, None) is None and unread_rows(x, y, 300) is None
    assert unread_rows(x.astype("uint8"), y, 100) is None     # integers hold no NaN
    assert np.shares_memory(unread_rows(x, y, 100)[0], x)     # views, not copies


def test_what_a_report_says_of_the_bad_rows_and_elements():
    x, y = _data()
    x[[17, 240]] = np.nan
    rows = DataRows(x, y)
    assert rows.count_text() == "2 of the 300 training rows hold NaN or inf"
    assert rows.list_text() == "rows 17, 240 of x_train"
    elements = DatasetElements(600, list(range(3, 1003)), 5000, first_only=True)
    assert elements.count_text() == "5000 of the first 600 training elements hold NaN or inf"
    assert elements.list_text(most=3) == "elements 3, 4, 5 and 4997 more of the training dataset"
    assert DatasetElements(10, [4], 1).count_text() == "1 of the 10 training elements holds NaN or inf"
    assert DatasetElements(10, [4], 1).list_text() == "element 4 of the training dataset"
    assert DatasetElements(10, [4], 1).rows_of(x, y, [0]) == []


def test_a_tf_data_dataset_s_bad_elements_are_found_in_the_pass_that_counts_it(monkeypatch):
    import tensorflow as tf

    from app.task import user_data, user_datasets

    x, y = _data(n=40, width=4)
    x[[3, 11, 12, 30]] = np.nan
    y = y.astype("int32")
    monkeypatch.setattr(user_datasets, "MOST_LISTED", 3)
    bundle = user_data.from_user((tf.data.Dataset.from_tensor_slices((x, y)),   # clean val:
                                  tf.data.Dataset.from_tensor_slices((x[4:10], y[4:10]))),
                                 "mine:load", 8)
    assert bundle.train_samples == 40
    rows = bundle.train_rows
    assert (rows.nonfinite(), rows.nonfinite_total()) == ([3, 11, 12], 4)
    assert rows.count_text() == "4 of the 40 training elements hold NaN or inf"
    clean = user_data.from_user((tf.data.Dataset.from_tensor_slices((x[:3], y[:3])),
                                 tf.data.Dataset.from_tensor_slices((x[:3], y[:3]))),
                                "mine:load", 8, max_train_samples=2)
    assert clean.train_rows.nonfinite() == [] and clean.train_rows.first_only
    images = user_data.from_user((tf.data.Dataset.from_tensor_slices(
        (np.zeros((6, 2, 2, 1), "uint8"), np.arange(6, dtype="int32") % 2)),) * 2, "mine:load", 2)
    assert images.train_rows.nonfinite() == []   # integers hold no NaN: nothing scanned
