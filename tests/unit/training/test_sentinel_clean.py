"""No false alarm: clean models train 2,000 steps under every precision this machine can
run, with the sentinel on (the default), and it says nothing: no fault, no headroom
warning; the odd step that loss scaling skips is counted, not reported.

A model with BatchNormalization, LayerNormalization and attention in each precision (host
and image); the built-in mlp and cnn under mixed_float16, the precision whose loss scaling
skips steps (host: the image's CPU float16 kernels make 2,000 cnn steps minutes long).
fit runs 25 steps per call here: the sentinel's guard is inside the step, so it sees every
one of them."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import app

STEPS = 2000
BATCH = 4


def attention_model(input_shape, num_classes):
    inp = tf.keras.Input(input_shape)                       # (tokens, features)
    h = tf.keras.layers.Dense(16, name="embed")(inp)
    h = tf.keras.layers.BatchNormalization(name="batch_norm")(h)
    att = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=8, name="attention")(h, h)
    h = tf.keras.layers.LayerNormalization(name="layer_norm")(h + att)
    h = tf.keras.layers.GlobalAveragePooling1D(name="pool")(h)
    out = tf.keras.layers.Dense(num_classes, activation="softmax", dtype="float32",
                                name="predictions")(h)
    return tf.keras.Model(inp, out)


def _sequences():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 4, 6)).astype("float32")
    y = (x[:, :, 0].mean(axis=1) > 0).astype("int32")
    return (x, y), (x[:64], y[:64])


def _quiet(m):
    assert m["status"] == "completed", m.get("diagnosis")
    assert m["epochs"][-1]["steps"] >= STEPS
    n = m["numerics"]
    assert n["sentinel"] is True and n["fault"] is None and n["warnings"] == []
    assert n["headroom"], "the probe measured no layer"
    return n


@pytest.mark.slow
@pytest.mark.parametrize("precision", [
    "float32", "mixed_float16",
    pytest.param("mixed_bfloat16", marks=pytest.mark.bf16_kernels(
        "Dense", "BatchNormalization", "LayerNormalization"))])
def test_batchnorm_layernorm_attention_model_trains_2000_steps_without_an_alarm(tmp_path,
                                                                                 precision):
    m = app.train(attention_model, _sequences(), precision=precision, loop="fit", epochs=1,
                  batch_size=BATCH, steps_per_execution=25, log_every=100, numerics_every=200,
                  max_val_samples=64, progress="lines", save_model=False,
                  output=str(tmp_path / "run"))
    n = _quiet(m)
    assert {"batch_norm", "attention", "layer_norm"} <= set(n["headroom"])


@pytest.mark.slow
@pytest.mark.host_only(reason="2,000 float16 steps of the built-in models take minutes on TF "
                              "2.9's CPU kernels")
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_builtin_models_train_2000_mixed_float16_steps_without_an_alarm(tmp_path, model):
    m = app.train(model, "synthetic", precision="mixed_float16", loop="fit", epochs=1,
                  batch_size=BATCH, steps_per_execution=25, log_every=100, numerics_every=200,
                  max_train_samples=STEPS * BATCH, max_val_samples=16, progress="lines",
                  save_model=False, output=str(tmp_path / "run"))
    _quiet(m)


# ---- a first loss scale far too high: loss scaling coming down, not a fault ---------------

HUGE_SCALE = 2.0 ** 40   # ~23 halvings before this model's float16 gradients fit
DENSE_NET = '''
import tensorflow as tf


def plain(input_shape, num_classes):
    inp = tf.keras.Input(input_shape)
    h = tf.keras.layers.Dense(16, activation="relu")(inp)
    out = tf.keras.layers.Dense(num_classes)(h)
    return tf.keras.Model(inp, tf.keras.layers.Activation("softmax", dtype="float32")(out))
'''
ROWS = '''
import numpy as np


def clean():
    x = np.random.default_rng(0).normal(size=(240, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    return (x, y), (x[:32], y[:32])
'''


def _module(tmp_path, name, text):
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return path


def _skips_counted_once(m):
    """Completed, no fault, and every count of skipped steps the same: each epoch's, their
    sum in numerics.skipped_steps, and the step log's running count (240 rows of 16: 15
    steps an epoch, the run of skips crossing into the second)."""
    assert m["status"] == "completed", m.get("diagnosis")
    n, per_epoch = m["numerics"], [e["skipped_steps"] for e in m["epochs"]]
    assert n["fault"] is None and len(per_epoch) == 2
    assert n["skipped_steps"] == sum(per_epoch) == m["steps"][-1]["skipped_steps"], (n, per_epoch)
    # more in a row than --max-skipped-steps (20), each halving the scale
    assert n["skipped_steps"] > 20 and per_epoch[1] >= 1
    assert m["epochs"][-1]["loss_scale"] <= HUGE_SCALE / 2 ** n["skipped_steps"]


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_huge_first_loss_scale_comes_down_and_the_run_trains_to_the_end(tmp_path, loop):
    """The QA pass: --initial-loss-scale 2**40, 23 steps skipped in a row while the scale came
    down, then a finite step: the run was stopped 7 steps later as diverged, with
    numerics.skipped_steps 0 or 20 against the log's 23."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dense_net", _module(tmp_path, "dense_net",
                                                                       DENSE_NET))
    net = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(net)
    rows = {}
    exec(ROWS, rows)
    m = app.train(net.plain, rows["clean"](), precision="mixed_float16", loop=loop, epochs=2,
                  batch_size=16, log_every=5, initial_loss_scale=HUGE_SCALE, progress="lines",
                  save_model=False, output=str(tmp_path / "run"))
    _skips_counted_once(m)


@pytest.mark.host_only(reason="a second mixed_float16 run in a process of its own: the "
                              "in-process runs above show the same in the image")
def test_a_huge_first_loss_scale_on_the_command_line_exits_0(tmp_path):
    import json

    from tests.unit.helpers import run_app

    net, rows = _module(tmp_path, "nets", DENSE_NET), _module(tmp_path, "mydata", ROWS)
    out = tmp_path / "run"
    proc = run_app("train", "--model", f"{net}:plain", "--dataset", f"{rows}:clean",
                   "--precision", "mixed_float16", "--initial-loss-scale", "1099511627776",
                   "--batch-size", "16", "--epochs", "2", "--log-every", "5",
                   "--no-save-model", "--output", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "diverged" not in proc.stderr
    _skips_counted_once(json.loads((out / "metrics.json").read_text()))
