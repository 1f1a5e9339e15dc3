"""--early-stop N: the run stops once val_loss has not improved for N epochs, the model saved
is the best epoch's, and --resume neither trains a stopped run on nor forgets its best."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from app.training.early_stop import (best_epoch, epochs_since_best, higher_is_better,
                                     should_stop)


def _rows(*val_losses):
    return [{"epoch": i + 1, "val_loss": v} for i, v in enumerate(val_losses)]


@pytest.mark.parametrize("losses, best, since", [
    ((0.9, 0.5, 0.7, 0.6), 2, 2),
    ((0.5, 0.5, 0.5), 1, 2),                  # an equal loss is no improvement
    ((None, math.nan, 0.8, math.inf), 3, 1),  # not finite, or not measured: never the best
    ((None, math.nan), None, 2),
])
def test_the_best_epoch_and_the_epochs_since(losses, best, since):
    rows = _rows(*losses)
    assert (best_epoch(rows) or {}).get("epoch") == best
    assert epochs_since_best(rows) == since
    assert should_stop(rows, since) and not should_stop(rows, since + 1)
    assert not should_stop(rows, 0)           # 0: off


def test_accuracies_and_the_like_are_better_higher():
    rows = [{"epoch": i + 1, "val_accuracy": a} for i, a in enumerate((0.7, 0.9, 0.9, 0.8))]
    assert best_epoch(rows, "val_accuracy")["epoch"] == 2
    assert epochs_since_best(rows, "val_accuracy") == 2
    assert [higher_is_better(m) for m in ("val_accuracy", "val_auc", "val_recall",
                                          "val_top_k_categorical_accuracy", "val_loss",
                                          "val_mae", "val_false_positives")] == \
        [True, True, True, True, False, False, False]


def _overfitting_data():
    """Few noisy training samples, many validation ones: a wide model's val_loss is lowest
    after an epoch or two, then grows every epoch."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1200, 20)).astype(np.float32)
    y = ((x[:, 0] + 0.8 * rng.normal(size=1200)) > 0).astype(np.int64)
    return (x[:200], y[:200]), (x[200:], y[200:])


def _wide(input_shape, num_classes):
    import tensorflow as tf

    return tf.keras.Sequential([tf.keras.Input(shape=input_shape),
                                tf.keras.layers.Dense(256, activation="relu"),
                                tf.keras.layers.Dense(256, activation="relu"),
                                tf.keras.layers.Dense(num_classes, dtype="float32")])


def _train(out, loop="fit", **kw):
    import app

    return app.train(model=_wide, data=_overfitting_data(), epochs=40, batch_size=32,
                     learning_rate=1e-2, loop=loop, precision="float32", progress="lines",
                     output=str(out), **{"early_stop": 3, **kw})


def _accuracy_of_the_saved_model(metrics) -> float:
    import tensorflow as tf

    model = tf.keras.models.load_model(metrics["model_path"], compile=False)
    (_, _), (xv, yv) = _overfitting_data()
    return float(np.mean(model.predict(xv, verbose=0).argmax(axis=1) == yv))


@pytest.mark.parametrize("loop, monitor", [("fit", "val_loss"), ("custom", "val_accuracy")])
def test_a_run_stops_early_and_saves_the_best_epochs_weights(tmp_path, capfd, loop, monitor):
    m = _train(tmp_path / "run", loop, early_stop_on=monitor)
    epochs = m["epochs"]
    best = best_epoch(epochs, monitor)
    assert m["status"] == "completed"
    assert len(epochs) == best["epoch"] + 3 < 40, [e[monitor] for e in epochs]
    assert m["early_stop"] == {"patience": 3, "monitor": monitor, "best_epoch": best["epoch"],
                               "best": best[monitor], "stopped": True,
                               "model_epoch": best["epoch"]}
    # The model saved is the best epoch's, not the last one's (whose accuracy is lower).
    assert _accuracy_of_the_saved_model(m) == pytest.approx(best["val_accuracy"], abs=1e-6)
    assert best["val_accuracy"] != epochs[-1]["val_accuracy"]
    out = capfd.readouterr().out
    assert (f"early stop: {monitor} has not improved for 3 epoch(s) since epoch {best['epoch']} "
            f"({best[monitor]:.4f}); the model saved is epoch {best['epoch']}'s") in out
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["early_stop"] == \
        m["early_stop"]


def test_resume_trains_a_stopped_run_on_only_with_more_patience(tmp_path, capfd):
    out = tmp_path / "run"
    first = _train(out)
    stopped_at = len(first["epochs"])
    again = _train(out, resume=True)
    assert len(again["epochs"]) == stopped_at           # nothing trained
    assert "so nothing is left to train (a larger --early-stop trains on)" in \
        capfd.readouterr().err
    more = _train(out, resume=True, early_stop=5)
    best = best_epoch(more["epochs"])
    assert len(more["epochs"]) == best["epoch"] + 5 > stopped_at
    assert more["early_stop"]["model_epoch"] == best["epoch"]
    assert _accuracy_of_the_saved_model(more) == pytest.approx(best["val_accuracy"], abs=1e-6)
    # The best epoch's weights lost (the run cut short as it saved them): said, and the
    # model saved is the last epoch's.
    shutil.rmtree(out / "best")
    last = _train(out, resume=True, early_stop=6)
    assert last["early_stop"]["model_epoch"] == last["epochs"][-1]["epoch"]
    assert (f"warning: --early-stop: the weights of the best epoch, {best['epoch']}, were not "
            "saved") in capfd.readouterr().err


def test_a_bad_patience_or_number_to_watch_is_one_line(tmp_path):
    from app.core.errors import UsageError

    with pytest.raises(UsageError, match=r"early_stop must be 0 or more. Received: "
                                         r"early_stop=-1; allowed: an integer >= 1"):
        _train(tmp_path / "run", early_stop=-1)
    with pytest.raises(UsageError) as caught:
        _train(tmp_path / "run", early_stop_on="val_auc")
    # app.train's keyword, as the settings checked before it are named
    assert str(caught.value) == ("error: early_stop_on 'val_auc' is not a number this run "
                                 "records; allowed: one of val_loss, val_accuracy")
    # the other setting named as app.train takes it, not as the command line's flag
    with pytest.raises(UsageError, match=r"early_stop_on=\.\.\. applies with early_stop=\.\.\. only"):
        _train(tmp_path / "run", early_stop=0, early_stop_on="val_accuracy")
    assert not (tmp_path / "run").exists()
