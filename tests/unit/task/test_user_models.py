"""Your own model and data (issue 9): the files in user_models/ trained for real, as a user
would, through the CLI (``--model file.py:build``, ``--model pkg.module:build``) and the
Python API (``app.train``); every spec error is one line, exit 2, nothing written."""
import json
import os
import signal
import subprocess
import sys

import pytest

from tests.paths import ROOT, UNIT, USER_MODELS
from tests.unit.helpers import ONCE_IN_THE_IMAGE, error_lines, run_app

HERE = str(UNIT)  # user_models/ is imported from here
USER = str(USER_MODELS)
AWARE = os.path.join(USER, "policy_aware.py") + ":build"
ARRAYS = os.path.join(USER, "datasets.py") + ":arrays"
UNKNOWN = os.path.join(USER, "datasets.py") + ":unknown_size"
MISC = os.path.join(USER, "models_misc.py")
TARGET = 0.9
QUICK = ["--batch-size", "32", "--progress", "lines", "--offline", "--no-save-model",
         "--log-every", "4"]


def _metrics(out):
    return json.loads((out / "metrics.json").read_text())


# ---- training for real ---------------------------------------------------------------------

@pytest.mark.parametrize("loop", ["fit", "custom"])
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_user_model_and_arrays_train_in_both_loops(tiny_config, tmp_path, policy, loop):
    from app.training.job import train

    epochs = 4 if policy == "mixed_float16" else 3
    m = train(tiny_config(model=AWARE, dataset=ARRAYS, precision=policy, loop=loop,
                     epochs=epochs, learning_rate=3e-3))
    assert m["status"] == "completed"
    assert m["precision"]["policy"] == policy
    assert m["task"]["model"] == AWARE and m["task"]["model_source"].endswith("policy_aware.py")
    assert m["data"] == {"train_samples": 512, "val_samples": 128, "input_shape": [8, 8, 1],
                         "num_classes": 4, "label_kind": "sparse"}
    assert m["epochs"][-1]["val_accuracy"] >= TARGET
    if policy == "mixed_float16":
        assert m["epochs"][-1]["loss_scale"] > 1.0


def test_a_batched_tf_data_set_is_taken_apart_and_batched_at_the_global_batch(tiny_config,
                                                                              capsys):
    """Keras' own loaders (image_dataset_from_directory, ...) give batches: refused before,
    as "return it unbatched"."""
    from app.training.job import train

    m = train(tiny_config(model=AWARE, dataset=os.path.join(USER, "datasets.py") + ":batched",
                          precision="float32", epochs=5, learning_rate=3e-3, batch_size=64))
    assert m["status"] == "completed" and m["epochs"][-1]["val_accuracy"] >= TARGET
    assert m["data"]["train_samples"] == 512 and m["data"]["input_shape"] == [8, 8, 1]
    assert m["steps"][-1]["step"] == 5 * 8   # 512 samples at the global batch, 64 (not 32)
    assert "came batched (elements of shape (None, 8, 8, 1)): its batches are taken apart" \
        in capsys.readouterr().err


def test_dotted_module_and_unknown_size_tf_data(tmp_path):
    out = tmp_path / "run"
    proc = run_app("train", "--model", "user_models.policy_aware:build",
                   "--dataset", "user_models.datasets:unknown_size", "--precision", "float32",
                   "--epochs", "3", "--learning-rate", "3e-3", *QUICK, "--output", str(out),
                   cwd=HERE)
    assert proc.returncode == 0, proc.stderr
    m = _metrics(out)
    assert m["data"]["train_samples"] == 512     # counted: tf.data could not know
    assert m["epochs"][-1]["val_accuracy"] >= TARGET
    assert m["epochs"][-1]["samples_per_second"] > 0


@pytest.mark.bf16_kernels("Conv2D", "BatchNormalization", "LayerNormalization", "Dense")
def test_functional_model_with_batch_and_layer_normalization(tiny_config):
    from app.training.job import train

    m = train(tiny_config(model=os.path.join(USER, "normalized.py") + ":build", dataset=ARRAYS,
                     precision="mixed_bfloat16", epochs=3, learning_rate=3e-3))
    assert m["status"] == "completed" and m["epochs"][-1]["val_accuracy"] >= TARGET


def test_compiled_model_brings_optimizer_loss_and_metrics(tiny_config, tmp_path, capsys):
    from app.training.job import train

    m = train(tiny_config(model=MISC + ":compiled", dataset=ARRAYS, precision="float32",
                     epochs=3, loop="custom"))
    assert m["status"] == "completed" and m["epochs"][-1]["val_accuracy"] >= TARGET
    err = capsys.readouterr().err
    assert "the model came compiled: its optimizer, loss, metrics are used" in err
    assert m["epochs"][-1]["learning_rate"] == pytest.approx(0.05)   # SGD(0.05), not Adam


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_loss_and_metrics_flags_take_keras_names_and_user_objects(tiny_config, loop):
    from app.training.job import train

    m = train(tiny_config(model=AWARE, dataset=ARRAYS, loop=loop, precision="float32",
                          epochs=2, learning_rate=3e-3, loss="sparse_categorical_crossentropy",
                          metrics=f"accuracy,{MISC}:top2"))
    last = m["epochs"][-1]
    assert m["task"]["loss"] == "sparse_categorical_crossentropy"
    assert m["task"]["metrics"] == ["accuracy", f"{MISC}:top2"]
    assert last["top2"] >= last["accuracy"] and last["val_top2"] >= last["val_accuracy"]


def test_16bit_output_is_cast_and_the_warning_names_the_layer(tiny_config, tmp_path, capsys):
    from app.training.job import train

    m = train(tiny_config(model=MISC + ":logits_16bit", dataset=ARRAYS,
                     precision="mixed_bfloat16", epochs=3, learning_rate=3e-3))
    assert m["status"] == "completed" and m["epochs"][-1]["val_accuracy"] >= TARGET
    err = capsys.readouterr().err
    assert "layer 'logits'" in err and "bfloat16" in err and "cast to float32" in err
    assert "from_logits=True" in err     # logits detected: not probabilities


def test_python_api_with_functions_arrays_and_datasets(tmp_path):
    import app
    sys.path.insert(0, USER)
    try:
        import datasets as user_datasets  # noqa: E402 - the test's own user file
        import policy_aware
    finally:
        sys.path.remove(USER)
    m = app.train(model=policy_aware.build, data=user_datasets.arrays(), precision="float32",
                  epochs=3, output=str(tmp_path / "a"), batch_size=32, learning_rate=3e-3,
                  save_model=False, progress="lines")
    assert m["status"] == "completed" and m["epochs"][-1]["val_accuracy"] >= TARGET
    assert m["task"]["model"].endswith(":build") and m["task"]["dataset"] == "python:arrays"
    m = app.train(model=policy_aware.build, data=user_datasets.unknown_size, loop="custom",
                  precision="mixed_bfloat16", epochs=3, output=str(tmp_path / "b"),
                  batch_size=32, learning_rate=3e-3, save_model=False, progress="lines")
    assert m["status"] == "completed" and m["epochs"][-1]["val_accuracy"] >= TARGET
    from app.core.errors import UsageError
    with pytest.raises(UsageError, match="unknown setting"):
        app.train(model=policy_aware.build, data=user_datasets.arrays(), batchsize=3)


def test_a_model_passed_built_is_checked_on_its_own_shape_and_trained_in_place(tmp_path):
    """``app.train(model=<a keras.Model>)``, as a notebook holds one: it was refused ("model
    must be one of mlp, ...") and ``app.check`` asked for an input shape the model has."""
    import numpy as np
    import tensorflow as tf

    import app
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input(shape=(784,)),
                                 tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(10)], name="held")
    report = app.check(model=model, data="synthetic", precision="float32")
    assert report["counts"]["blocker"] == 0, report
    before = [w.copy() for w in model.get_weights()]
    settings = dict(precision="float32", batch_size=32, max_train_samples=512,
                    max_val_samples=128, learning_rate=3e-3, save_model=False,
                    progress="lines", output=str(tmp_path / "run"))
    m = app.train(model=model, data="synthetic", epochs=2, **settings)
    assert m["status"] == "completed" and m["epochs"][-1]["val_accuracy"] >= TARGET
    assert m["task"]["model"] == "python:keras.Model 'held'"
    assert m["data"]["input_shape"] == [784]
    assert not all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    m = app.train(model=model, data="synthetic", epochs=3, resume=True, **settings)
    assert m["status"] == "completed" and len(m["epochs"]) == 3


def test_a_model_made_before_the_policy_is_one_warning(tiny_config, capsys):
    """A model function returning a model made at import computes in float32 under a mixed
    policy: the run said nothing and got no speed-up."""
    from app.training.job import train

    m = train(tiny_config(model=MISC + ":made_at_import", precision="mixed_bfloat16",
                          epochs=1, max_train_samples=64, max_val_samples=32))
    assert m["status"] == "completed"
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if "the policy was set" in line]
    assert warnings == [
        "warning: every layer of the model computes in float32 although the policy is "
        "mixed_bfloat16: the model was made before the policy was set, so it gets no "
        "speed-up; build the model inside the model function, which the run calls after it "
        "sets the policy (to app.train pass the function, not a model already built)"]


def test_a_model_passed_built_gives_synthetic_data_its_class_count_too():
    """``app.check(model=<3 output units>)`` said "has 3 output unit(s) but the labels of
    dataset 'synthetic' have 10 classes" (a QA pass): the model gives the shape, and the
    classes, unless num_classes says otherwise."""
    import tensorflow as tf

    import app
    from app.core.errors import UsageError
    model = tf.keras.Sequential([tf.keras.Input(shape=(6,)), tf.keras.layers.Dense(3)],
                                name="three")
    report = app.check(model=model, precision="float32", steps=2)
    assert report["counts"]["blocker"] == 0, report
    with pytest.raises(UsageError, match="has 3 output unit.s. but the labels of dataset "
                                         "'synthetic' have 5 classes"):
        app.check(model=model, precision="float32", steps=2, num_classes=5)


def test_every_layer_float32_on_purpose_trains_without_that_warning(tiny_config, capsys):
    """--float32-layers d1 on a model whose other layer has dtype="float32" warned "the model
    was made before the policy was set" (a QA pass)."""
    from app.training.job import train

    m = train(tiny_config(model=MISC + ":float32_on_purpose", precision="mixed_bfloat16",
                          float32_layers="d1", input_shape="8", epochs=1, max_train_samples=64,
                          max_val_samples=32))
    assert m["status"] == "completed"
    assert "the policy was set" not in capsys.readouterr().err


def test_policy_mismatch_names_layers_made_under_another_policy():
    import tensorflow as tf

    from app.task.model_layers import policy_mismatch

    def made_under(policy):
        tf.keras.mixed_precision.set_global_policy(policy)
        try:
            return tf.keras.Sequential([
                tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(3, name="hidden"),
                tf.keras.layers.Dense(2, name="out", dtype="float32")])
        finally:
            tf.keras.mixed_precision.set_global_policy("float32")
    f32, f16, bf16 = (made_under(p) for p in ("float32", "mixed_float16", "mixed_bfloat16"))
    assert policy_mismatch(f32, "float32") is None
    assert policy_mismatch(f16, "mixed_float16") is None     # 'out' float32 on purpose
    assert policy_mismatch(bf16, "mixed_bfloat16") is None
    assert policy_mismatch(f32, "mixed_float16").startswith(
        "every layer of the model computes in float32 although the policy is mixed_float16")
    assert policy_mismatch(f32, "mixed_bfloat16", ["hidden", "out"]) is None  # --float32-layers
    assert policy_mismatch(f16, "float32").startswith(
        "1 layer(s) of the model compute in float16 (first: 'hidden') although the policy is "
        "float32: they were made under another policy, and this run has no loss scaling for "
        "float16: small gradients flush to 0; build the model inside the model function")
    assert policy_mismatch(f16, "mixed_bfloat16").startswith(
        "1 layer(s) of the model compute in float16")
    assert policy_mismatch(bf16, "mixed_float16").startswith(
        "1 layer(s) of the model compute in bfloat16 (first: 'hidden') although the policy is "
        "mixed_float16: they were made under another policy; build")


def test_layers_float32_on_purpose_are_no_model_made_before_the_policy():
    """Every layer float32 because the user said so (dtype="float32" on the only Dense, or
    --float32-layers naming the others) warned "the model was made before the policy was
    set" (a QA pass)."""
    import tensorflow as tf

    from app.task.model_layers import policy_mismatch

    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        only = tf.keras.Sequential([tf.keras.Input(shape=(4,)),
                                    tf.keras.layers.Dense(3, name="out", dtype="float32")])
        inputs = tf.keras.Input(shape=(4,))
        hidden = tf.keras.layers.Dense(8, name="d1")(inputs)
        outputs = tf.keras.layers.Dense(3, name="out", dtype="float32")(hidden)
        two = tf.keras.Model(inputs, outputs)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    assert policy_mismatch(only, "mixed_bfloat16") is None
    assert policy_mismatch(two, "mixed_bfloat16", ["d1"]) is None   # --float32-layers d1
    made_before = tf.keras.Sequential([tf.keras.Input(shape=(4,)),
                                       tf.keras.layers.Dense(3, name="out", dtype="float32")])
    assert policy_mismatch(made_before, "mixed_bfloat16").startswith(
        "every layer of the model computes in float32 although the policy is mixed_bfloat16")


def test_a_model_passed_built_is_refused_by_several_replicas(tmp_path):
    """Its variables exist already, outside the strategy's scope."""
    script = (
        "import tensorflow as tf\n"
        "cpu = tf.config.list_physical_devices('CPU')[0]\n"
        "tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)\n"
        "import app\n"
        "from app.core.errors import UsageError\n"
        "model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(2)])\n"
        "try:\n"
        "    app.train(model=model, data='synthetic', strategy='mirrored', epochs=1,\n"
        f"              max_train_samples=64, output={str(tmp_path / 'run')!r})\n"
        "except UsageError as exc:\n"
        "    print(exc)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == (
        "error: the keras.Model 'sequential' was passed already built: its variables cannot "
        "be spread over the strategy's 2 replicas; allowed: a function (input_shape, "
        "num_classes) -> keras.Model that builds it, which the run calls inside the "
        "strategy's scope")
    assert not (tmp_path / "run").exists()


# ---- the layer mixed precision breaks ------------------------------------------------------

def test_float32_constant_in_a_custom_layer_is_named_in_one_line(tmp_path):
    out = tmp_path / "run"
    proc = run_app("train", "--model", os.path.join(USER, "float32_constant.py") + ":build",
                   "--dataset", ARRAYS, "--precision", "mixed_bfloat16", "--epochs", "1",
                   *QUICK, "--output", str(out))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = error_lines(proc.stderr)
    assert len(errors) == 1, proc.stderr
    assert "layer 'add_offset' (AddOffset" in errors[0] and "self.compute_dtype" in errors[0]
    assert errors[0].endswith("run it in float32: --float32-layers add_offset"), errors[0]
    # float32 has nothing to clash with: the same model trains
    ok = run_app("train", "--model", os.path.join(USER, "float32_constant.py") + ":build",
                 "--dataset", ARRAYS, "--precision", "float32", "--epochs", "1", *QUICK,
                 "--output", str(tmp_path / "f32"))
    assert ok.returncode == 0, ok.stderr


@ONCE_IN_THE_IMAGE
def test_an_exception_in_user_code_keeps_its_traceback(tmp_path):
    out = tmp_path / "run"
    proc = run_app("train", "--model", MISC + ":broken", "--dataset", ARRAYS, *QUICK,
                   "--output", str(out))
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "models_misc.py" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: your code raised NameError") and "undefined_helper" in last
    assert not out.exists()


# ---- interruption, resume, replicas ---------------------------------------------------------

@ONCE_IN_THE_IMAGE
def test_sigterm_then_resume_with_a_user_model(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--model", AWARE, "--dataset", "synthetic", "--input-shape", "8,8,1",
            "--max-train-samples", "20000", "--max-val-samples", "128", "--epochs", "4",
            "--precision", "float32", *QUICK, "--log-every", "50", "--output", str(out)]
    from tests.unit.training_process import TrainingProcess

    with TrainingProcess(args) as run:
        run.wait_inside_epoch(2)        # the premise: epoch 1 is done, epoch 2 has begun
        run.send(signal.SIGTERM)
        code, _, err = run.finish()
    assert code == 143, err
    interrupted = _metrics(out)
    assert interrupted["status"] == "interrupted"
    assert [e["epoch"] for e in interrupted["epochs"]] == [1]   # stopped inside epoch 2
    resumed = run_app(*args, "--resume", timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    final = _metrics(out)
    assert final["status"] == "completed"
    assert [e["epoch"] for e in final["epochs"]] == [1, 2, 3, 4]
    assert final["data"]["input_shape"] == [8, 8, 1]
    # the same run with another model is refused, and left as it was
    before = (out / "metrics.json").read_text()
    other = run_app(*args, "--resume", "--model", os.path.join(USER, "normalized.py") + ":build")
    assert other.returncode == 2 and "trained with a different spec" in other.stderr
    assert (out / "metrics.json").read_text() == before


@ONCE_IN_THE_IMAGE
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_mirrored_over_two_logical_cpus_with_a_user_model(tiny_config, tmp_path, loop):
    out = tmp_path / "run"
    proc = run_app("train", "--model", AWARE, "--dataset", ARRAYS, "--strategy", "mirrored",
                   "--loop", loop, "--precision", "float32", "--epochs", "3",
                   "--learning-rate", "3e-3", *QUICK, "--output", str(out),
                   env={"TFMP_LOGICAL_CPUS": "2"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    m = _metrics(out)
    assert m["distribute"]["replicas"] == 2 and m["distribute"]["global_batch"] == 64
    assert m["epochs"][-1]["val_accuracy"] >= TARGET


# ---- spec errors: one line, exit 2, nothing written -----------------------------------------

@pytest.mark.parametrize("model, dataset, shape, refused", [
    ("cnn", "synthetic", (784,), "input shape 784 is not used: the built-in model 'cnn' takes "
                                 "28x28x1; allowed: leave --input-shape out, or 28,28,1"),
    (AWARE, ARRAYS, (784,), f"input shape 784 is not used: the samples of {ARRAYS!r} are 8x8x1; "
                            "allowed: leave --input-shape out, or 8,8,1"),
    ("cnn", "synthetic", (28, 28, 1), None),
    (AWARE, "synthetic", (12, 12, 1), None),      # what the flag is for
    (AWARE, ARRAYS, (8, 8, 1), None),
])
def test_an_input_shape_the_run_would_not_use_is_refused(model, dataset, shape, refused):
    """--input-shape shapes generated data (and the built-in datasets) for your own model;
    given where a built-in model or your own data sets the shape, it was silently dropped."""
    from app.core.errors import UsageError
    from app.task.task import Task

    task = Task.from_specs(model, dataset, input_shape=shape)
    load = dict(global_batch=8, max_train_samples=16, max_val_samples=8, offline=True)
    if refused is None:
        assert tuple(task.load_data(**load).input_shape) == shape
        return
    with pytest.raises(UsageError) as info:
        task.load_data(**load)
    assert str(info.value).startswith("error: " + refused), str(info.value)


@pytest.mark.parametrize("model, dataset, needle", [
    ("nosuchmodule:build", ARRAYS, "no module named 'nosuchmodule'"),
    ("./missing/net.py:build", ARRAYS, "file './missing/net.py' does not exist"),
    (MISC + ":nosuch", ARRAYS, "has no 'nosuch'; allowed: one of the functions and classes it defines: broken, "),
    (MISC + ":NOT_CALLABLE", ARRAYS, "names a int, not a function"),
    (MISC + ":needs_more", ARRAYS, "parameter 'depth' has no value we can give"),
    (MISC + ":not_a_model", ARRAYS, "returned builtins.str, not a keras.Model"),
    (MISC + ":three_outputs", ARRAYS, "has 3 output unit(s) but the labels"),
    (MISC + ":no_flatten", ARRAYS, "outputs 8x8x4 a sample for samples of 8x8x1, but the "
     "labels of dataset '" + ARRAYS + "' are one class id a sample; allowed: a model whose "
     "output is one row of 4 a sample: Flatten() or GlobalAveragePooling2D() before"),
    ("mlp:", ARRAYS, "is not MODULE:FUNCTION"),
    ("vgg", ARRAYS, "model must be one of mlp, cnn, resnet or MODULE:FUNCTION"),
    (AWARE + " --loss nosuchloss", ARRAYS, "loss 'nosuchloss' is not a Keras loss"),
    (AWARE + " --metrics accuracy,nosuch", ARRAYS, "metric 'nosuch' is not a Keras metric"),
    (AWARE, os.path.join(USER, "datasets.py") + ":not_data", "returned dict"),
])
def test_spec_errors_are_one_line(tmp_path, capsys, model, dataset, needle):
    # In-process through the CLI's own main() (the same path as `python -m app`, without a
    # TensorFlow start-up per case); the two tests above run real subprocesses.
    from app.cli import main

    out = tmp_path / "run"
    code = main(["train", "--model", *model.split(" "), "--dataset", dataset, "--epochs", "1",
                 *QUICK,
                 "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    errors = error_lines(err)
    assert len(errors) == 1, err
    assert needle in errors[0], errors[0]
    assert "Traceback" not in err
    assert not out.exists()


@ONCE_IN_THE_IMAGE
def test_user_dataset_function_that_raises_is_their_bug(tmp_path):
    out = tmp_path / "run"
    proc = run_app("train", "--dataset", os.path.join(USER, "datasets.py") + ":raises",
                   "--model", AWARE, *QUICK, "--output", str(out))
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "the bucket is not mounted" in proc.stderr
    assert not out.exists()
