"""Real training runs on small learnable data, through the public API ``app.training.job.train``."""
import json
import os

import pytest
import tensorflow as tf

from app.training.job import train
from tests.unit.helpers import ONCE_IN_THE_IMAGE

# Synthetic data: 10 classes, one random prototype each plus noise (fixed seed); chance is 0.1.
TARGET_ACCURACY = 0.9


@pytest.mark.parametrize("loop", ["fit", "custom"])
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_reaches_target_accuracy(tiny_config, policy, loop):
    steps = []
    m = train(tiny_config(precision=policy, loop=loop), on_step=steps.append)
    assert m["status"] == "completed"
    assert m["precision"]["policy"] == policy
    assert [e["epoch"] for e in m["epochs"]] == [1, 2]
    assert m["epochs"][-1]["val_accuracy"] >= TARGET_ACCURACY
    assert all(e["loss_scale"] == 1.0 and e["skipped_steps"] == 0 for e in m["epochs"])
    # the per-step callback sees loss, gradient norm and loss scale every log_every steps
    assert steps and {"loss", "grad_norm", "loss_scale", "step"} <= set(steps[0])
    assert steps[0]["step"] == 4 and steps[0]["grad_norm"] > 0


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_mixed_float16_reaches_target_accuracy(tiny_config, loop):
    # float16 is ~60x slower on a CPU: keep it tiny
    m = train(tiny_config(precision="mixed_float16", loop=loop, epochs=3, max_train_samples=256,
                          max_val_samples=64, learning_rate=3e-3))
    assert m["status"] == "completed"
    assert m["epochs"][-1]["val_accuracy"] >= TARGET_ACCURACY
    assert m["epochs"][-1]["loss_scale"] > 1.0


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_injected_overflow_is_skipped_and_training_recovers(tiny_config, loop):  # noqa: D103
    """A first loss scale of 2**22 overflows float16: steps are skipped and the scale
    falls until the gradients fit, then the model still learns."""
    m = train(tiny_config(precision="mixed_float16", loop=loop, epochs=4, max_train_samples=256,
                          max_val_samples=64, learning_rate=3e-3, initial_loss_scale=2.0 ** 22))
    first = m["epochs"][0]
    assert first["skipped_steps"] >= 1
    assert first["loss_scale"] < 2.0 ** 22
    assert m["status"] == "completed"
    assert m["epochs"][-1]["val_accuracy"] >= TARGET_ACCURACY


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_unrecoverable_non_finite_loss_stops_with_a_diagnosis(tiny_config, loop, capsys):
    m = train(tiny_config(loop=loop, learning_rate=1e30, epochs=1))
    assert m["status"] == "diverged"
    assert "non-finite" in m["diagnosis"] and "lower --learning-rate" in m["diagnosis"]
    assert "error: training diverged" in capsys.readouterr().err


def test_outputs_and_metrics_schema(tiny_config, tmp_path):
    cfg = tiny_config(epochs=1, save_model=True)
    m = train(cfg)
    out = tmp_path / "run"
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["status"] == "completed" == m["status"]
    for key in ("config", "precision", "environment", "epochs", "peak_memory", "model_path"):
        assert key in on_disk
    assert on_disk["peak_memory"]["kind"] in ("gpu", "cpu_rss") and on_disk["peak_memory"]["bytes"] > 0
    row = on_disk["epochs"][0]
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "epoch_seconds",
                "samples_per_second", "loss_scale", "skipped_steps"):
        assert key in row
    assert os.path.exists(on_disk["model_path"])          # native format of the running Keras
    assert os.listdir(out / "checkpoints")
    assert not [f for f in os.listdir(out) if ".tmp" in f]  # no temp files left behind
    # TensorBoard event files: the image and the test extra both install tensorboard.
    assert on_disk["tensorboard"] == str(out / "tensorboard")
    events = [f for _, _, files in os.walk(out / "tensorboard") for f in files
              if f.startswith("events.out.tfevents")]
    assert events, "no TensorBoard event file written"
    tags = {value.tag
            for root, _, files in os.walk(out / "tensorboard") for f in files
            if f.startswith("events.out.tfevents")
            for event in tf.compat.v1.train.summary_iterator(os.path.join(root, f))
            for value in event.summary.value}
    # What the guide asks to watch: loss, gradient norm, loss scale, skipped steps,
    # samples/s and learning rate (issue 10).
    assert {"step/loss", "step/grad_norm", "step/loss_scale", "epoch/val_accuracy",
            "epoch/skipped_steps", "epoch/samples_per_second", "epoch/learning_rate",
            "epoch/loss_scale"} <= tags
    assert row["learning_rate"] == pytest.approx(cfg.learning_rate)


def test_default_run_folder_names_model_dataset_and_policy(tiny_config):
    from datetime import datetime, timezone

    from app.training.config import default_base, short_name, unused

    cfg = tiny_config(output=None, model="./nets/small.py:build", dataset="data.cifar:load")
    now = datetime(2026, 11, 30, 1, 2, 3, tzinfo=timezone.utc)
    assert unused(default_base(cfg, "mixed_float16", now)).endswith(
        "runs/20261130T010203Z-small-cifar-mixed_float16")
    assert short_name("mlp") == "mlp" and short_name("nets.small:make_net") == "small.make_net"
    # A dataset file is named by its name alone: its path made folders inside runs/, and a
    # path through .. put the run outside it.
    for path in ("./digits.npz", "/workspace/d/digits.npz", "d/../../workspace/digits.NPZ"):
        cfg = tiny_config(output=None, model="mlp", dataset=path)
        assert unused(default_base(cfg, "float32", now)).endswith(
            "runs/20261130T010203Z-mlp-digits-float32"), path


def test_runs_started_in_the_same_second_get_folders_of_their_own(tiny_config, tmp_path):
    """Two quick runs of the same model, data and policy from a notebook can start within
    one second: the default folder of the second must not be the first's ("already holds a
    run")."""
    from datetime import datetime, timezone

    from app.training.config import default_base, unused

    cfg = tiny_config(output=None)
    now = datetime(2026, 12, 5, 13, 50, 37, tzinfo=timezone.utc)
    first = unused(default_base(cfg, "float32", now))
    assert first.endswith("runs/20261205T135037Z-mlp-synthetic-float32")
    os.makedirs(first)
    assert unused(default_base(cfg, "float32", now)) == first + "-2"
    os.makedirs(first + "-2")
    assert unused(default_base(cfg, "float32", now)) == first + "-3"
    assert unused(default_base(cfg, "mixed_bfloat16", now)).endswith("-mixed_bfloat16")
    # two real runs back to back, each in its own folder, both completed
    runs = [train(tiny_config(output=None, epochs=1, max_train_samples=64)) for _ in range(2)]
    assert [r["status"] for r in runs] == ["completed", "completed"]
    assert runs[0]["config"]["output"] != runs[1]["config"]["output"]


def test_a_default_folder_taken_before_the_claim_moves_the_run_on(tiny_config, monkeypatch):
    """Two `tfmp train` started in the same second both pick the same default folder in
    prepare(); the second to claim it (QA: 'is in use by another run', exit 2) takes -2."""
    from app.run_folder.lock import RunLock
    from app.training import job

    real, twins = job.prepare, []

    def prepare_then_lose_the_race(*args, **kwargs):
        run = real(*args, **kwargs)
        twins.append(RunLock(run.output).acquire())   # the other run: folder made, locked
        return run

    monkeypatch.setattr(job, "prepare", prepare_then_lose_the_race)
    try:
        m = job.train(tiny_config(output=None, epochs=1, max_train_samples=64))
    finally:
        twins[0].release()
    assert m["status"] == "completed"
    assert m["config"]["output"] == twins[0].output + "-2"
    assert os.listdir(os.path.join(twins[0].output + "-2", "checkpoints"))
    assert os.listdir(twins[0].output) == [".tfmp-run.lock"]   # the twin's, untouched


def test_a_resumed_epochs_record_counts_the_samples_this_run_trained():
    """QA's run: 20000 samples in batches of 8 (2500), stopped after 2376: the resumed part
    is 124 batches, 992 samples, and samples/s divides those, not the epoch's 20000."""
    from app.training.recorder import ResumedEpoch

    part = ResumedEpoch.at(0, 2376, 2500, micro_batch=8, train_samples=20000)
    assert part.to_json() == {"after_batches": 2376, "batches": 2500, "train_samples": 992}
    assert "of the last 124 (992 samples)" in part.said()
    # a short last batch: 100 samples in batches of 32 (4), resumed after 3: 4 samples
    assert ResumedEpoch.at(1, 3, 4, micro_batch=32, train_samples=100).train_samples == 4
    assert ResumedEpoch.at(0, 0, 2500, micro_batch=8, train_samples=20000) is None


def test_resume_restores_epoch_and_loss_scale(tiny_config):
    cfg = tiny_config(precision="mixed_float16", loop="custom", epochs=1, max_train_samples=128,
                      max_val_samples=32, initial_loss_scale=2.0 ** 30)
    first = train(cfg)
    scale_after_first = first["epochs"][0]["loss_scale"]
    assert scale_after_first < 2.0 ** 30
    again = train(tiny_config(precision="mixed_float16", loop="custom", epochs=2,
                              max_train_samples=128, max_val_samples=32,
                              initial_loss_scale=2.0 ** 30, resume=True))
    assert [e["epoch"] for e in again["epochs"]] == [1, 2]
    # the scale carried over from the checkpoint (and kept falling) instead of starting
    # at 2**30 again, which would have ended the epoch at the first run's value
    assert again["epochs"][1]["loss_scale"] < scale_after_first
    assert [r["step"] for r in again["steps"]] == [4, 8]  # the step count continues


def test_resume_finds_the_checkpoint_of_a_run_folder_given_as_a_relative_path(
        tiny_config, tmp_path, monkeypatch):
    """`tfmp train --output runs/x`, then the same with --resume: TensorFlow's state file
    holds paths relative to the checkpoints folder, and a relative folder joined to them
    twice found nothing ("--resume found no checkpoint")."""
    from app.run_folder import checkpoints

    monkeypatch.chdir(tmp_path)
    first = train(tiny_config(output="runs/x", epochs=1, max_train_samples=64))
    assert first["status"] == "completed"
    assert checkpoints.has_checkpoint("runs/x")
    assert checkpoints.newest_complete("runs/x/checkpoints") == "runs/x/checkpoints/ckpt-1"
    again = train(tiny_config(output="runs/x", epochs=2, max_train_samples=64, resume=True))
    assert [e["epoch"] for e in again["epochs"]] == [1, 2]


def test_resuming_a_run_that_has_its_epochs_says_nothing_is_left(tiny_config, tmp_path,
                                                                 capsys):
    """It said "resuming ... at epoch 3", then "done: 2 epoch(s)"."""
    train(tiny_config(epochs=2, max_train_samples=64))
    capsys.readouterr()
    again = train(tiny_config(epochs=1, max_train_samples=64, resume=True))
    assert [e["epoch"] for e in again["epochs"]] == [1, 2]
    [said] = [line for line in capsys.readouterr().err.splitlines() if "resuming" in line]
    assert said.endswith(": 2 epoch(s) trained, and --epochs 1 asks for no more, so nothing "
                         "is left to train (--epochs 3 or more trains on)"), said


@ONCE_IN_THE_IMAGE
def test_resuming_with_nothing_left_to_train_restores_without_warnings(tmp_path):
    """Keras 2 never made the optimizer's slots, and TensorFlow said so at exit: five
    "WARNING:tensorflow:Value in checkpoint could not be found in the restored object:
    (root).optimizer..." lines (a QA pass)."""
    from tests.unit.helpers import run_app

    args = ["train", "--model", "mlp", "--dataset", "synthetic", "--epochs", "1",
            "--max-train-samples", "256", "--max-val-samples", "64", "--precision", "float32",
            "--offline", "--no-save-model", "--progress", "lines", "--output",
            str(tmp_path / "run")]
    assert run_app(*args).returncode == 0
    again = run_app(*args, "--resume")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "nothing is left to train" in again.stderr
    assert "could not be found" not in again.stderr, again.stderr[-2000:]


def test_resuming_mid_epoch_past_the_epochs_asked_for_trains_nothing(tiny_config, capsys):
    """Interrupted in epoch 2 and resumed with --epochs 1: it finished epoch 2 and said
    "done: 2 epoch(s)" under a config of 1 (found by a QA pass)."""
    import os
    import signal

    def stop_in_epoch_2(row):
        if row["step"] == 20:   # 16 steps an epoch: the 4th batch of epoch 2
            os.kill(os.getpid(), signal.SIGTERM)
    first = train(tiny_config(epochs=3, loop="custom"), on_step=stop_in_epoch_2)
    assert first["status"] == "interrupted" and len(first["epochs"]) == 1
    capsys.readouterr()
    again = train(tiny_config(epochs=1, resume=True, loop="custom"))
    assert [e["epoch"] for e in again["epochs"]] == [1]
    [said] = [line for line in capsys.readouterr().err.splitlines() if "resuming" in line]
    assert said.endswith(": 1 epoch(s) and part of epoch 2 trained, and --epochs 1 asks for "
                         "no more, so nothing is left to train (--epochs 2 or more trains "
                         "on)"), said


def test_resuming_mid_epoch_at_another_batch_size_says_the_epoch_starts_over(tiny_config,
                                                                            capsys):
    """It said "resuming ... at epoch 2" and trained epoch 2 from its start, with no word
    of the batches it had (a QA pass)."""
    import os
    import signal

    def stop_in_epoch_2(row):
        if row["step"] == 20:   # 16 steps an epoch: the 4th batch of epoch 2
            os.kill(os.getpid(), signal.SIGTERM)
    train(tiny_config(epochs=2, loop="custom"), on_step=stop_in_epoch_2)
    capsys.readouterr()
    again = train(tiny_config(epochs=2, loop="custom", batch_size=64, resume=True))
    assert [e["epoch"] for e in again["epochs"]] == [1, 2]
    # The signal at step 20 is answered after the next step: 5 of epoch 2.
    assert ("note: the checkpoint was saved 5 step(s) into epoch 2 with batch size 32, and "
            "this run has batch size 64: that epoch starts over from its first batch (the "
            "weights keep what those steps taught them)") in capsys.readouterr().err


def test_resume_trains_at_a_learning_rate_given_and_keeps_the_runs_otherwise(
        tiny_config, tmp_path, capsys):
    """The checkpoint's optimizer brought its own rate back: --resume --learning-rate 50
    trained at the run's 0.001 while metrics.json recorded 50 (found by a QA pass)."""
    import shutil

    first = train(tiny_config(epochs=1, learning_rate=0.01))
    shutil.copytree(tmp_path / "run", tmp_path / "again")
    capsys.readouterr()
    # Given: it trains at that rate.  1e-9 leaves the weights, so the validation loss, as
    # they were; the run's 0.01 moves them.
    given = train(tiny_config(epochs=2, resume=True, learning_rate=1e-9,
                              given=("learning_rate",)))
    assert "note: the run was trained at learning rate 0.01; it continues at 1e-09" in \
        capsys.readouterr().err
    assert given["config"]["learning_rate"] == 1e-9
    start = first["epochs"][0]["val_loss"]
    assert abs(given["epochs"][1]["val_loss"] - start) < 1e-4 * start, given["epochs"]
    # Not given (a default of 0.001 in the config): the run's own.
    kept = train(tiny_config(epochs=2, resume=True, output=str(tmp_path / "again")))
    assert "note: --resume keeps the run's learning rate (0.01)" in capsys.readouterr().err
    assert kept["config"]["learning_rate"] == 0.01
    assert abs(kept["epochs"][1]["val_loss"] - start) > 1e-3 * start, kept["epochs"]


KINK_MODEL = '''
import tensorflow as tf


class Kink(tf.keras.layers.Layer):
    """Adds sqrt(w * x) with w a weight held at 0: the value is 0, the gradient w * inf =
    NaN (a variable, so that no graph optimizer folds the zero away)."""

    def build(self, input_shape):
        self.zero = self.add_weight(name="zero", shape=(), initializer="zeros", trainable=False)

    def call(self, x):
        return x + tf.sqrt(self.zero * x)


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = Kink()(tf.keras.layers.Dense(num_classes)(inputs))
    return tf.keras.Model(inputs, tf.keras.layers.Activation("softmax", dtype="float32")(x))
'''


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_poisoned_weights_after_a_finite_loss_stop_the_run_at_the_epoch_end(tiny_config, loop,
                                                                             tmp_path):
    """One step an epoch, no logging step: its loss is finite but its gradients are NaN, so
    the weights are poisoned; the epoch is not recorded and the run stops as diverged."""
    (tmp_path / "kink.py").write_text(KINK_MODEL)
    m = train(tiny_config(model=str(tmp_path / "kink.py") + ":build", loop=loop, epochs=2,
                          batch_size=32, max_train_samples=32, log_every=100, input_shape="784"))
    assert m["status"] == "diverged" and m["epochs"] == []
    assert "non-finite" in m["diagnosis"]


def test_a_run_that_finishes_between_the_check_and_the_lock_is_not_overwritten(tiny_config,
                                                                              monkeypatch):
    # prepare() finds the folder free; another run then finishes there before this one takes
    # the lock (simulated, deterministically, just before the lock is taken).  The check
    # under the lock must refuse instead of writing over the other run's metrics.json.
    from app.run_folder import lock as run_lock
    from app.training import job as training
    from app.core.errors import UsageError

    cfg = tiny_config(epochs=1)
    theirs = '{"status": "completed", "by": "the other run"}'

    class FinishedMeanwhile(run_lock.RunLock):
        def acquire(self):
            os.makedirs(self.output, exist_ok=True)
            with open(os.path.join(self.output, "metrics.json"), "w", encoding="utf-8") as fh:
                fh.write(theirs)
            return super().acquire()

    monkeypatch.setattr(training, "RunLock", FinishedMeanwhile)
    with pytest.raises(UsageError, match="already holds a run"):
        training.train(cfg)
    with open(os.path.join(cfg.output, "metrics.json"), encoding="utf-8") as fh:
        assert fh.read() == theirs


@ONCE_IN_THE_IMAGE
def test_a_batch_holding_the_whole_training_set_is_noted(tiny_config, capsys):
    """One update an epoch is said in one note; a batch that leaves several says nothing."""
    run = train(tiny_config(epochs=1, batch_size=64, max_train_samples=64, max_val_samples=32))
    assert run["status"] == "completed" and run["epochs"][0]["steps"] == 1
    notes = [ln for ln in capsys.readouterr().err.splitlines() if "whole training set" in ln]
    assert notes == ["note: the global batch of 64 holds the whole training set (64 samples): "
                     "one update an epoch; a smaller --batch-size makes more (tfmp tune leaves "
                     "at least 10)"], notes
    train(tiny_config(epochs=1, batch_size=32, max_train_samples=64, max_val_samples=32,
                      output=None))
    assert "whole training set" not in capsys.readouterr().err


def test_a_run_that_failed_before_its_first_checkpoint_says_what_is_left_to_do(tmp_path):
    """A run that failed at its first step (a metric that did not fit the labels) left its
    folder; the retry said "already holds a run", and --resume "found no checkpoint"."""
    from app.core.errors import UsageError
    from app.training.resuming import check_holds_no_run

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text(json.dumps({"status": "failed"}))
    with pytest.raises(UsageError) as caught:
        check_holds_no_run(str(out))
    assert str(caught.value) == (
        f"error: output directory '{out}' holds a run that failed before its first checkpoint "
        f"(metrics.json says why): nothing to resume; allowed: a new --output, or remove that "
        f"folder (rm -r {out}) to start the run again there")
    assert (out / "metrics.json").exists()          # nothing of the user's is removed
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "ckpt-1.index").write_text("")
    with pytest.raises(UsageError, match="already holds a run; allowed: --resume"):
        check_holds_no_run(str(out))
