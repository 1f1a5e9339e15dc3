"""``--float32-layers``: the layers named run in float32, the rest of the model under the
policy, without editing the model; on Keras' own MobileNetV2 (32x32x3, no weights), whose
classifier 'predictions' is a float16 softmax under mixed_float16.  Host (Keras 3) and the
image's TF 2.9.3 (Keras 2) alike.

The model is built once per module through the task (``Task.build``: the seam train, check,
tune and the benchmark's runs share); one short run trains it in process (``app.train``),
one ``tfmp train --resume`` continues it without the flag."""
from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys

import pytest

from tests.paths import USER_MODELS as _USER_MODELS
from tests.unit.helpers import ONCE_IN_THE_IMAGE

# The checkout whose app this interpreter imports (PYTHONPATH on the host, the installed
# package in the image): the command-line runs use the same.
APP_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(importlib.import_module("app").__file__)))
USER_MODELS = str(_USER_MODELS)
MOBILENET = os.path.join(USER_MODELS, "keras_applications.py") + ":mobilenet_v2"
SOFTMAX16 = os.path.join(USER_MODELS, "float16_softmax.py") + ":build"
MOBILENET_FLAGS = ("--model", MOBILENET, "--dataset", "synthetic", "--input-shape", "32,32,3",
                   "--num-classes", "10", "--precision", "mixed_float16", "--batch-size", "4",
                   "--max-train-samples", "8", "--max-val-samples", "4", "--offline",
                   "--progress", "lines", "--log-every", "1")


def run_app(*args, env=None, timeout=300):
    """``python -m app ...`` as a user runs it: this checkout's app, no TFMP_ variables but
    those given."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("TFMP_")}
    full["PYTHONPATH"] = APP_PARENT + os.pathsep + full.get("PYTHONPATH", "")
    full.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True,
                          timeout=timeout, env=full, cwd=APP_PARENT)


def errors(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.fixture
def policy_kept():
    from app.precision import policy as prec

    before = prec.global_policy_name()
    yield
    prec.apply_policy(before)


# ---- the names (no TensorFlow) ------------------------------------------------------------

def test_names_are_read_from_a_comma_list_or_a_list():
    from app.task.float32_layers import flag, parse

    assert parse("predictions, block_16_project ,predictions") == ("predictions",
                                                                   "block_16_project")
    assert parse(["outer/inner", "/predictions/"]) == ("outer/inner", "predictions")
    assert parse(None) == () and parse("") == () and parse("  ") == ()
    assert flag(["predictions", "outer/inner"]) == "--float32-layers predictions,outer/inner"


@pytest.mark.parametrize("value", ["a,,b", ",", ["a", ""], 3, ["a", 3]])
def test_a_bad_list_is_one_usage_error(value):
    from app.core.errors import UsageError
    from app.task.float32_layers import parse

    with pytest.raises(UsageError) as info:
        parse(value)
    assert "float32_layers" in info.value.line() and "\n" not in info.value.line()
    assert "allowed: comma-separated layer names" in info.value.line()


def test_flag_then_variable_then_none():
    from app.training.config import resolve_config

    env = {"TFMP_FLOAT32_LAYERS": "predictions, Conv1"}
    assert resolve_config({}, env).float32_layers == "predictions,Conv1"
    assert resolve_config({"float32_layers": ["head"]}, env).float32_layers == "head"
    assert resolve_config({}, {}).float32_layers is None   # not given: --resume keeps the run's


def test_a_bad_variable_is_one_line_and_exit_2_before_tensorflow(tmp_path):
    proc = run_app("train", "--output", str(tmp_path / "run"),
                   env={"TFMP_FLOAT32_LAYERS": "predictions,,Conv1"}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert errors(proc.stderr) == [
        "error: TFMP_FLOAT32_LAYERS has an empty layer name. Received: "
        "TFMP_FLOAT32_LAYERS='predictions,,Conv1'; allowed: comma-separated layer names of the "
        "model: a layer's full path (outer/inner for a layer of a nested model or layer) or "
        "its last parts, such as its plain name (every layer that has them), e.g. "
        "predictions,norm"]
    assert not (tmp_path / "run").exists()


def test_every_command_that_builds_the_model_takes_the_flag_and_passes_it_on():
    from app.cli import build_parser
    from app.core import settings
    from app.tuner.runner import verification_command

    parser = build_parser()
    for command in ("train", "check", "benchmark", "tune"):
        args = parser.parse_args([command, "--model", "mlp", "--dataset", "synthetic",
                                  "--float32-layers", "predictions"])
        assert args.float32_layers == "predictions", command
    # benchmark's runs and tune's verification run are `tfmp train` children
    assert settings.passed_flags({"float32_layers": "predictions"}) == [
        "--float32-layers", "predictions"]
    cmd = verification_command({"model": "mlp", "dataset": "synthetic", "policy": "float32",
                                "batch_size": 8, "steps": 2, "float32_layers": "predictions"},
                               "out")
    assert cmd[cmd.index("--float32-layers") + 1] == "predictions"


# ---- MobileNetV2, built once ---------------------------------------------------------------

@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """MobileNetV2 built by the task under mixed_float16 with --float32-layers predictions."""
    from app.precision import policy as prec
    from app.task.task import Task

    before = prec.global_policy_name()
    prec.apply_policy("mixed_float16")
    try:
        task = Task.from_specs(MOBILENET, "synthetic", input_shape=(32, 32, 3), num_classes=10,
                               float32_layers="predictions")
        bundle = task.load_data(8, str(tmp_path_factory.mktemp("data")), max_train_samples=16,
                                max_val_samples=8, offline=True)
        built = task.build(bundle, bundle.sample_batch)
    finally:
        prec.apply_policy(before)
    return built, bundle


def _dtypes(model, run) -> dict:
    """{layer path: output dtype} of the layers ``run()`` calls (traced or eager)."""
    from app.doctor import probe
    from app.task import model_layers

    with probe.capture(model_layers.walk(model)) as captured:
        run()
    return {c["path"]: c["dtype"] for c in captured.values()}


@pytest.mark.slow
def test_the_named_layer_computes_in_float32_and_the_rest_in_float16(fixed):
    import tensorflow as tf

    from app.precision.layer_policy import policy_name
    from app.task import model_layers

    built, bundle = fixed
    model = built.model
    assert built.float32_layers == ["predictions"]
    policies = {p: policy_name(l) for p, l, _ in model_layers.walk(model)}
    assert policies.pop("predictions") == "float32"
    assert set(policies.values()) == {"mixed_float16"}, policies
    assert any("--float32-layers: predictions compute in float32" in n for n in built.notes)
    assert built.warnings == []     # no "the model's output is float16" any more
    x, y = bundle.sample_batch

    step = tf.function(lambda x: model(x, training=True))
    traced = _dtypes(model, lambda: step(x))
    assert traced["predictions"] == "float32"
    pooling = next(p for p, l, _ in model_layers.walk(model)   # its automatic name may be
                   if type(l).__name__ == "GlobalAveragePooling2D")  # numbered (build order)
    assert traced[pooling] == "float16"   # the layer before: unchanged
    assert traced["Conv1"] == "float16"
    assert step(x).dtype == tf.float32

    model.compile(optimizer=tf.keras.optimizers.SGD(1e-3),
                  loss="sparse_categorical_crossentropy")
    fitted = _dtypes(model, lambda: model.fit(x, y, epochs=1, verbose=0))
    assert fitted["predictions"] == "float32" and fitted["out_relu"] == "float16"


def test_an_unknown_name_names_the_closest_layers(fixed):
    from app.core.errors import UsageError
    from app.task.float32_layers import resolve

    with pytest.raises(UsageError) as info:
        resolve(fixed[0].model, ["predicton"], "nets.py:build")
    line = info.value.line()
    assert "\n" not in line
    assert line.startswith("error: --float32-layers 'predicton': model 'nets.py:build' has no "
                           "layer of that name; the closest of its ")
    assert "layers: predictions;" in line


def test_nested_layers_by_path_and_a_name_several_layers_have(policy_kept):
    import tensorflow as tf

    from app.precision import policy as prec
    from app.precision.layer_policy import policy_name
    from app.task.float32_layers import apply

    def build():
        return tf.keras.Sequential([
            tf.keras.Input(shape=(4,)),
            tf.keras.Sequential([tf.keras.layers.Dense(8, name="head")], name="a"),
            tf.keras.Sequential([tf.keras.layers.Dense(8, name="head"),
                                 tf.keras.layers.Dense(2, name="tail")], name="b"),
        ])

    prec.apply_policy("mixed_float16")
    model = build()   # a plain name two layers have names both: the same layer in two blocks
    assert apply(model, ["head"], "nets.py:build") == (model, ["a/head", "b/head"])
    seen = _dtypes(model, lambda: model(tf.ones((2, 4))))
    assert (seen["a/head"], seen["b/head"], seen["b/tail"]) == ("float32", "float32", "float16")
    model = build()
    assert apply(model, ["b/head"], "nets.py:build") == (model, ["b/head"])
    seen = _dtypes(model, lambda: model(tf.ones((2, 4))))
    assert (seen["a/head"], seen["b/head"], seen["b/tail"]) == ("float16", "float32", "float16")
    model = build()
    assert apply(model, ["a"], "nets.py:build") == (model, ["a"])   # a nested model: all of it
    assert policy_name(model.get_layer("a").get_layer("head")) == "float32"
    assert policy_name(model.get_layer("b").get_layer("head")) == "mixed_float16"


def test_a_layer_with_16_bit_variables_is_made_again_in_float32_with_its_weights(policy_kept):
    """Keras 2's Normalization (EfficientNet's 'normalization') makes its variables in its
    compute dtype: float16 under mixed_float16; so does dtype='float16'.  A built layer keeps
    its variables, so the model is cloned with that layer made again in float32, every
    weight carried over, and it trains."""
    import numpy as np
    import tensorflow as tf

    from app.precision import policy as prec
    from app.precision.layer_policy import policy_name
    from app.task.float32_layers import apply

    prec.apply_policy("mixed_float16")
    inputs = tf.keras.Input(shape=(3,))
    x = tf.keras.layers.Dense(4, dtype="float16", name="half")(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(2, name="out")(x))
    fixed, paths = apply(model, ["out", "half"], "nets.py:build")
    assert paths == ["out", "half"] and fixed is not model
    half = fixed.get_layer("half")
    assert policy_name(half) == "float32" and policy_name(fixed.get_layer("out")) == "float32"
    assert {w.dtype.name if hasattr(w.dtype, "name") else w.dtype for w in half.weights} == \
        {"float32"}
    for old, new in zip(model.weights, fixed.weights):
        np.testing.assert_array_equal(new.numpy(), old.numpy().astype(np.float32))
    assert policy_name(model.get_layer("out")) == "mixed_float16"   # the original as it was
    x, y = np.ones((8, 3), np.float32), np.zeros((8,), np.int64)
    fixed.compile(optimizer="sgd",
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    fixed.fit(x, y, epochs=1, verbose=0)
    assert fixed(x).dtype == tf.float32


def test_a_16_bit_layer_that_cannot_be_made_again_is_one_line(policy_kept):
    """A subclassed model is no graph of layers to clone: one line, nothing half-done."""
    import tensorflow as tf

    from app.core.errors import UsageError
    from app.precision import policy as prec
    from app.precision.layer_policy import policy_name
    from app.task.float32_layers import apply

    prec.apply_policy("mixed_float16")

    class Net(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.half = tf.keras.layers.Dense(4, dtype="float16", name="half")
            self.out = tf.keras.layers.Dense(2, name="out")

        def call(self, x):
            return self.out(self.half(x))
    model = Net()
    model(tf.ones((1, 3)))
    with pytest.raises(UsageError) as info:
        apply(model, ["out", "half"], "nets.py:Net")
    assert info.value.line() == (
        "error: --float32-layers 'half': model 'nets.py:Net' made that layer's variables "
        "float16 (in its 16-bit dtype, when the model was built), and the model cannot be "
        "made again with them in float32 (a subclassed model); allowed: the layers after it "
        "(such as the output layer); or give that layer dtype='float32' where the model is "
        "built")
    assert policy_name(model.out) == "mixed_float16"   # nothing half-done


# ---- check: the flag in its fix, no blocker on the fixed model ---------------------------------

def test_check_prints_the_flag_and_the_fixed_model_has_no_blocker(policy_kept):
    from app.doctor.check import check

    small = dict(input_shape=(8, 8, 1), batch_size=8, steps=1, verbose=False)
    report = check(SOFTMAX16, **small)
    blocker = [f for f in report["findings"] if f["check"] == "output_dtype"]
    assert [f["layer"] for f in blocker] == ["class_probs"]
    assert blocker[0]["fix"].startswith("run it in float32 without editing the model: "
                                        "--float32-layers class_probs; or ")
    fixed = check(SOFTMAX16, float32_layers="class_probs", **small)
    assert fixed["verdict"] != "blocked", fixed["findings"]
    assert fixed["float32_layers"] == ["class_probs"]


@pytest.mark.slow
def test_the_flag_check_prints_makes_check_ready_with_automatic_names():
    """Copied from check's output, as a user does: the model's automatic layer names are
    those of a fresh process, as in `tfmp train` (check's float32 comparison builds the
    model a second time: Keras numbers that build's names on)."""
    spec = SOFTMAX16.replace(":build", ":unnamed")
    small = ("--model", spec, "--input-shape", "8,8,1", "--batch-size", "8", "--steps", "1")
    first = run_app("check", *small)
    assert first.returncode == 1, first.stdout + first.stderr     # blocked
    fix = re.search(r"fix: run it in float32 without editing the model: (--float32-layers "
                    r"(\S+));", first.stdout)
    assert fix and fix.group(2) == "dense_1", first.stdout
    fixed = run_app("check", *small, *fix.group(1).split())
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "float32 layers (--float32-layers): dense_1" in fixed.stdout
    assert "BLOCKER" not in fixed.stdout


def test_an_automatically_numbered_name_says_why_it_may_differ(policy_kept):
    import tensorflow as tf

    from app.core.errors import UsageError
    from app.task.float32_layers import resolve

    model = tf.keras.Sequential([tf.keras.Input(shape=(3,)), tf.keras.layers.Dense(2),
                                 tf.keras.layers.Dense(2)])
    with pytest.raises(UsageError) as info:
        resolve(model, ["dense_9999"], "nets.py:build")
    assert "Keras numbers automatic layer names on in a process that built the model before" \
        in info.value.line()


@ONCE_IN_THE_IMAGE
@pytest.mark.slow
def test_check_on_mobilenet_with_the_flag_has_no_blocker(policy_kept):
    from app.doctor.check import check

    report = check(MOBILENET, input_shape=(32, 32, 3), num_classes=10, batch_size=8, steps=1,
                   float32_layers=["predictions"], verbose=False)
    assert report["verdict"] != "blocked", [f for f in report["findings"]
                                            if f["severity"] == "blocker"]
    assert not [f for f in report["findings"] if f["check"] in ("output_dtype", "softmax_16bit")]
    row = next(r for r in report["layers"] if r["name"] == "predictions")
    assert (row["compute_dtype"], row["output_dtype"]) == ("float32", "float32")
    assert {"severity": "info", "check": "float32_layer", "layer": "predictions",
            "what": "computes in float32 under mixed_float16, as --float32-layers asks",
            "fix": None} in report["findings"]


# ---- a layer that fails in 16 bits while the model function builds the model -----------------

CONSTANT = os.path.join(USER_MODELS, "float32_constant.py")
SMALL_RUN = dict(data="synthetic", precision="mixed_float16", epochs=1, input_shape=(8,),
                 num_classes=4, batch_size=16, max_train_samples=64, max_val_samples=16,
                 offline=True, progress="lines", save_model=False)


def test_a_layer_that_fails_while_the_model_is_built_trains_with_the_flag(tmp_path, capsys,
                                                                          policy_kept):
    """float32_constant.py's AddOffset adds a float32 constant to its 16-bit input: Keras
    stops the functional model's construction, inside the model function, before there is a
    model to give a policy.  The one line names the flag; with it the layer computes in
    float32 from its first call and the run trains."""
    import app
    from app.core.errors import MixedPrecisionClash

    with pytest.raises(MixedPrecisionClash) as info:
        app.train(model=CONSTANT + ":build", output=str(tmp_path / "plain"),
                  workspace=str(tmp_path / "ws"), **SMALL_RUN)
    assert info.value.line().startswith("error: layer 'add_offset' (AddOffset, compute dtype "
                                        "float16) in model "), info.value.line()
    assert info.value.line().endswith("; or, without editing the model, run it in float32: "
                                      "--float32-layers add_offset"), info.value.line()
    metrics = app.train(model=CONSTANT + ":build", output=str(tmp_path / "fixed"),
                        workspace=str(tmp_path / "ws"), float32_layers="add_offset", **SMALL_RUN)
    assert metrics["status"] == "completed"
    assert metrics["task"]["float32_layers"] == ["add_offset"]
    assert "note: --float32-layers: add_offset compute in float32, the rest of the model " \
        "under the policy" in capsys.readouterr().err


def test_a_layer_of_layers_named_reaches_those_it_makes_in_init_and_in_build(policy_kept):
    """``nested``: the clash sits in layers that 'block' makes in ``__init__`` and in
    ``build``; naming 'block' runs all of them in float32, and only them."""
    from app.doctor.check import check

    small = dict(input_shape=(8,), num_classes=4, batch_size=8, steps=1, verbose=False)
    blocked = check(CONSTANT + ":nested", **small)
    clash = [f for f in blocked["findings"] if f["check"] == "dtype_clash"]
    assert [f["layer"] for f in clash] == ["inner_offset"], blocked["findings"]
    assert clash[0]["fix"].endswith("--float32-layers inner_offset")
    fixed = check(CONSTANT + ":nested", float32_layers="block", **small)
    assert fixed["verdict"] != "blocked", fixed["findings"]
    rows = {r["name"]: r["compute_dtype"] for r in fixed["layers"]}
    assert {name: rows[name] for name in ("block", "block/inner_offset", "block/inner_dense",
                                          "block/late_offset", "hidden")} == \
        {"block": "float32", "block/inner_offset": "float32", "block/inner_dense": "float32",
         "block/late_offset": "float32", "hidden": "float16"}, rows


def test_a_path_reaches_a_layer_that_fails_inside_one_of_two_layers_of_layers(policy_kept):
    """``twice``: two Shift layers, each holding a faulty 'offset'.  The paths reach them as
    the model function wires the model, by the calls under way; the plain name that check's
    fix gives reaches both."""
    from app.doctor.check import check

    small = dict(input_shape=(8,), num_classes=4, batch_size=8, steps=1, verbose=False)
    for names in ("shift_a/offset,shift_b/offset", "offset"):
        fixed = check(CONSTANT + ":twice", float32_layers=names, **small)
        assert fixed["verdict"] != "blocked", (names, fixed["findings"])
        rows = {r["name"]: r["compute_dtype"] for r in fixed["layers"]}
        assert [rows[n] for n in ("shift_a/offset", "shift_b/offset", "shift_a", "hidden")] == \
            ["float32", "float32", "float16", "float16"], (names, rows)


def test_a_layer_of_a_nested_functional_model_takes_its_path_and_its_name(policy_kept):
    """``sub_models``: sub_a's faulty 'offset' is called as sub_a is made, before sub_a has
    a name.  Its path still reaches it (made float32 provisionally, as is every layer named
    'offset' then; sub_b's, which the path does not name, goes back to float16), and so does
    the plain name the clash's fix gives (both layers called 'offset')."""
    from app.doctor.check import check

    small = dict(input_shape=(8,), num_classes=4, batch_size=8, steps=1, verbose=False)
    blocked = check(CONSTANT + ":sub_models", **small)
    clash = [f for f in blocked["findings"] if f["check"] == "dtype_clash"]
    assert [f["layer"] for f in clash] == ["offset"], blocked["findings"]
    assert clash[0]["fix"].endswith("--float32-layers offset")
    expected = {"sub_a/offset": ["float32", "float16"], "offset": ["float32", "float32"]}
    for names, dtypes in expected.items():
        fixed = check(CONSTANT + ":sub_models", float32_layers=names, **small)
        assert fixed["verdict"] != "blocked", (names, fixed["findings"])
        rows = {r["name"]: r["compute_dtype"] for r in fixed["layers"]}
        assert [rows[n] for n in ("sub_a/offset", "sub_b/offset", "hidden")] == \
            dtypes + ["float16"], (names, rows)


def test_the_wrapped_call_is_in_force_only_while_the_model_function_runs(policy_kept):
    """The steps run Keras' own ``Layer.__call__``.  A layer whose name ends a path, called
    outside the layers the path names (as a nested functional model's layers are), runs as
    it is; when that fails it is made float32 provisionally, and ``apply`` decides."""
    import tensorflow as tf

    from app.precision import policy as prec
    from app.precision.layer_policy import policy_name
    from app.task.float32_layers import apply, while_building

    class Faulty(tf.keras.layers.Layer):   # fails in 16 bits, runs in float32
        def call(self, x):
            return x + tf.constant(0.5)

    class Broken(tf.keras.layers.Layer):   # fails in any dtype
        def call(self, x):
            raise ValueError("broken in every dtype")

    prec.apply_policy("mixed_float16")
    plain_call = tf.keras.layers.Layer.__dict__["__call__"]
    names = ["late", "outer/inner", "outer/fine", "outer/broken"]
    with while_building(names) as provisional:
        assert tf.keras.layers.Layer.__dict__["__call__"] is not plain_call
        early = tf.keras.layers.Dense(2, name="late")
        inner = Faulty(name="inner")
        fine = tf.keras.layers.Dense(2, name="fine")
        other = tf.keras.layers.Dense(2, name="other")
        for layer in (early, inner, fine, other):
            layer(tf.ones((1, 3)))
        broken = Broken(name="broken")
        with pytest.raises(ValueError, match="broken in every dtype"):
            broken(tf.ones((1, 3)))
    assert tf.keras.layers.Layer.__dict__["__call__"] is plain_call
    assert [policy_name(layer) for layer in (early, inner, fine, other, broken)] == \
        ["float32", "float32", "mixed_float16", "mixed_float16", "mixed_float16"]
    assert provisional == [(inner, "mixed_float16")]   # 'inner' may be another model's
    model = tf.keras.Sequential([early, inner])
    assert apply(model, ["late"], "m.py:f", provisional) == (model, ["late"])
    assert policy_name(inner) == "mixed_float16"
    with pytest.raises(ZeroDivisionError):
        with while_building(["late"]):
            1 / 0
    assert tf.keras.layers.Layer.__dict__["__call__"] is plain_call
    later = tf.keras.layers.Dense(2, name="late")
    later(tf.ones((1, 3)))
    assert policy_name(later) == "mixed_float16"


# ---- train and --resume ----------------------------------------------------------------------

def test_an_unknown_name_from_the_variable_names_the_variable(tmp_path):
    """The QA pass: TFMP_FLOAT32_LAYERS=zzz was refused as "--float32-layers 'zzz'", a flag
    the user never passed (tests/unit/training/test_late_refusals.py: app.train's words)."""
    spec = f"{USER_MODELS}/models_misc.py:hidden_logits"
    out = tmp_path / "run"
    proc = run_app("train", "--model", spec, "--dataset", f"{USER_MODELS}/datasets.py:tiny_bits",
                   "--precision", "float32", "--epochs", "1", "--output", str(out),
                   env={"TFMP_FLOAT32_LAYERS": "zzz"}, timeout=180)
    assert proc.returncode == 2, proc.stderr
    line, = errors(proc.stderr)
    assert line.startswith(f"error: TFMP_FLOAT32_LAYERS 'zzz': model '{spec}' has no "
                           "layer of that name"), line
    assert not out.exists()


@pytest.mark.slow
def test_train_unknown_name_is_one_line_exit_2_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    proc = run_app("train", *MOBILENET_FLAGS, "--epochs", "1", "--output", str(out),
                   "--workspace", str(tmp_path / "ws"), "--float32-layers", "predicton")
    assert proc.returncode == 2, proc.stderr
    line, = errors(proc.stderr)
    assert line.startswith("error: --float32-layers 'predicton': model ") and \
        "the closest of its 155 layers: predictions;" in line, line
    assert "Traceback" not in proc.stderr
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.host_only(reason="MobileNetV2's SavedModel save and load under Keras 2 take ~90 s "
                              "of CI; the image checks the policy in the step and in check")
def test_training_and_resume_keep_the_float32_layer(tmp_path, capsys, policy_kept):
    import tensorflow as tf

    import app

    out, ws = tmp_path / "run", tmp_path / "ws"
    metrics = app.train(model=MOBILENET, data="synthetic", precision="mixed_float16", epochs=1,
                        output=str(out), workspace=str(ws), float32_layers=["predictions"],
                        input_shape=(32, 32, 3), num_classes=10, batch_size=4,
                        max_train_samples=8, max_val_samples=4, offline=True,
                        progress="lines", log_every=1, save_model=False)
    said = capsys.readouterr().err
    assert metrics["status"] == "completed"
    assert metrics["config"]["float32_layers"] == "predictions"
    assert metrics["task"]["float32_layers"] == ["predictions"]
    assert "warning: the model's output" not in said
    assert "note: --float32-layers: predictions compute in float32" in said

    # The same command without the flag continues the run as it was trained.
    proc = run_app("train", *MOBILENET_FLAGS, "--epochs", "2", "--output", str(out),
                   "--workspace", str(ws), "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "note: --resume keeps the run's float32 layers (--float32-layers predictions)" \
        in proc.stderr
    assert "warning: the model's output" not in proc.stderr
    resumed = json.loads((out / "metrics.json").read_text())
    assert [e["epoch"] for e in resumed["epochs"]] == [1, 2]
    assert resumed["config"]["float32_layers"] == "predictions"
    assert resumed["task"]["float32_layers"] == ["predictions"]

    # The saved model keeps each layer's policy (Keras' own format: model.keras or model/).
    saved = tf.keras.models.load_model(resumed["model_path"], compile=False)
    from app.precision.layer_policy import policy_name

    assert policy_name(saved.get_layer("predictions")) == "float32"
    assert policy_name(saved.get_layer("out_relu")) == "mixed_float16"
    assert saved(tf.zeros((1, 32, 32, 3))).dtype == tf.float32


def test_resume_with_other_float32_layers_uses_them_and_says_so(capsys):
    from app.task.task import Task
    from app.training.config import TrainConfig
    from app.training.resuming import resumed_float32_layers

    previous = {"task": {"model": "mlp", "dataset": "synthetic", "float32_layers": ["out"]}}
    task = Task.from_specs("mlp", "synthetic", float32_layers="dense,out")
    cfg, kept = resumed_float32_layers(TrainConfig(float32_layers="dense,out"), task, previous)
    assert cfg.float32_layers == "dense,out" and kept.float32_layers == ("dense", "out")
    assert "note: the run was trained with float32 layers out; it continues with dense,out" \
        in capsys.readouterr().err
    cfg, kept = resumed_float32_layers(TrainConfig(), Task.from_specs("mlp", "synthetic"),
                                       previous)
    assert cfg.float32_layers == "out" and kept.float32_layers == ("out",)
