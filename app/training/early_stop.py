"""``--early-stop N``: stop when ``val_loss`` (or ``--early-stop-on``'s number) has not
improved for N epochs in a row, and save the best epoch's weights as the model (Keras'
``EarlyStopping(patience=N, restore_best_weights=True)``, made to survive ``--resume``).

The decision is read from the run's own epoch records (metrics.json's ``epochs``, which a
resumed run continues), so it needs no state of its own: the best epoch is the first with
the lowest finite value (the highest, for accuracies and the like), and the run stops once
N epochs have passed since it.  The best epoch's weights are a checkpoint of the model
alone in ``<output>/best``, numbered by the epoch, written when an epoch improves, before
that epoch's regular checkpoint.  At the end they are restored into the model before it
is saved; if the best epoch's checkpoint is missing (it trained before a ``--resume`` gave
``--early-stop``, or the run was cut short between the two saves of that epoch), the model
saved is the last epoch's, and the run says so.
"""
from __future__ import annotations

import math
import os
import shutil
import sys
from typing import Optional

import tensorflow as tf

from app.core.errors import UsageError

BEST_DIR = "best"
MONITOR = "val_loss"
# A metric whose name holds one of these is better higher (Keras' EarlyStopping says "auto"
# mode for the same reading); any other (losses, errors, divergences, false counts) lower.
_HIGHER_IS_BETTER = ("acc", "auc", "precision", "recall", "f1", "fbeta", "iou",
                     "true_positives", "true_negatives")


def higher_is_better(monitor: str) -> bool:
    return any(k in monitor.lower() for k in _HIGHER_IS_BETTER)


def best_epoch(epochs: list, monitor: str = MONITOR) -> Optional[dict]:
    """The epoch record with the best finite ``monitor`` (the first of equals), or None."""
    up = higher_is_better(monitor)
    best = None
    for row in epochs:
        value = row.get(monitor)
        if value is None or not math.isfinite(value):
            continue
        if best is None or (value > best[monitor] if up else value < best[monitor]):
            best = row
    return best


def epochs_since_best(epochs: list, monitor: str = MONITOR) -> int:
    """Epochs recorded after the best one (all of them when none has a finite value)."""
    best = best_epoch(epochs, monitor)
    if best is None:
        return len(epochs)
    return sum(1 for row in epochs if row["epoch"] > best["epoch"])


def should_stop(epochs: list, patience: int, monitor: str = MONITOR) -> bool:
    return patience > 0 and bool(epochs) and epochs_since_best(epochs, monitor) >= patience


def stop_line(epochs: list, patience: int, saves_model: bool = True,
              monitor: str = MONITOR) -> str:
    best = best_epoch(epochs, monitor)
    if best is None:
        return (f"early stop: {monitor} has not been a finite number in {len(epochs)} "
                f"epoch(s) (--early-stop {patience})")
    line = (f"early stop: {monitor} has not improved for {patience} epoch(s) since epoch "
            f"{best['epoch']} ({best[monitor]:.4f})")
    return line + (f"; the model saved is epoch {best['epoch']}'s" if saves_model else "")


def check_monitor(monitor: str, metric_names, said: Optional[str] = None) -> None:
    """``monitor`` must be a number every epoch records: val_loss or val_<metric>.
    ``said``: how the user gave it (the flag, TFMP_EARLY_STOP_ON, app.train's keyword)."""
    allowed = ["val_loss"] + [f"val_{name}" for name in metric_names]
    if monitor not in allowed:
        raise UsageError(f"{said or '--early-stop-on'} {monitor!r} is not a number this run "
                         "records",
                         f"one of {', '.join(allowed)}")


class EarlyStop:
    """The best epoch's weights, saved as the run goes and restored at its end.

    ``write_dir``: multi-worker, a non-chief worker saves into its own temporary folder
    (TensorFlow has every worker take part in a save), removed after each save; every
    worker restores from the chief's ``<output>/best``."""

    def __init__(self, patience: int, output: str, model, write_dir: Optional[str] = None,
                 saves_model: bool = True, monitor: str = MONITOR):
        self.patience, self.saves_model, self.monitor = patience, saves_model, monitor
        self.read_dir = os.path.join(output, BEST_DIR)
        self.write_dir = write_dir or self.read_dir
        self.ckpt = tf.train.Checkpoint(model=model)
        self.manager = tf.train.CheckpointManager(self.ckpt, self.write_dir, max_to_keep=2,
                                                  checkpoint_name="epoch")
        self.stopped = False

    def after_epoch(self, epochs: list) -> bool:
        """Save the weights when the epoch just recorded is the best so far; True when the
        run should stop here."""
        best = best_epoch(epochs, self.monitor)
        if best is not None and best is epochs[-1]:
            self.manager.save(checkpoint_number=best["epoch"])
            if self.write_dir != self.read_dir:
                shutil.rmtree(self.write_dir, ignore_errors=True)
        self.stopped = should_stop(epochs, self.patience, self.monitor)
        return self.stopped

    def line(self, epochs: list) -> str:
        return stop_line(epochs, self.patience, self.saves_model, self.monitor)

    def restore_best(self, epochs: list) -> Optional[int]:
        """The best epoch's weights into the model, before it is saved; the epoch restored,
        or None (no best, or its checkpoint missing: said on stderr)."""
        best = best_epoch(epochs, self.monitor)
        if best is None or best is epochs[-1]:
            return best["epoch"] if best is not None else None   # the weights in place
        prefix = os.path.join(self.read_dir, f"epoch-{best['epoch']}")
        if not os.path.exists(prefix + ".index"):
            print(f"warning: --early-stop: the weights of the best epoch, {best['epoch']}, "
                  f"were not saved (it trained before --early-stop was given, or the run was "
                  f"cut short as it saved them); the model saved is the last epoch's, "
                  f"{epochs[-1]['epoch']}", file=sys.stderr, flush=True)
            return None
        self.ckpt.restore(prefix).expect_partial()
        return best["epoch"]

    def to_json(self, epochs: list, restored: Optional[int]) -> dict:
        """metrics.json's ``early_stop``."""
        best = best_epoch(epochs, self.monitor)
        return {"patience": self.patience, "monitor": self.monitor,
                "best_epoch": best["epoch"] if best else None,
                "best": best[self.monitor] if best else None,
                "stopped": should_stop(epochs, self.patience, self.monitor),
                "model_epoch": restored if restored is not None else
                (epochs[-1]["epoch"] if epochs else None)}
