"""A model of several inputs (numbers and token ids) trained on its dict features as a user
has them: a dict of arrays, tf.data of dict or tuple features; check, the sentinel's naming
of a faulty input's rows, and the one-line refusals of data that does not fit."""
import json
import os

import numpy as np
import pytest

from app.core.errors import UsageError
from app.task.data_rows import DataRows, unread_rows
from tests.paths import USER_MODELS
from tests.unit.helpers import error_lines, run_app, user_module

SEVERAL = os.path.join(str(USER_MODELS), "several_inputs.py")
TARGET = 0.9
QUICK = ["--batch-size", "32", "--progress", "lines", "--offline", "--no-save-model",
         "--log-every", "4"]


def _several():
    return user_module(SEVERAL)


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_dict_of_arrays_trains_a_two_input_model_in_both_loops(tiny_config, loop):
    from app.training.job import train

    m = train(tiny_config(model=f"{SEVERAL}:build", dataset=f"{SEVERAL}:arrays", loop=loop,
                          epochs=4, learning_rate=1e-2))
    assert m["status"] == "completed"
    assert m["data"]["input_shape"] == {"ids": [3], "num": [8]}
    assert (m["data"]["train_samples"], m["data"]["num_classes"]) == (512, 4)
    assert m["epochs"][-1]["val_accuracy"] >= TARGET


@pytest.mark.parametrize("form, build", [("datasets", "build"), ("tuple_datasets", "build_ordered")])
def test_tf_data_of_dict_or_tuple_features_trains(tiny_config, form, build):
    from app.training.job import train

    m = train(tiny_config(model=f"{SEVERAL}:{build}", dataset=f"{SEVERAL}:{form}",
                          loop="custom", epochs=4, learning_rate=1e-2))
    assert m["status"] == "completed" and m["epochs"][-1]["val_accuracy"] >= TARGET
    shape = m["data"]["input_shape"]
    assert shape == ({"ids": [3], "num": [8]} if form == "datasets" else [[8], [3]])


def test_inputs_keep_their_kind_ids_integers_numbers_float32():
    from app.task.user_data import from_user

    several = _several()
    (xtr, ytr), val = several.arrays()
    xtr["pixels"] = np.full((len(ytr), 2, 2), 255, np.uint8)
    val[0]["pixels"] = np.zeros((len(val[1]), 2, 2), np.uint8)
    bundle = from_user(((xtr, ytr), val), "t:arrays", 32)
    x, _ = bundle.sample_batch
    assert x["ids"].dtype == np.int64 and x["num"].dtype == np.float32
    assert x["pixels"].dtype == np.float32 and x["pixels"].max() == 1.0   # uint8 scaled
    assert bundle.input_shape == {"num": (8,), "ids": (3,), "pixels": (2, 2)}
    batch_x, batch_y = next(iter(bundle.train))
    assert sorted(batch_x) == ["ids", "num", "pixels"] and batch_y.shape[0] == 32
    assert batch_x["ids"].dtype.name == "int64"


def test_data_that_does_not_fit_is_one_line():
    from app.task.user_data import from_user

    several = _several()
    with pytest.raises(UsageError, match="training inputs are \\['ids', 'num'\\], the "
                                          "validation inputs \\['num', 'tokens'\\]"):
        from_user(several.mismatched_keys(), "t:keys", 32)
    (xtr, ytr), val = several.arrays()
    xtr["ids"] = xtr["ids"][:-1]
    with pytest.raises(UsageError, match="input 'ids': 511 samples but 512 labels"):
        from_user(((xtr, ytr), val), "t:rows", 32)
    (xtr, ytr), val = several.arrays()
    val[0]["num"] = val[0]["num"][:, :4]
    with pytest.raises(UsageError, match="training samples of input 'num' have shape \\(8,\\), "
                                          "validation samples \\(4,\\)"):
        from_user(((xtr, ytr), val), "t:shape", 32)
    with pytest.raises(UsageError, match="string keys"):
        from_user((({1: xtr["num"]}, ytr), ({1: val[0]["num"]}, val[1])), "t:int", 32)


def test_a_model_whose_inputs_differ_from_the_data_is_one_line(tmp_path):
    arrays = os.path.join(str(USER_MODELS), "datasets.py") + ":arrays"
    proc = run_app("train", "--model", f"{SEVERAL}:fixed", "--dataset", arrays,
                   "--epochs", "1", *QUICK, "--output", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert error_lines(proc.stderr) == [
        f"error: model '{SEVERAL}:fixed' takes 2 input(s) ('ids', 'num'); dataset "
        f"'{arrays}' gives features as one tensor; allowed: features as one tensor for a "
        "model of one input, or a dict of tensors keyed by the model's input names "
        "(docs/your-model.md)"]
    assert not (tmp_path / "run").exists()


def test_a_model_whose_input_shape_differs_from_the_data_is_one_line(tmp_path):
    """Input((7,)) on data of 8 features came as "your code raised ValueError while running
    the model on one batch", a traceback, exit 1 (a QA pass)."""
    flat = os.path.join(str(USER_MODELS), "datasets.py") + ":flat"
    model = os.path.join(str(USER_MODELS), "bad_models.py") + ":seven_features"
    proc = run_app("train", "--model", model, "--dataset", flat, "--epochs", "1", *QUICK,
                   "--output", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert error_lines(proc.stderr) == [
        f"error: model '{model}' takes samples of shape (7,); dataset '{flat}' gives samples "
        "of shape (8,); allowed: data of shape (7,), or a model whose Input takes (8,) "
        "(tf.keras.Input(shape=input_shape) in the model function takes the data's)"]
    assert not (tmp_path / "run").exists()


def test_an_input_of_several_that_differs_from_its_data_is_named(tmp_path):
    import tensorflow as tf

    import app
    (xtr, ytr), (xva, yva) = _several().arrays()

    def build(num_classes):
        num = tf.keras.Input((5,), name="num")
        ids = tf.keras.Input((3,), name="ids", dtype="int64")
        joined = tf.keras.layers.Concatenate()([num, tf.keras.layers.Flatten()(
            tf.keras.layers.Embedding(50, 4)(ids))])
        return tf.keras.Model({"num": num, "ids": ids},
                              tf.keras.layers.Dense(num_classes)(joined))
    with pytest.raises(UsageError) as caught:
        app.check(model=build, data=((xtr, ytr), (xva, yva)), precision="float32")
    assert caught.value.line().startswith(
        "error: model 'tests.unit.task.test_several_inputs:test_an_input_of_several_that_"
        "differs_from_its_data_is_named.<locals>.build' takes samples of shape (5,) at input "
        "'num'; dataset 'python:arrays' gives samples of shape (8,)"), caught.value.line()


def test_nan_in_one_input_names_its_rows(tmp_path):
    out = tmp_path / "run"
    proc = run_app("train", "--model", f"{SEVERAL}:build", "--dataset",
                   f"{SEVERAL}:nan_arrays", "--precision", "float32", "--epochs", "1",
                   *QUICK, "--output", str(out))
    assert proc.returncode == 3, proc.stderr[-2000:]
    f = json.loads((out / "metrics.json").read_text())["numerics"]["fault"]
    assert f["where"]["kind"] == "input samples" and f["verdict"] == "data"
    assert f["where"]["data"] == "x_train['num']"
    assert (f["where"]["bad_rows"], f["where"]["bad_rows_total"]) == ([100, 300], 2)
    assert set(f["where"]["rows"]) <= {100, 300} and f["where"]["rows"]
    assert "fix: repair or drop rows 100, 300 of x_train['num']" in proc.stderr


def test_check_reads_the_inputs_and_blocks_on_nothing(tmp_path):
    proc = run_app("check", "--model", f"{SEVERAL}:build", "--dataset", f"{SEVERAL}:datasets",
                   "--precision", "float32", "--steps", "3", "--json", str(tmp_path / "c.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(inputs num 8, ids 3, 4 classes)" in proc.stdout
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["data"]["input_shape"] == {"ids": [3], "num": [8]}
    assert report["verdict"] != "blocked", report["findings"]


def test_data_rows_of_a_dict_name_each_input():
    x = {"num": np.zeros((6, 2), np.float32), "ids": np.arange(12).reshape(6, 2)}
    x["num"][4, 1] = np.inf
    rows = DataRows(x, np.arange(6))
    assert rows.nonfinite() == [4] and rows.holding() == "x_train['num']"
    assert rows.data_name == "x_train" and len(rows) == 6
    batch = {k: v[[4, 2]] for k, v in x.items()}
    assert rows.rows_of(batch, np.array([4, 2]), [0, 1]) == [4, 2]
    # a run that reads the first 3 rows still names the NaN in row 4, past them
    read = {k: v[:3] for k, v in x.items()}
    cut = DataRows(read, np.arange(3), unread=unread_rows(x, np.arange(6), 3))
    assert cut.nonfinite() == [4] and len(cut) == 6
    assert unread_rows({"ids": x["ids"]}, np.arange(6), 3) is None   # integers hold no NaN


# ---- text in: strings the model vectorizes itself -------------------------------------------

TEXT = os.path.join(str(USER_MODELS), "text.py")


@pytest.mark.parametrize("loop, form", [("fit", "arrays"), ("custom", "datasets")])
def test_a_text_model_trains_on_strings(tiny_config, loop, form):
    """Keras 2's TextVectorization lists a vocabulary handler among the model's weights: the
    sentinel's end-of-epoch check of the weights crashed on it (no dtype)."""
    from app.training.job import train

    m = train(tiny_config(model=f"{TEXT}:build", dataset=f"{TEXT}:{form}", loop=loop,
                          epochs=6, learning_rate=2e-2))
    assert m["status"] == "completed" and m["data"]["input_shape"] == []
    assert m["epochs"][-1]["val_accuracy"] >= TARGET


def test_check_reads_a_text_model_and_pads_its_vocabulary_up(tmp_path):
    proc = run_app("check", "--model", f"{TEXT}:build", "--dataset", f"{TEXT}:arrays",
                   "--precision", "mixed_float16", "--steps", "2", "--json",
                   str(tmp_path / "c.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    findings = json.loads((tmp_path / "c.json").read_text())["findings"]
    vocabulary = [f for f in findings if "vocabulary size 20" in f["what"]]
    assert vocabulary and "pad it to 24" in vocabulary[0]["fix"], findings   # up, never down


def test_pad_to_tiles_rounds_up():
    from app.precision.policy import pad_to_tiles, round_to_tiles

    assert [pad_to_tiles(n) for n in (1, 8, 20, 50, 57)] == [8, 8, 24, 56, 64]
    assert round_to_tiles(50) == 48   # the nearest, for widths


def test_a_model_of_several_outputs_is_one_line(tmp_path):
    """It died in a traceback from the app's own loss set-up (a dict taken for a tensor)."""
    arrays = os.path.join(str(USER_MODELS), "datasets.py") + ":arrays"
    for command in ("train", "check"):
        out = ["--output", str(tmp_path / "run")] if command == "train" else []
        proc = run_app(command, "--model", f"{SEVERAL}:heads", "--dataset", arrays,
                       "--precision", "float32", *out)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert error_lines(proc.stderr) == [
            f"error: model '{SEVERAL}:heads' returns a dict of 2 output(s) ('classes', "
            "'score'); tfmp trains a model of one output against one label; allowed: a model "
            "whose output is one tensor: return outputs['name'] (or the one head to train) "
            "from the model function"], proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("keyed", [True, False])
def test_inputs_named_otherwise_than_the_data_are_one_line(tmp_path, keyed):
    """The same count of inputs under other names: Keras' "Missing data for input" came as
    'your code raised', exit 1.  A model keyed by a dict is matched by its keys, whatever its
    Input layers are called; a list of Inputs by their names."""
    import tensorflow as tf

    import app
    (xtr, ytr), (xva, yva) = _several().arrays()
    renamed = [{"count": x["num"], "tokens": x["ids"]} for x in (xtr, xva)]

    def build(input_shape, num_classes):
        num = tf.keras.Input((8,), name="num")
        ids = tf.keras.Input((3,), name="ids", dtype="int64")
        joined = tf.keras.layers.Concatenate()([num, tf.keras.layers.Flatten()(
            tf.keras.layers.Embedding(50, 4)(ids))])
        inputs = {"num": num, "ids": ids} if keyed else [num, ids]
        return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(joined))
    with pytest.raises(UsageError) as caught:
        app.train(model=build, data=((renamed[0], ytr), (renamed[1], yva)), epochs=1,
                  precision="float32", output=str(tmp_path / "run"))
    assert "takes inputs named 'ids', 'num'; dataset 'python:arrays' gives 'count', " \
           "'tokens'" in str(caught.value), str(caught.value)
    assert not (tmp_path / "run").exists()
