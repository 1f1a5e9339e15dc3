"""The two training loops, thin: they drive epochs and hand every finished epoch to the
recorder.  The steps come from ``app.training.step``, the step watching from ``app.training.monitor``.

``run_fit``: Keras' ``fit`` with one callback that has no batch hooks.
``run_custom``: a Python loop over the distributed dataset calling ``CustomSteps``.
"""
from __future__ import annotations

import contextlib
import os
import time

import tensorflow as tf

from app.training import distribute
from app.training import profiling
from app.training import step as steps


def run_fit(run, parts, recorder, monitor, start_epoch: int, skip: int = 0):
    """``run``: ``training.Prepared``; ``parts``: ``training.TrainingParts``; ``skip``: the
    batches of the first epoch a resumed run already trained."""
    cfg = run.config
    per_call = steps.fit_steps_per_execution(cfg, run.dist.replicas)
    steps.compile_for_fit(parts, cfg.jit, per_call)
    callbacks = [_EpochCallback(parts, recorder, monitor)]
    profiler = profiling.make(run)
    if profiler is not None:   # batch hooks only when profiling
        callbacks.append(profiling.ProfileCallback(profiler, per_call))
    train_ds, val_ds = run.bundle.train, run.bundle.val
    if run.dist.multi_worker:
        # Keras 2 only (Keras 3 runs multi-worker jobs in the custom loop): Keras'
        # BackupAndRestore saves after every epoch (non-chief workers into temporary
        # folders) and a restarted job continues from there.
        callbacks.append(_backup_and_restore(os.path.join(cfg.output, "backup")))
    if run.dist.spreads_batches:
        # Keras distributes the datasets itself: by data, as the custom loop does (its
        # AUTO policy tries files first and logs the pipeline's whole graph, 70 lines a
        # dataset, on TensorFlow 2.9 before falling back to data).
        train_ds, val_ds = (distribute.shard_by_data(train_ds),
                            distribute.shard_by_data(val_ds))
    verbose = 0 if recorder.plain else 1
    try:
        with monitor.polling(parts.model):
            if skip:   # the rest of the interrupted epoch, then the others
                parts.model.fit(train_ds.skip(skip), validation_data=val_ds,
                                epochs=start_epoch + 1, initial_epoch=start_epoch,
                                verbose=verbose, shuffle=False, callbacks=callbacks)
                start_epoch += 1
            if start_epoch < cfg.epochs and not parts.model.stop_training:
                parts.model.fit(train_ds, validation_data=val_ds, epochs=cfg.epochs,
                                initial_epoch=start_epoch, verbose=verbose, shuffle=False,
                                callbacks=callbacks)
    finally:
        if profiler is not None:
            profiler.stop()
    if run.dist.multi_worker:
        _remove_if_empty(os.path.join(cfg.output, "backup"))


def _remove_if_empty(folder: str) -> None:
    """BackupAndRestore empties its folder when the job completes, but a worker that removes
    its temporary folder in it after the chief removed the folder leaves it behind, empty.
    Every worker tries, so the last one to finish removes it; a folder that still holds
    anything (the other worker's temporary folder, a backup after an interruption) stays."""
    with contextlib.suppress(OSError):
        os.rmdir(folder)


class _EpochCallback(tf.keras.callbacks.Callback):
    # No batch hooks at all: Keras 2 then skips its per-batch callback machinery, and
    # neither Keras turns logs into Python numbers (a device sync) per step.  Step logs
    # come from the monitor's thread; a stop is raised at the next hook.
    def __init__(self, parts, recorder, monitor):
        super().__init__()
        self.parts, self.recorder, self.monitor = parts, recorder, monitor
        self.t0 = self.c0 = 0.0
        self.t_train = self.c_train = None
        self.trained = False

    def on_epoch_begin(self, epoch, logs=None):
        self.monitor.raise_pending()
        self.monitor.begin_epoch(epoch)
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        self.t_train = self.c_train = None
        self.trained = False   # the whole epoch trained, no stop asked before validation

    def on_test_begin(self, logs=None):
        if self.t_train is None:
            self.t_train = time.perf_counter() - self.t0
            self.c_train = time.process_time() - self.c0
        self.monitor.raise_pending()   # stopped mid-epoch: no validation, no record
        self.trained = True

    def on_epoch_end(self, epoch, logs=None):
        total, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
        if self.monitor.pending is not None or not self.trained:
            self.monitor.raise_pending()
        self.monitor.check(epoch, log=True, epoch_loss=(logs or {}).get("loss"),
                           model=self.parts.model)
        self.recorder.record_epoch(epoch, logs or {}, total, self.t_train or total,
                                   cpu if self.c_train is None else self.c_train,
                                   self.monitor.take_skipped_epoch())
        self.monitor.raise_pending()   # a signal during validation: the epoch is kept
        if self.recorder.stopping_early:
            self.model.stop_training = True


def run_custom(run, parts, recorder, monitor, start_epoch: int, skip: int = 0):
    cfg = run.config
    custom = steps.CustomSteps(parts, cfg.jit)
    train_ds = distribute.distribute_dataset(run.dist, run.bundle.train)
    val_ds = distribute.distribute_dataset(run.dist, run.bundle.val)
    n_steps = -(-run.bundle.train_samples // run.dist.global_batch)
    profiler = profiling.make(run)
    try:
        _custom_epochs(run, parts, recorder, monitor, start_epoch, custom, train_ds, val_ds,
                       n_steps, profiler, skip)
    finally:
        if profiler is not None:
            profiler.stop()


def _custom_epochs(run, parts, recorder, monitor, start_epoch, custom, train_ds, val_ds,
                   n_steps, profiler, skip: int = 0):
    cfg = run.config
    step = 0
    for epoch in range(start_epoch, cfg.epochs):
        monitor.begin_epoch(epoch)
        custom.reset()
        bar = None if recorder.plain else tf.keras.utils.Progbar(
            n_steps, stateful_metrics=["loss"] + [m.name for m in custom.train_metrics])
        t0, c0 = time.perf_counter(), time.process_time()
        batches = train_ds
        if skip and epoch == start_epoch:   # a resumed run: the rest of the epoch
            batches = distribute.distribute_dataset(run.dist, run.bundle.train.skip(skip))
        for i, batch in enumerate(batches, start=skip if epoch == start_epoch else 0):
            step += 1
            if profiler is not None:
                profiler.begin(step)
            custom.train_step(*batch)
            if profiler is not None:
                profiler.end(step)
            monitor.tick(epoch)
            if bar is not None and ((i + 1) % 10 == 0 or i + 1 == n_steps):
                bar.update(i + 1, custom.progress())
        monitor.check(epoch, log=True, epoch_loss=custom.train_loss.result(), model=parts.model)
        t_train, c_train = time.perf_counter() - t0, time.process_time() - c0
        for batch in val_ds:
            custom.eval_step(*batch)
        logs = custom.logs()
        if bar is not None:
            print(f"epoch {epoch + 1}/{cfg.epochs}: " + " ".join(
                f"{k}={float(v):.4f}" for k, v in logs.items()), flush=True)
        recorder.record_epoch(epoch, logs, time.perf_counter() - t0, t_train, c_train,
                              monitor.take_skipped_epoch())
        if recorder.stopping_early:
            break


def _backup_and_restore(backup_dir: str):
    cb = getattr(tf.keras.callbacks, "BackupAndRestore", None)
    if cb is None:  # before TF 2.8 it lived under experimental
        cb = tf.keras.callbacks.experimental.BackupAndRestore
    return cb(backup_dir=backup_dir)
