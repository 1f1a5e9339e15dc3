"""``python -m app check`` and ``app.check``: the mixed-precision doctor on user-like models
(tests/unit/user_models/), on the host's Keras 3 and on TF 2.9.3's Keras 2 alike.

Tiny inputs (8x8x1, batch 8, 2 steps) keep each check to seconds; the in-process tests
share one TensorFlow import, the command-line ones run as a user would (subprocess)."""
from __future__ import annotations

import json
import os
import sys

import pytest

from tests.paths import UNIT, USER_MODELS
from tests.unit.helpers import ONCE_IN_THE_IMAGE, error_lines, run_app

HERE = str(UNIT)  # user_models/ is imported from here
MODELS = str(USER_MODELS)
SMALL = dict(input_shape=(8, 8, 1), batch_size=8, steps=2, verbose=False)
SMALL_FLAGS = ("--input-shape", "8,8,1", "--batch-size", "8", "--steps", "2")


@pytest.fixture(scope="module")
def user_models():
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import importlib

    return lambda name: importlib.import_module(f"user_models.{name}")


def _check(build, **kw):
    from app.doctor.check import check

    args = dict(SMALL)
    args.update(kw)
    return check(build, **args)


def _named(report, check=None, severity=None):
    return {f["layer"] for f in report["findings"]
            if (check is None or f["check"] == check)
            and (severity is None or f["severity"] == severity)}


# ---- in process (app.check) ---------------------------------------------------------------------

def test_policy_aware_custom_layer_is_ready(user_models):
    report = _check(user_models("policy_aware").build)
    assert report["verdict"] == "ready", report["findings"]
    rows = {r["name"]: r for r in report["layers"]}
    assert rows["scaled_shift"]["compute_dtype"] == "float16"
    assert rows["scaled_shift"]["variable_dtype"] == "float32"
    assert rows["scaled_shift"]["output_dtype"] == "float16"
    assert rows["probabilities"]["output_dtype"] == "float32"
    probe = report["probe"]
    assert probe["ran"] and probe["gradients_finite"] and probe["loss"] is not None
    assert 0.0 <= probe["zero_share_scaled"] <= probe["zero_share_unscaled"] <= 1.0
    comp = report["comparison"]
    assert comp["ran"] and comp["steps"] == 2 and comp["same_weights"]
    assert comp["relative_difference_start"] < 0.02
    from app.precision import policy as precision

    assert precision.global_policy_name() == "float32"  # restored


def test_float32_constant_in_call_is_named(user_models):
    report = _check(user_models("float32_constant").build)
    # Keras 2 and Keras 3 (tf ops) stop with a clash; where the dtypes are promoted instead,
    # the layer hands on float32.  Either way the finding names the layer.
    assert "add_offset" in (_named(report, "dtype_clash", "blocker")
                            | _named(report, "not_policy_aware", "warning")), report["findings"]
    clash = [f for f in report["findings"] if f["check"] == "dtype_clash"]
    if clash:
        assert report["verdict"] == "blocked"
        assert "compute_dtype" in clash[0]["fix"]
        assert clash[0]["fix"].endswith("run it in float32: --float32-layers add_offset")
    fixed = _check(user_models("float32_constant").build, float32_layers="add_offset")
    assert fixed["verdict"] != "blocked", fixed["findings"]
    assert fixed["float32_layers"] == ["add_offset"]


def test_float16_softmax_output_is_a_blocker(user_models):
    report = _check(user_models("float16_softmax").build)
    assert report["verdict"] == "blocked"
    blocker = [f for f in report["findings"] if f["check"] == "output_dtype"]
    assert blocker and blocker[0]["layer"] == "class_probs"
    assert "dtype='float32'" in blocker[0]["fix"]


def test_float16_overflow_is_a_blocker_naming_the_first_layer(user_models):
    report = _check(user_models("overflow").build)
    assert report["verdict"] == "blocked"
    assert _named(report, "nonfinite", "blocker") == {"amplify"}
    assert report["probe"]["loss"] is None
    assert not report["comparison"]["ran"]


def test_batch_and_layer_normalization_are_ready(user_models):
    report = _check(user_models("normalized").build)
    assert report["verdict"] == "ready", report["findings"]
    classes = {r["class"]: r for r in report["layers"]}
    assert {"BatchNormalization", "LayerNormalization"} <= set(classes)


def test_dense_widths_not_multiple_of_8_warn_naming_the_layer(user_models):
    report = _check(user_models("wide").build)
    assert report["verdict"] == "ready with warnings"
    warned = _named(report, "tensor_cores", "warning")
    assert "dense_500" in warned
    assert "dense_1000" not in warned   # 1000 = 8 x 125
    # the 10-class output layer is information, not a warning
    assert any(f["check"] == "tensor_cores" and f["severity"] == "info" and "10 units" in f["what"]
               for f in report["findings"])


def test_subclassed_nested_layer_outputs_are_captured(user_models):
    import tensorflow as tf

    report = _check(user_models("subclassed").build, batch_size=12)
    rows = {r["name"]: r for r in report["layers"]}
    assert rows["block/inner_dense"]["output_dtype"] == "float16"
    assert rows["block/upcast"]["output_dtype"] == "float32"
    assert _named(report, "not_policy_aware") == {"block/upcast"}
    assert None in _named(report, "tensor_cores", "warning")  # batch 12
    assert report["verdict"] == "ready with warnings"
    # the wrappers are gone: the layer's call is the class's again
    model = user_models("subclassed").build(3)
    model(tf.zeros((1, 8, 8, 1)))
    assert "call" not in vars(model.block.upcast)


def test_model_built_before_the_policy(user_models):
    import tensorflow as tf

    tf.keras.mixed_precision.set_global_policy("float32")
    prebuilt = user_models("policy_aware").build((8, 8, 1), 10)
    report = _check(prebuilt)
    assert report["verdict"] == "ready with warnings"
    assert any(f["check"] == "float32_layer" and f["layer"] is None and
               "before the policy" in f["what"] for f in report["findings"])
    assert not report["comparison"]["ran"]


def test_nested_model_built_before_the_policy_is_named():
    import tensorflow as tf

    tf.keras.mixed_precision.set_global_policy("float32")
    backbone = tf.keras.Sequential([tf.keras.Input((8, 8, 1)), tf.keras.layers.Flatten(),
                                    tf.keras.layers.Dense(16)], name="pretrained")

    def build(input_shape, num_classes):
        inputs = tf.keras.Input(input_shape)
        x = tf.keras.layers.Dense(16)(backbone(inputs))
        x = tf.keras.layers.Dense(num_classes)(x)
        return tf.keras.Model(inputs, tf.keras.layers.Activation("softmax", dtype="float32")(x))

    report = _check(build)
    assert _named(report, "float32_layer", "warning") == {"pretrained"}, report["findings"]


def test_arrays_as_data_and_json(user_models, tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.random((40, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 4, 40)
    out = tmp_path / "report.json"
    report = _check(user_models("policy_aware").build, data=((x, y), (x[:8], y[:8])),
                    input_shape=None, json_path=str(out))
    assert report["data"]["num_classes"] == 4
    assert json.loads(out.read_text())["verdict"] == report["verdict"] == "ready"


def test_every_nonfinite_row_of_the_data_is_a_blocker_even_rows_check_never_trains_on(
        user_models):
    """check trains on the first batch_size * (steps + 1) rows only; the data are scanned
    whole, so a NaN in row 900 is named before any run meets it."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.random((1000, 8, 8, 1))                 # float64, as users' arrays often are
    y = rng.integers(0, 4, 1000)
    x[900, 3] = np.nan
    report = _check(user_models("policy_aware").build, data=((x, y), (x[:8], y[:8])),
                    input_shape=None, precision="float32")
    (blocker,) = [f for f in report["findings"] if f["severity"] == "blocker"]
    assert (blocker["check"], blocker["what"]) == (
        "data", "1 of the 1000 training rows holds NaN or inf: row 900 of x_train"), blocker
    assert report["data"]["nonfinite_rows"] == [900]
    assert report["comparison"]["ran"] and "stopped_at_step" not in report["comparison"]
    clean = _check(user_models("policy_aware").build, data=((x[:800], y[:800]), (x[:8], y[:8])),
                   input_shape=None, precision="float32")
    assert clean["data"]["nonfinite_rows"] == [] and clean["verdict"] == "ready"
    # A tf.data dataset: the elements check reads (its first batch_size * (steps + 1)).
    import tensorflow as tf

    x[5, 0] = np.inf
    ds = tf.data.Dataset.from_tensor_slices((x.astype("float32"), y))
    val = tf.data.Dataset.from_tensor_slices((x[10:18].astype("float32"), y[10:18]))   # clean
    report = _check(user_models("policy_aware").build, data=(ds, val), input_shape=None,
                    precision="float32")
    data = [f for f in report["findings"] if f["check"] == "data"]
    assert [f["what"] for f in data] == [
        "1 of the first 24 training elements holds NaN or inf: element 5 of the training "
        "dataset"], report["findings"]


def test_unbatched_datasets_as_data(user_models):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(1)
    x = rng.random((24, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 3, 24)
    train = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True)  # size unknown
    val = tf.data.Dataset.from_tensor_slices((x[:8], y[:8]))
    # mixed_float16: a mixed policy every TensorFlow here runs for Conv2D and the normalization
    # layers (TF 2.9 has no bfloat16 convolutions on a CPU without AVX-512).
    report = _check(user_models("normalized").build, data=(train, val), input_shape=None,
                    precision="mixed_float16")
    assert report["verdict"] in ("ready", "ready with warnings"), report["findings"]
    assert not [f for f in report["findings"] if f["severity"] == "blocker"], report["findings"]
    assert report["policy"] == "mixed_float16" and report["data"]["num_classes"] == 3
    assert report["comparison"]["ran"]


# ---- the command line -----------------------------------------------------------------------------

def test_cli_says_what_it_did_to_the_data_as_train_does(tmp_path):
    """A batched tf.data set is taken apart: train says so in a note, and check did not."""
    out = tmp_path / "check.json"
    r = run_app("check", "--model", os.path.join(MODELS, "policy_aware.py") + ":build",
                "--dataset", os.path.join(MODELS, "datasets.py") + ":batched",
                "--precision", "float32", "--batch-size", "8", "--steps", "2", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    said = [ln[len("note: "):] for ln in r.stdout.splitlines() if ln.startswith("note: ")]
    assert "came batched (elements of shape (None, 8, 8, 1))" in said[0], r.stdout[:1500]
    assert "loss: sparse_categorical_crossentropy on probabilities" in said[1]   # the build's
    assert json.loads(out.read_text())["notes"] == said


@ONCE_IN_THE_IMAGE
def test_cli_py_path_ready_with_json(tmp_path):
    out = tmp_path / "check.json"
    r = run_app("check", "--model", os.path.join(MODELS, "policy_aware.py") + ":build",
                *SMALL_FLAGS, "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "verdict: ready" in r.stdout and "scaled_shift" in r.stdout
    assert "(samples of shape 8x8x1, 10 classes)" in r.stdout.splitlines()[0], r.stdout[:300]
    # The steps scale the loss through the optimizer (Keras 2 warned at every step that
    # get_scaled_loss() was never called).
    assert "get_scaled_loss" not in r.stderr, r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["verdict"] == "ready" and data["policy"] == "mixed_float16"
    assert {"layers", "findings", "probe", "comparison", "counts"} <= set(data)
    assert os.listdir(tmp_path) == ["check.json"]  # atomic write: no temporary left


@ONCE_IN_THE_IMAGE
def test_cli_dotted_module_blocked_exit_1(tmp_path):
    r = run_app("check", "--model", "user_models.float16_softmax:build", *SMALL_FLAGS,
                "--precision", "mixed_bfloat16", cwd=HERE)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "verdict: blocked" in r.stdout
    assert "BLOCKER" in r.stdout and "class_probs" in r.stdout


@ONCE_IN_THE_IMAGE
@pytest.mark.parametrize("args, expected", [
    (("--model", "no_such_module_xyz:build"), "no module named 'no_such_module_xyz'"),
    (("--model", os.path.join(MODELS, "policy_aware.py") + ":nope"), "has no 'nope'"),
    (("--model", os.path.join(MODELS, "bad_models.py") + ":needs_depth"), "'depth'"),
    (("--model", os.path.join(MODELS, "bad_models.py") + ":not_a_model"), "not a keras.Model"),
    (("--model", "mlp", "--precision", "fp8"), "precision must be one of"),
    (("--model", os.path.join(MODELS, "policy_aware.py") + ":build"), "--input-shape"),
    (("--model", "mlp", "--seed", "-1"), "seed must be an integer from 0 to 2**32 - 1. "
                                         "Received: seed=-1; allowed: an integer from 0 to "),
])
def test_cli_bad_input_one_line_exit_2(tmp_path, args, expected):
    out = tmp_path / "check.json"
    flags = list(args)
    if "--input-shape" not in expected:
        flags += ["--input-shape", "8,8,1"]
    r = run_app("check", *flags, "--batch-size", "8", "--steps", "1", "--json", str(out),
                cwd=str(tmp_path))
    assert r.returncode == 2, (r.stdout, r.stderr[-2000:])
    lines = error_lines(r.stderr)
    assert len(lines) == 1 and expected in lines[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert os.listdir(tmp_path) == []  # nothing written


def test_check_help_states_its_defaults():
    r = run_app("check", "--help")
    assert r.returncode == 0
    assert "default mixed_float16" in r.stdout and "(default: None)" not in r.stdout


def test_a_report_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    """--json into a folder the user cannot write (a read-only mount): one line before the
    check runs; a write that fails after it (the disk filled) is one line too."""
    import argparse

    from app.commands import check as command
    from app.core.errors import UsageError

    args = argparse.Namespace(precision="float32", batch_size=8, steps=1, seed=0,
                              float32_layers=None, json=str(tmp_path / "c.json"), model="mlp",
                              dataset=None, loss=None, metrics=None, input_shape=None,
                              num_classes=None)
    monkeypatch.setattr(command.os, "access", lambda path, mode: False)
    with pytest.raises(UsageError) as info:
        command.run(args)
    assert info.value.line() == (f"error: --json {args.json!r}: the folder {str(tmp_path)!r} "
                                 "denies writing; allowed: a file path in a folder you can write")
    monkeypatch.undo()

    def full(path, doc):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("app.core.files.write_json_atomic", full)
    with pytest.raises(UsageError) as info:
        command.run(args)
    assert "the report could not be written (No space left on device)" in info.value.line()
    assert "verdict:" in capsys.readouterr().out   # the report itself was printed


def test_json_dash_prints_the_json_alone_on_stdout(tmp_path):
    """`--json -`: a program reads stdout (`| jq`), the person stderr; nothing is written."""
    r = run_app("check", "--model", os.path.join(MODELS, "policy_aware.py") + ":build",
                *SMALL_FLAGS, "--precision", "float32", "--json", "-", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["verdict"] == "ready" and report["policy"] == "float32"
    assert "verdict: ready" in r.stderr
    assert os.listdir(tmp_path) == []


def test_json_replaces_an_earlier_report_and_nothing_else(tmp_path):
    """A slip like `--json model.py` must not eat the model: one line, exit 2, before
    TensorFlow; an earlier report (or an empty file) may be replaced."""
    import argparse

    from app.commands import check as command
    from app.core.errors import UsageError

    model = tmp_path / "model.py"
    model.write_text("def build(shape, n):\n    pass\n")
    notes = tmp_path / "notes.json"
    notes.write_text('{"verdict": "mine"}')
    link = tmp_path / "link.json"
    link.symlink_to(model)
    for path in (model, notes, link):
        args = argparse.Namespace(precision="float32", batch_size=8, steps=1, seed=0,
                                  float32_layers=None, json=str(path))
        with pytest.raises(UsageError) as info:
            command.run(args)
        assert info.value.line() == (
            f"error: --json {str(path)!r}: the file exists and is not a report of tfmp check, "
            "so it is left as it is; allowed: a new file name, an earlier check report to "
            "replace, or '-' for stdout")
    assert model.read_text() == "def build(shape, n):\n    pass\n"
    assert notes.read_text() == '{"verdict": "mine"}'
    earlier = tmp_path / "check.json"
    earlier.write_text(json.dumps({"schema_version": 1, "verdict": "ready", "findings": []}))
    empty = tmp_path / "empty.json"
    empty.write_text("")
    for path in (earlier, empty, tmp_path / "new.json"):
        command._check_json_path(str(path))   # no error
