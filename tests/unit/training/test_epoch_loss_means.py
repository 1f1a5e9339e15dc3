"""The epoch's ``loss`` and ``val_loss`` are means over every sample of the epoch, as Keras'
fit reports them, in either loop: a short last batch counts for its samples (not as a whole
batch), sample weights weigh the loss as fit weighs it (each sample's loss times its weight,
over the batch's size), and so under --accumulate and on several replicas.

Real tiny runs.  With a learning rate of 1e-30 the weights do not move, so the figures the
run reports must be the saved model's own per-sample means over the training and the
validation data; a run with a real learning rate must report what fit reports (the two
loops train the same weights on one replica)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.paths import ROOT
from tests.unit.helpers import app_env

pytestmark = pytest.mark.slow

# 300 training samples in batches of 32 (the last of 12), 70 validation samples (the last of
# 6): a mean of batch means is off by percents.
_SCRIPT = r'''
import json, sys
import numpy as np
import tensorflow as tf
import app

settings = json.loads(sys.argv[1])
regularized = settings.pop("regularized", False)


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 8)).astype("float32")
    xv = rng.normal(size=(70, 8)).astype("float32")
    # the classes lean on the first feature, and the last batches hold the hard samples
    y, yv = (x[:, 0] > 0).astype("int64"), (xv[:, 0] > 0).astype("int64")
    x[-12:] *= 8.0
    xv[-6:] *= 8.0
    w = rng.uniform(0.1, 3.0, 300).astype("float32")
    wv = rng.uniform(0.1, 3.0, 70).astype("float32")
    return (x, y, w), (xv, yv, wv)


def build(input_shape, num_classes):
    reg = tf.keras.regularizers.l2(0.05) if regularized else None
    inp = tf.keras.Input(input_shape)
    h = tf.keras.layers.Dense(16, activation="relu", kernel_regularizer=reg)(inp)
    return tf.keras.Model(inp, tf.keras.layers.Dense(num_classes, kernel_regularizer=reg)(h))


m = app.train(model=build, data=data(), epochs=1, batch_size=32, precision="float32",
              seed=0, progress="lines", offline=True, **settings)
model = tf.keras.models.load_model(m["model_path"], compile=False)
loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
reg = float(tf.add_n(model.losses)) if model.losses else 0.0
(x, y, w), (xv, yv, wv) = data()
print("RESULT " + json.dumps({
    "epoch": m["epochs"][-1], "replicas": m["distribute"]["replicas"],
    "train_per_sample": float(np.mean(loss(y, model(x)).numpy() * w)) + reg,
    "val_per_sample": float(np.mean(loss(yv, model(xv)).numpy() * wv)) + reg}))
'''


def _run(tmp_path, replicas=1, **settings) -> dict:
    env = app_env({"TF_CPP_MIN_LOG_LEVEL": "2"})
    if replicas > 1:
        env["TFMP_LOGICAL_CPUS"] = str(replicas)
        settings["strategy"] = "mirrored"
    settings.setdefault("output", str(tmp_path / f"run-{len(list(tmp_path.iterdir()))}"))
    settings.setdefault("workspace", str(tmp_path / "ws"))
    done = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(settings)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["replicas"] == replicas
    return result


@pytest.mark.parametrize("loop,accumulate,replicas", [
    ("fit", None, 1),   # the reference: what fit reports
    ("custom", None, 1),
    ("custom", 3, 1),
    ("custom", None, 2),
    ("custom", 3, 2),
])
def test_the_epoch_loss_is_the_mean_over_every_sample(tmp_path, loop, accumulate, replicas):
    r = _run(tmp_path, replicas, loop=loop, accumulate=accumulate, learning_rate=1e-30)
    epoch = r["epoch"]
    assert epoch["val_loss"] == pytest.approx(r["val_per_sample"], rel=1e-5)
    assert epoch["loss"] == pytest.approx(r["train_per_sample"], rel=1e-5)


def test_the_custom_loop_reports_what_fit_reports(tmp_path):
    """Real training (the weights move): both loops train the same weights on one replica,
    and so report the same loss and val_loss."""
    fit = _run(tmp_path, loop="fit", learning_rate=1e-2)["epoch"]
    custom = _run(tmp_path, loop="custom", learning_rate=1e-2)["epoch"]
    assert custom["loss"] == pytest.approx(fit["loss"], rel=1e-5)
    assert custom["val_loss"] == pytest.approx(fit["val_loss"], rel=1e-5)


@pytest.mark.parametrize("loop,accumulate,replicas", [
    ("fit", None, 1),   # the reference: fit adds the model's own losses to what it reports
    ("custom", None, 1),
    ("custom", 3, 2),
])
def test_the_epoch_loss_holds_the_models_regularization_as_fits_does(tmp_path, loop,
                                                                     accumulate, replicas):
    r = _run(tmp_path, replicas, loop=loop, accumulate=accumulate, learning_rate=1e-30,
             regularized=True)
    epoch = r["epoch"]
    assert epoch["val_loss"] == pytest.approx(r["val_per_sample"], rel=1e-5)
    assert epoch["loss"] == pytest.approx(r["train_per_sample"], rel=1e-5)
