"""Checkpoints (model, optimizer with its loss-scale state, epoch counter) and the final model."""
from __future__ import annotations

import os
import shutil

import tensorflow as tf

from app.errors import UsageError
from app.loss_scale import IS_KERAS3

CHECKPOINT_DIR = "checkpoints"


class Checkpointer:
    """``write_dir``: multi-worker, a non-chief worker takes part in every save (TensorFlow
    requires it) but into its own temporary folder, deleted after each save; every worker
    restores from the chief's folder (``<output>/checkpoints``)."""

    def __init__(self, output: str, model, optimizer, write_dir=None):
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="completed_epochs")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch,
                                        step=self.step)
        self.read_dir = os.path.join(output, CHECKPOINT_DIR)
        self.temporary = write_dir is not None and write_dir != self.read_dir
        self.manager = tf.train.CheckpointManager(self.ckpt, write_dir or self.read_dir,
                                                  max_to_keep=3)

    @property
    def latest_checkpoint(self):
        return tf.train.latest_checkpoint(self.read_dir)

    def save(self, completed_epochs: int, global_step: int) -> str:
        self.epoch.assign(completed_epochs)
        self.step.assign(global_step)
        path = self.manager.save()
        if self.temporary:
            shutil.rmtree(self.manager.directory, ignore_errors=True)
        return path

    def restore_latest(self) -> int:
        """Restore the newest checkpoint; return the number of completed epochs."""
        path = self.latest_checkpoint
        if not path:
            raise UsageError(f"--resume found no checkpoint in {self.read_dir!r}",
                             "--resume with the --output of a run that saved a checkpoint")
        try:
            status = self.ckpt.restore(path)
            status.assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"checkpoint {path!r} does not match this model/optimizer ({first})",
                             "the same --model, --dataset and --precision as the run being resumed")\
                from None
        return int(self.epoch.numpy())


def has_checkpoint(output: str) -> bool:
    return tf.train.latest_checkpoint(os.path.join(output, CHECKPOINT_DIR)) is not None


def save_final_model(model, output: str) -> str:
    """Save in the running Keras' native format: ``model.keras`` on Keras 3, a SavedModel
    folder ``model/`` on Keras 2.  Written under a temporary name, then renamed."""
    if IS_KERAS3:
        final = os.path.join(output, "model.keras")
        tmp = os.path.join(output, ".model.tmp.keras")
        model.save(tmp)
        os.replace(tmp, final)
        return final
    final = os.path.join(output, "model")
    tmp = os.path.join(output, ".model.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    # The optimizer is in the checkpoints; the final model is for inference.
    model.save(tmp, include_optimizer=False)
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final
