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
