"""What a run leaves behind: metrics.json, TensorBoard scalars, the console lines and a
checkpoint after every epoch.  The loops hand it step records and finished epochs; it
never trains."""
from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Optional

import tensorflow as tf

from app.core import files, folders
from app.precision import loss_scale
from app.core.files import finite_or_none, fmt, json_text, utc_now_iso
from app.machine.memory import peak_memory
from app.task.data import shape_json

StepCallback = Callable[[dict], None]


def _tensorboard_available() -> bool:
    # tf.summary needs the tensorboard package (in the TF 2.9 image; not a dependency of
    # every recent TF wheel).  Without it the run still works, just without event files.
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class Summaries:
    """TensorBoard scalars.

    Per-step scalars are buffered and written at the end of the epoch, after validation:
    an eager ``tf.summary.scalar`` costs milliseconds, which inside the timed training part
    of a small model's epoch measured ~10% of its throughput.
    """

    def __init__(self, logdir: str | None):
        # logdir None: a non-chief worker, which writes no TensorBoard logs.
        self.writer = (tf.summary.create_file_writer(logdir)
                       if logdir and _tensorboard_available() else None)
        self.pending: list[tuple[int, dict]] = []
        self.lock = threading.Lock()   # step records may arrive from the monitor's thread

    def scalars(self, step: int, values: dict, defer: bool = False):
        if self.writer is None:
            return
        if defer:
            with self.lock:
                self.pending.append((step, values))
        else:
            self._write(step, values)

    def _write(self, step: int, values: dict):
        with self.writer.as_default(step=step):
            for k, v in values.items():
                if v is not None:
                    tf.summary.scalar(k, v)

    def flush(self):
        if self.writer is None:
            return
        with self.lock:
            pending, self.pending = self.pending, []
        for step, values in pending:
            self._write(step, values)
        self.writer.flush()

    def close(self):
        if self.writer is not None:
            self.flush()
            self.writer.close()


def plain_lines(progress: str) -> bool:
    """Plain ``step``/``epoch`` lines instead of Keras' progress bar (logs, pipes)."""
    return progress == "lines" or (progress == "auto" and not sys.stdout.isatty())


def new_metrics(run, env: dict, loop: str) -> dict:
    """The metrics.json of a run that has not trained yet (``run``: ``training.Prepared``)."""
    bundle = run.bundle
    distribute = run.dist.to_dict()
    distribute["loop"] = loop
    return {
        "schema_version": 1,
        "status": "running",
        "config": run.config.to_dict(),
        "tuned": run.config.tuning,   # train --tuned: the tune file, what it set, the lr rule
        "task": run.task.describe(),
        "precision": run.decision.to_dict(),
        "environment": env,
        "distribute": distribute,
        # --accumulate: N micro-batches (each the distribute block's global batch) per update
        "accumulation": {"micro_batch": run.dist.global_batch,
                         "accumulate": run.config.accumulate or 1,
                         "global_batch": run.config.global_batch or run.dist.global_batch},
        "data": {"train_samples": bundle.train_samples, "val_samples": bundle.val_samples,
                 "input_shape": shape_json(bundle.input_shape), "num_classes": bundle.num_classes,
                 "label_kind": bundle.label_kind,
                 # (x, y, sample_weight): the loss weighs each sample, the metrics do not
                 **({"sample_weights": True} if bundle.weighted else {}),
                 # exact: a resumed balanced run applies them as they are
                 **({"class_weight": [float(w) for w in bundle.class_weight]}
                    if bundle.class_weight else {})},
        "epochs": [],
        "steps": [],          # every --log-every steps: loss, grad_norm, loss_scale
        "peak_memory": None,
        "model_path": None,
        "diagnosis": None,
        "started_utc": utc_now_iso(),
        "finished_utc": None,
    }


def continue_metrics(metrics: dict, previous: Optional[dict], start_epoch: int,
                     step: int) -> list:
    """A resumed run keeps the epochs and start time of the run it continues; returns that
    run's step records up to the restored ``step``."""
    if not previous:
        return []
    metrics["epochs"] = [e for e in previous.get("epochs", []) if e["epoch"] <= start_epoch]
    metrics["started_utc"] = previous.get("started_utc", metrics["started_utc"])
    return [r for r in previous.get("steps", []) if r["step"] <= step]


@dataclass(frozen=True)
class ResumedEpoch:
    """An epoch a --resume continued from a checkpoint inside it: this process trains its
    (micro-)batches after ``after_batches`` of ``batches``, so its training numbers (loss,
    the metrics, samples/s) are that part's, and its record says so."""
    epoch: int            # 0-based, as the loops count
    after_batches: int
    batches: int
    train_samples: int    # the samples of the batches this process trains

    @classmethod
    def at(cls, epoch: int, after_batches: int, batches: int, micro_batch: int,
           train_samples: int) -> Optional["ResumedEpoch"]:
        """None when the epoch starts from its first batch (nothing was skipped)."""
        if not after_batches:
            return None
        return cls(epoch, after_batches, batches,
                   max(0, train_samples - after_batches * micro_batch))

    def to_json(self) -> dict:
        return {"after_batches": self.after_batches, "batches": self.batches,
                "train_samples": self.train_samples}

    def said(self) -> str:
        rest = self.batches - self.after_batches
        return (f"resumed after {self.after_batches} of {self.batches} batches: loss, metrics "
                f"and samples/s are of the last {rest} ({self.train_samples:,} samples)")


class FolderNotHeld(RuntimeError):
    """A recorder asked to open a folder whose lock this run does not hold: a bug here,
    never the user's (the lock is taken before ``open()``)."""


class Recorder:
    """Records a run into its output folder; ``open()`` is the run's first write.

    ``parts`` (``training.TrainingParts``) gives the optimizer (loss scale, learning rate),
    the step counter and the checkpointer.  ``folder_lock``: the chief's ``RunLock`` on the
    folder.  Nothing is written before ``open()``, and ``open()`` refuses while that lock
    is not held: a run refused the folder (another's live run, another user's lock) can
    record no "failed", no "interrupted", over the metrics.json of the run that holds it."""

    def __init__(self, output: str, metrics: dict, parts, *, epochs: int, train_samples: int,
                 is_chief: bool, plain: bool, on_step: StepCallback | None = None,
                 previous_steps: Optional[list] = None, folder_lock=None):
        self.output, self.metrics, self.parts = output, metrics, parts
        self.folder_lock = folder_lock
        self.opened = False   # open() passed: the folder is this run's to write
        self.epochs, self.train_samples, self.is_chief, self.plain = (
            epochs, train_samples, is_chief, plain)
        self.on_step = on_step
        self.previous_steps = list(previous_steps or [])
        self.step_log: list[dict] = []
        self.summaries = Summaries(None)   # open() makes the real one
        self.watch = None   # the sentinel's (app.training.sentinel_watch), when it is on
        self.early = None   # --early-stop's (app.training.early_stop), when it is on
        # metrics.json's text as last written, and the lock its writers take (the main
        # thread's, and a second signal's from the watch thread: record_stop_at_once).
        self.on_disk: Optional[str] = None
        self._writing = threading.Lock()
        self.resumed: Optional[ResumedEpoch] = None   # a --resume inside an epoch

    def record_probe(self, step: int, scalars: dict):
        """The sentinel's headroom probe: a TensorBoard scalar per layer."""
        self.summaries.scalars(step, scalars, defer=True)

    def open(self) -> "Recorder":
        """Create the output folder and the TensorBoard writer (after every check passed,
        the folder's lock held)."""
        if self.is_chief and not (self.folder_lock is not None and self.folder_lock.held):
            raise FolderNotHeld(f"the run does not hold the lock on {self.output!r}")
        self.opened = True
        folders.make_folder(self.output)
        logdir = os.path.join(self.output, "tensorboard")
        self.summaries = Summaries(logdir if self.is_chief else None)
        self.metrics["tensorboard"] = logdir if self.summaries.writer is not None else None
        return self

    def record_step(self, record: dict):
        """A step record from the monitor (possibly its thread)."""
        self.step_log.append(record)
        self.summaries.scalars(record["step"], {f"step/{k}": record[k]
                                                for k in ("loss", "grad_norm", "loss_scale")},
                               defer=True)
        if self.plain:
            print(f"step {record['step']}: loss={fmt(record['loss'])} "
                  f"grad_norm={fmt(record['grad_norm'], '.4g')} "
                  f"loss_scale={record['loss_scale']:g} skipped={record['skipped_steps']}",
                  flush=True)
        if self.on_step:
            self.on_step(record)

    def record_epoch(self, epoch: int, logs: dict, epoch_seconds: float, train_seconds: float,
                     train_cpu_seconds: float, skipped_steps: int):
        """One finished epoch: its row in metrics.json, TensorBoard, a checkpoint, a line."""
        # loss, val_loss and each of the task's metrics with its val_ twin (accuracy for the
        # built-ins), in the order Keras reports them.
        named = {"loss": finite_or_none(logs.get("loss")), **{
            k: finite_or_none(v) for k, v in logs.items()
            if k != "loss" and not k.startswith("val_")}}
        named.update({"val_" + k: finite_or_none(logs.get("val_" + k)) for k in list(named)})
        opt, steps = self.parts.optimizer, int(self.parts.stats.steps.numpy())
        resumed = self.resumed if self.resumed is not None and self.resumed.epoch == epoch else None
        trained = resumed.train_samples if resumed else self.train_samples
        row = {
            "epoch": epoch + 1,
            **named,
            "epoch_seconds": round(epoch_seconds, 4), "train_seconds": round(train_seconds, 4),
            # the samples this process trained in train_seconds (a resumed epoch: its rest)
            "samples_per_second": round(trained / max(train_seconds, 1e-9), 2),
            # CPU time of the whole process (every thread) over the same span: unlike the
            # wall clock it does not grow while the machine gives the job less CPU.
            "train_cpu_seconds": round(train_cpu_seconds, 4),
            "loss_scale": float(loss_scale.current_loss_scale(opt)),
            "skipped_steps": skipped_steps,
            "steps": steps,
            "learning_rate": learning_rate(opt),
            **({"resumed": resumed.to_json()} if resumed else {}),
        }
        self.metrics["epochs"].append(row)
        self.summaries.scalars(epoch + 1, {f"epoch/{k}": v for k, v in row.items() if k not in (
            "epoch", "epoch_seconds", "train_seconds", "train_cpu_seconds", "steps", "resumed")})
        self.summaries.flush()
        # The best weights before the epoch's checkpoint: a run resumed from that checkpoint
        # finds them saved.
        stop = self.early is not None and self.early.after_epoch(self.metrics["epochs"])
        self.parts.checkpointer.save(epoch + 1, steps)
        self.write_metrics()
        if self.plain:
            values = " ".join(f"{k}={fmt(v)}" for k, v in named.items())
            print(f"epoch {row['epoch']}/{self.epochs}: {values} "
                  f"{row['samples_per_second']:.0f} samples/s "
                  f"loss_scale={row['loss_scale']:g} skipped={row['skipped_steps']}"
                  + (f" ({resumed.said()})" if resumed else ""), flush=True)
        elif resumed:   # under Keras' progress bar, or the custom loop's line
            print(f"epoch {row['epoch']}/{self.epochs}: {resumed.said()}", flush=True)
        if stop and epoch + 1 < self.epochs:
            print(self.early.line(self.metrics["epochs"]), flush=True)

    @property
    def stopping_early(self) -> bool:
        """--early-stop: the epoch just recorded is the last one to train."""
        return self.early is not None and self.early.stopped

    def write_metrics(self):
        if not self.is_chief:
            return  # multi-worker: only the chief writes metrics.json
        if not self.opened:
            return  # the folder is not this run's (yet): a refused run writes nothing
        self.metrics["peak_memory"] = peak_memory()
        self.metrics["numerics"] = numerics_block(self.metrics, self.watch)
        self.metrics["steps"] = (self.previous_steps + self.step_log)[-1000:]
        self._write(json_text(self.metrics))
        # After each checkpoint, the final model and a fault's state: the folders
        # TensorFlow made for them as the umask says (a team's shared run folder).
        folders.follow_umask(self.output)

    def _write(self, text: str) -> None:
        with self._writing:
            self._put(text)

    def _put(self, text: str) -> None:
        """metrics.json replaced by ``text`` (the caller holds ``_writing``); only once
        ``open()`` passed (a second signal's record comes from another thread)."""
        if not self.opened:
            return
        files.write_atomic(os.path.join(self.output, "metrics.json"), text)
        self.on_disk = text

    def record_stop_at_once(self, signum: int, resume_from: Optional[str]) -> None:
        """A second signal ends the process now (called on the signal watch's thread,
        app/core/signals.py): metrics.json as last written, with the status "interrupted"
        where it says "running", and the checkpoint --resume continues from.  Built from the
        text on disk, not from the live dict or TensorFlow, which a stuck main thread may
        hold; a write in progress is waited for a second at most.  Nothing when no
        metrics.json exists yet: a rerun then starts the run over in the same folder."""
        if not self._writing.acquire(timeout=1.0):
            return
        try:
            if self.on_disk is None:
                return
            doc = json.loads(self.on_disk)
            if doc.get("status") != "running":   # the run's end was recorded already
                return
            doc.update(status="interrupted", signal=signum, finished_utc=utc_now_iso(),
                       stopped_at_once={"resume_from": resume_from})
            self._put(json_text(doc))
        finally:
            self._writing.release()

    def finish(self, status: str, **facts):
        """The run's end: its status (and e.g. a diagnosis), the time, metrics.json."""
        self.metrics["status"] = status
        self.metrics.update(facts)
        self.metrics["finished_utc"] = utc_now_iso()
        self.write_metrics()

    def close(self):
        self.summaries.close()


def learning_rate(opt):
    """The optimizer's current learning rate (schedules evaluated at its step), or None."""
    inner = getattr(opt, "inner_optimizer", opt)
    lr = getattr(inner, "learning_rate", None)
    try:
        if callable(lr) and not isinstance(lr, tf.Variable):
            lr = lr(inner.iterations)
        return finite_or_none(lr)
    except Exception:  # an exotic schedule: leave it out rather than fail the epoch
        return None


def numerics_block(metrics: dict, watch) -> dict:
    """metrics.json's ``numerics``: what the sentinel (``watch``, None when off) saw; a fault
    already recorded there is kept."""
    before = metrics.get("numerics") or {}
    if watch is None:
        return {"sentinel": False, **before}
    skipped = sum(e.get("skipped_steps", 0) for e in metrics["epochs"])
    now = watch.to_json(skipped)
    now.update({k: v for k, v in before.items() if k in ("fault", "checkpoint")})
    return now
