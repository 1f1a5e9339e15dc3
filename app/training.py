"""Training: ``train(config)`` runs a whole job and returns the metrics dict.

Order of work (nothing is written before every input has been checked):
  1. validate the config, resolve the precision, load the data, check the output folder
     and, with --resume, the checkpoint;
  2. inside ``get_strategy().scope()``: set the policy, build the model and the optimizer
     (wrapped in a LossScaleOptimizer for mixed_float16);
  3. run ``--loop fit`` (Keras fit) or ``--loop custom`` (GradientTape step), saving a
     checkpoint and metrics.json after every epoch;
  4. save the final model.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Callable

import numpy as np
import tensorflow as tf

from app import checkpointing, distribute, envreport, hardware as hw_mod
from app import loss_scale, output_faults
from app import precision as prec
from app.config import (TrainConfig, check_output_writable, data_dir_chosen, default_data_dir,
                        default_output, validate)
from app.errors import (MixedPrecisionClash, TrainingDiverged, TrainingInterrupted, UsageError,
                        UserCodeError)
from app.tasks import Task
from app.reporting import peak_memory, utc_now_iso, write_json_atomic

StepCallback = Callable[[dict], None]


def _tensorboard_available() -> bool:
    # tf.summary needs the tensorboard package (in the TF 2.9 image; not a dependency of
    # every recent TF wheel).  Without it the run still works, just without event files.
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class _Summaries:
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


DIAGNOSIS = (
    "the loss or the gradients became non-finite and loss scaling could not recover. "
    "Try, in order: lower --learning-rate (e.g. by 10x); check the data for NaN/inf or "
    "unnormalised inputs (inputs should be float32 in [0, 1]); keep BatchNormalization, "
    "softmax and the loss in float32 (the built-in models do); if it only happens with "
    "mixed_float16, compare with --precision float32 or mixed_bfloat16."
)


def get_strategy(dist: distribute.Distribution | None = None) -> tf.distribute.Strategy:
    """The distribution strategy chosen by ``--strategy`` (see ``app.distribute``); the
    default one-device strategy when none was set up."""
    return dist.strategy if dist is not None else tf.distribute.get_strategy()


# ---- interruption ---------------------------------------------------------------------------

class _StopFlag:
    """SIGTERM/SIGINT set a flag and ``model.stop_training``: Keras' fit ends the epoch
    after the running batch (it checks that attribute after every batch, no callback of
    ours runs per step), and the next hook (``on_test_begin``/``on_epoch_end``) raises
    ``TrainingInterrupted``; the custom loop checks the flag after every step."""

    def __init__(self):
        self.signum: int | None = None
        self.model = None          # set once built: the model whose fit to stop

    def __call__(self, signum, frame):
        if self.signum is None:
            print(f"\nreceived signal {signum}: saving a checkpoint and stopping after this step",
                  file=sys.stderr, flush=True)
        self.signum = signum
        if self.model is not None:
            self.model.stop_training = True

    def check(self):
        if self.signum is not None:
            raise TrainingInterrupted(self.signum)


@contextlib.contextmanager
def _signal_handlers(flag: _StopFlag):
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, flag) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ---- step monitoring (both loops) -----------------------------------------------------------

class _Monitor:
    """Bookkeeping shared by both loops, off the per-step path.

    The train step itself writes a log row every ``log_every`` steps into
    ``StepStats`` (in the graph).  ``drain()`` turns new rows into step records (on_step,
    the plain ``step N:`` lines, TensorBoard); ``check()`` also counts skipped steps and
    stops a run whose gradients stay non-finite.  In ``--loop fit`` a small thread
    (``polling``) drains every ``poll_seconds`` while Keras trains; on a divergence it sets
    ``model.stop_training`` and the error is raised at the next hook in the main thread
    (``raise_pending``).  The custom loop calls ``tick()`` after every step: a flag test
    and a counter, with a drain every ``log_every`` steps."""

    poll_seconds = 0.25

    def __init__(self, cfg: TrainConfig, loss_scaled: bool, writer, on_step: StepCallback | None,
                 opt, stats: loss_scale.StepStats, stop: _StopFlag, plain: bool):
        self.cfg, self.loss_scaled, self.writer = cfg, loss_scaled, writer
        self.on_step, self.opt, self.stats, self.stop, self.plain = on_step, opt, stats, stop, plain
        self.calls = 0
        self.global_step = 0
        self.skipped_seen = 0
        self.skipped_epoch = 0
        self.step_log: list[dict] = []
        self.epoch = 0
        self.rows_seen = int(stats.log_count.numpy())
        self.lock = threading.RLock()
        self.pending: BaseException | None = None

    # every step of the custom loop
    def tick(self, epoch: int):
        if self.stop.signum is not None:
            raise TrainingInterrupted(self.stop.signum)
        self.calls += 1
        if self.calls % self.cfg.log_every == 0:
            self.check(epoch, log=True)

    def begin_epoch(self, epoch: int):
        with self.lock:   # rows not yet drained belong to the epoch that just ended
            self.epoch = epoch

    def check(self, epoch: int, log: bool = False, epoch_loss=None, model=None):
        """Skipped steps and divergence (raises TrainingDiverged); with ``log``, the step
        records written since the last drain.  Main thread, between steps.  At the end of
        an epoch, ``epoch_loss`` (its running loss) and ``model``: without loss scaling a
        non-finite loss, or weights that a step with a finite loss but non-finite gradients
        poisoned, is divergence even when no logging step came after it (with loss
        scaling, skipped steps' losses are non-finite by design and weights stay clean)."""
        st = self.stats
        if log:
            self.drain()
        self.global_step = int(st.steps.numpy())
        if not self.loss_scaled and ((epoch_loss is not None and _f(epoch_loss) is None)
                                     or (model is not None and not _weights_finite(model))):
            st.nonfinite_total.assign_add(1)
        total = int(st.nonfinite_total.numpy())
        self.skipped_epoch += total - self.skipped_seen
        self.skipped_seen = total
        problem = self._divergence(epoch, total, int(st.max_consecutive.numpy()))
        st.max_consecutive.assign(st.consecutive)
        if problem:
            raise TrainingDiverged(problem)

    def _divergence(self, epoch: int, total: int, worst_run: int) -> str | None:
        if not (total and not self.loss_scaled) and worst_run <= self.cfg.max_skipped_steps:
            return None
        where = f"step {int(self.stats.steps.numpy())} (epoch {epoch + 1})"
        if total and not self.loss_scaled:
            return (f"{where}: non-finite loss/gradients under {prec.global_policy_name()}, "
                    "which has no loss scaling to recover with")
        if worst_run > self.cfg.max_skipped_steps:
            return (f"{where}: {worst_run} steps in a row had non-finite gradients (more than "
                    f"--max-skipped-steps {self.cfg.max_skipped_steps}; loss scale now "
                    f"{float(loss_scale.current_loss_scale(self.opt)):g})")
        return None

    def drain(self):
        with self.lock:
            rows, self.rows_seen, lost = self.stats.read_log(self.rows_seen)
            if lost:
                print(f"note: {lost} step log record(s) were overwritten before they were read",
                      file=sys.stderr, flush=True)
            for row in rows:
                self._emit(row)

    def _emit(self, row: dict):
        record = {
            "step": int(row["step"]), "epoch": self.epoch + 1,
            "loss": _f(row["loss"]), "grad_norm": _f(row["grad_norm"]),
            "loss_scale": float(row["loss_scale"]),
            "skipped_steps": int(row["skipped_steps"]),
        }
        self.step_log.append(record)
        self.writer.scalars(record["step"], {f"step/{k}": record[k]
                                             for k in ("loss", "grad_norm", "loss_scale")},
                            defer=True)
        if self.plain:
            print(f"step {record['step']}: loss={_fmt(record['loss'])} "
                  f"grad_norm={_fmt(record['grad_norm'], '.4g')} "
                  f"loss_scale={record['loss_scale']:g} skipped={record['skipped_steps']}",
                  flush=True)
        if self.on_step:
            self.on_step(record)

    # --loop fit: a thread instead of a per-batch hook
    @contextlib.contextmanager
    def polling(self, model):
        done = threading.Event()

        def poll():
            while not done.wait(self.poll_seconds):
                try:
                    self.drain()
                    st = self.stats
                    problem = self._divergence(self.epoch, int(st.nonfinite_total.numpy()),
                                               int(st.max_consecutive.numpy()))
                except BaseException as exc:  # e.g. the user's on_step raised
                    problem = exc
                if problem:
                    self.pending = (problem if isinstance(problem, BaseException)
                                    else TrainingDiverged(problem))
                    model.stop_training = True
                    return
        thread = threading.Thread(target=poll, name="tfmp-step-log", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def raise_pending(self):
        """In the main thread, at a hook: a stop the signal handler or the thread asked for."""
        if self.pending is not None:
            raise self.pending
        self.stop.check()


def _weights_finite(model) -> bool:
    """One pass over the trainable weights, once an epoch."""
    checks = [tf.reduce_all(tf.math.is_finite(v)) for v in model.trainable_variables]
    return bool(tf.reduce_all(tf.stack(checks))) if checks else True


def _fmt(v, spec=".4f"):
    return "nan/inf" if v is None else format(v, spec)


# ---- the run --------------------------------------------------------------------------------

class _Run:
    def __init__(self, cfg: TrainConfig, task: Task, decision, bundle, output: str, on_step,
                 env: dict, dist: distribute.Distribution):
        self.cfg, self.task, self.decision, self.bundle, self.output = (cfg, task, decision,
                                                                        bundle, output)
        self.on_step, self.env, self.dist = on_step, env, dist
        self.plain = (cfg.verbose == "lines") or (cfg.verbose == "auto" and not sys.stdout.isatty())
        self.previous_steps: list = []
        self.metrics = {
            "schema_version": 1,
            "status": "running",
            "config": cfg.to_dict(),
            "task": task.describe(),
            "precision": decision.to_dict(),
            "environment": env,
            "distribute": dist.to_dict(),
            "data": {"train_samples": bundle.train_samples, "val_samples": bundle.val_samples,
                     "input_shape": list(bundle.input_shape), "num_classes": bundle.num_classes,
                     "label_kind": bundle.label_kind},
            "epochs": [],
            "steps": [],          # every --log-every steps: loss, grad_norm, loss_scale
            "peak_memory": None,
            "model_path": None,
            "diagnosis": None,
            "started_utc": utc_now_iso(),
            "finished_utc": None,
        }

    # metrics.json ----------------------------------------------------------------------------
    def write_metrics(self):
        if not self.dist.is_chief:
            return  # multi-worker: only the chief writes metrics.json
        self.metrics["peak_memory"] = peak_memory()
        monitor = getattr(self, "monitor", None)
        self.metrics["steps"] = (self.previous_steps + (monitor.step_log if monitor else []))[-1000:]
        write_json_atomic(os.path.join(self.output, "metrics.json"), self.metrics)

    def record_epoch(self, epoch: int, logs: dict, epoch_seconds: float, train_seconds: float,
                     train_cpu_seconds: float):
        # loss, val_loss and each of the task's metrics with its val_ twin (accuracy for the
        # built-ins), in the order Keras reports them.
        named = {"loss": _f(logs.get("loss")), **{
            k: _f(v) for k, v in logs.items() if k != "loss" and not k.startswith("val_")}}
        named.update({"val_" + k: _f(logs.get("val_" + k)) for k in list(named)})
        row = {
            "epoch": epoch + 1,
            **named,
            "epoch_seconds": round(epoch_seconds, 4), "train_seconds": round(train_seconds, 4),
            "samples_per_second": round(self.bundle.train_samples / max(train_seconds, 1e-9), 2),
            # CPU time of the whole process (every thread) over the same span: unlike the
            # wall clock it does not grow while the machine gives the job less CPU.
            "train_cpu_seconds": round(train_cpu_seconds, 4),
            "loss_scale": float(loss_scale.current_loss_scale(self.opt)),
            "skipped_steps": self.monitor.skipped_epoch,
            "steps": int(self.stats.steps.numpy()),
            "learning_rate": _learning_rate(self.opt),
        }
        self.metrics["epochs"].append(row)
        self.monitor.skipped_epoch = 0
        self.writer.scalars(epoch + 1, {f"epoch/{k}": v for k, v in row.items() if k not in (
            "epoch", "epoch_seconds", "train_seconds", "train_cpu_seconds", "steps")})
        self.writer.flush()
        self.ckpt.save(epoch + 1, int(self.stats.steps.numpy()))
        self.write_metrics()
        if self.plain:
            values = " ".join(f"{k}={_fmt(v)}" for k, v in named.items())
            print(f"epoch {row['epoch']}/{self.cfg.epochs}: {values} "
                  f"{row['samples_per_second']:.0f} samples/s "
                  f"loss_scale={row['loss_scale']:g} skipped={row['skipped_steps']}", flush=True)

    # set-up ----------------------------------------------------------------------------------
    def build(self, stop: _StopFlag):
        cfg = self.cfg
        tf.keras.utils.set_random_seed(cfg.seed)
        prec.apply_policy(self.decision.policy)
        self.strategy = get_strategy(self.dist)
        with self.strategy.scope():
            self.built = self.task.build(self.bundle, self.bundle.sample_batch)
            self.model = self.built.model
            opt = self.built.optimizer or tf.keras.optimizers.Adam(learning_rate=cfg.learning_rate)
            if not loss_scale.is_loss_scaled(opt):
                opt = loss_scale.wrap_optimizer(opt, self.decision.policy,
                                                initial_scale=cfg.initial_loss_scale)
            self.opt = opt
            loss_scale.build_optimizer(self.opt, self.model.trainable_variables)
        for note in self.built.notes:
            print(f"note: {note}", file=sys.stderr, flush=True)
        for warning in self.built.warnings:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        self.loss_scaled = loss_scale.is_loss_scaled(self.opt)
        ckpt_dir = os.path.join(self.output, checkpointing.CHECKPOINT_DIR)
        self.ckpt = checkpointing.Checkpointer(self.output, self.model, self.opt,
                                               write_dir=self.dist.write_dir(ckpt_dir))
        self.stats = loss_scale.StepStats(log_every=cfg.log_every)
        self.stop = stop
        stop.model = self.model

    def open_outputs(self):
        """The first thing that writes into the output folder (after any --resume check)."""
        os.makedirs(self.output, exist_ok=True)
        self.writer = _Summaries(os.path.join(self.output, "tensorboard")
                                 if self.dist.is_chief else None)
        self.metrics["tensorboard"] = (os.path.join(self.output, "tensorboard")
                                       if self.writer.writer is not None else None)

    def make_monitor(self):
        self.monitor = _Monitor(self.cfg, self.loss_scaled, self.writer, self.on_step, self.opt,
                                self.stats, self.stop, self.plain)
        self.monitor.global_step = int(self.stats.steps.numpy())

    # loops -----------------------------------------------------------------------------------
    def compile_for_fit(self):
        """Compile the model for Keras' fit with the task's loss and metrics, the step
        statistics recorded inside the train step (tests/benchmarks time exactly this)."""
        loss_metric = _LossMetric(self.model)
        self.stats.attach_to(self.opt, loss=loss_metric.result)
        extra = {"jit_compile": True} if self.cfg.jit else {}  # else Keras' own default
        with self.strategy.scope():  # Keras 2: metric objects must come from the model's scope
            metrics = self.built.make_metrics()
        self.model.compile(optimizer=self.opt, loss=self.built.loss, metrics=metrics,
                           steps_per_execution=self.cfg.steps_per_execution, **extra)

    def run_fit(self, start_epoch: int):
        run = self
        self.compile_for_fit()

        class _Callback(tf.keras.callbacks.Callback):
            # No batch hooks at all: Keras 2 then skips its per-batch callback machinery,
            # and neither Keras turns logs into Python numbers (a device sync) per step.
            # Step logs come from the monitor's thread; a stop is raised at the next hook.
            def on_epoch_begin(self, epoch, logs=None):
                run.monitor.raise_pending()
                run.monitor.begin_epoch(epoch)
                self.t0, self.c0 = time.perf_counter(), time.process_time()
                self.t_train = self.c_train = None
                self.trained = False   # the whole epoch trained, no stop asked before validation

            def on_test_begin(self, logs=None):
                if self.t_train is None:
                    self.t_train = time.perf_counter() - self.t0
                    self.c_train = time.process_time() - self.c0
                run.monitor.raise_pending()   # stopped mid-epoch: no validation, no record
                self.trained = True

            def on_epoch_end(self, epoch, logs=None):
                total, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
                if run.monitor.pending is not None or not self.trained:
                    run.monitor.raise_pending()
                run.monitor.check(epoch, log=True, epoch_loss=(logs or {}).get("loss"),
                                  model=run.model)
                run.record_epoch(epoch, logs or {}, total, self.t_train or total,
                                 cpu if self.c_train is None else self.c_train)
                run.monitor.raise_pending()   # a signal during validation: the epoch is kept

        callbacks = [_Callback()]
        train_ds, val_ds = self.bundle.train, self.bundle.val
        if self.dist.multi_worker:
            # Keras 2 only (Keras 3 runs multi-worker jobs in the custom loop): Keras'
            # BackupAndRestore saves after every epoch (non-chief workers into temporary
            # folders) and a restarted job continues from there.
            callbacks.append(_backup_and_restore(os.path.join(self.output, "backup")))
            train_ds, val_ds = (_shard_by_data(train_ds), _shard_by_data(val_ds))
        self.make_monitor()
        with self.monitor.polling(self.model):
            self.model.fit(train_ds, validation_data=val_ds, epochs=self.cfg.epochs,
                           initial_epoch=start_epoch, verbose=0 if self.plain else 1,
                           shuffle=False, callbacks=callbacks)

    def run_custom(self, start_epoch: int):
        model, opt, strategy = self.model, self.opt, self.strategy
        # Per-example losses (the task's, on float32 predictions), averaged over the *global*
        # batch (compute_average_loss): the replicas' gradients are summed by the all-reduce.
        loss_fn = self.built.loss
        with strategy.scope():
            train_loss = tf.keras.metrics.Mean()
            val_loss = tf.keras.metrics.Mean()
            train_metrics = self.built.make_metrics()
            val_metrics = self.built.make_metrics()

        def step_fn(x, y):
            with tf.GradientTape() as tape:
                preds = model(x, training=True)
                per_example = loss_fn(y, preds)          # float32 (cast inside if needed)
                loss = tf.nn.compute_average_loss(per_example)
                if model.losses:  # regularization, split over the replicas like fit does
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
                scaled = loss_scale.scale_loss(opt, loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            applied = loss_scale.unscale_and_apply(opt, grads, model.trainable_variables)
            train_loss.update_state(tf.reduce_mean(per_example))
            # the log row reads the running loss
            self.stats.record(applied.grads, applied.skipped, applied.divide_by,
                              loss=lambda: loss_scale.metric_mean(train_loss),
                              loss_scale=lambda: loss_scale.current_loss_scale(opt))
            for m in train_metrics:
                m.update_state(y, preds)

        @tf.function(jit_compile=bool(self.cfg.jit) or None)
        def train_step(x, y):
            return strategy.run(step_fn, args=(x, y))

        def eval_fn(x, y):
            preds = model(x, training=False)
            val_loss.update_state(tf.reduce_mean(loss_fn(y, preds)))
            for m in val_metrics:
                m.update_state(y, preds)

        @tf.function
        def eval_step(x, y):
            return strategy.run(eval_fn, args=(x, y))

        train_ds = distribute.distribute_dataset(self.dist, self.bundle.train)
        val_ds = distribute.distribute_dataset(self.dist, self.bundle.val)

        self.make_monitor()
        for epoch in range(start_epoch, self.cfg.epochs):
            self.monitor.begin_epoch(epoch)
            for m in (train_loss, val_loss, *train_metrics, *val_metrics):
                m.reset_state() if hasattr(m, "reset_state") else m.reset_states()
            steps = -(-self.bundle.train_samples // self.dist.global_batch)
            bar = None if self.plain else tf.keras.utils.Progbar(
                steps, stateful_metrics=["loss"] + [m.name for m in train_metrics])
            t0, c0 = time.perf_counter(), time.process_time()
            for i, (x, y) in enumerate(train_ds):
                train_step(x, y)
                self.monitor.tick(epoch)
                if bar is not None and ((i + 1) % 10 == 0 or i + 1 == steps):
                    bar.update(i + 1, [("loss", float(train_loss.result()))] + [
                        (m.name, float(m.result())) for m in train_metrics])
            self.monitor.check(epoch, log=True, epoch_loss=train_loss.result(), model=model)
            t_train, c_train = time.perf_counter() - t0, time.process_time() - c0
            for x, y in val_ds:
                eval_step(x, y)
            logs = {"loss": train_loss.result(),
                    **{m.name: m.result() for m in train_metrics},
                    "val_loss": val_loss.result(),
                    **{"val_" + m.name: m.result() for m in val_metrics}}
            if bar is not None:
                print(f"epoch {epoch + 1}/{self.cfg.epochs}: " + " ".join(
                    f"{k}={float(v):.4f}" for k, v in logs.items()), flush=True)
            self.record_epoch(epoch, logs, time.perf_counter() - t0, t_train, c_train)


def _backup_and_restore(backup_dir: str):
    cb = getattr(tf.keras.callbacks, "BackupAndRestore", None)
    if cb is None:  # before TF 2.8 it lived under experimental
        cb = tf.keras.callbacks.experimental.BackupAndRestore
    return cb(backup_dir=backup_dir)


def _shard_by_data(dataset):
    # In-memory datasets have no files to shard by; say so, instead of a warning per run.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


class _LossMetric:
    """The running mean of the training loss that Keras' fit keeps (both Kerases name it 'loss')."""

    def __init__(self, model):
        self.model = model

    def result(self):
        for m in self.model.metrics:
            if m.name == "loss":
                return loss_scale.metric_mean(m)
        return float("nan")


def _f(v):
    if v is None:
        return None
    try:
        v = float(np.asarray(v))
    except (TypeError, ValueError):  # a metric with a non-scalar result
        return None
    return v if np.isfinite(v) else None  # JSON has no NaN/inf


def _clash(exc: BaseException, policy: str, task: Task):
    """check's diagnosis for a 16-bit/float32 clash under a mixed policy, else None."""
    from app import dtype_clash

    if policy == "float32" or not dtype_clash.is_dtype_clash(exc):
        return None
    return dtype_clash.describe(exc, policy, "" if task.model.builtin else task.model.spec)


def _learning_rate(opt):
    """The optimizer's current learning rate (schedules evaluated at its step), or None."""
    inner = getattr(opt, "inner_optimizer", opt)
    lr = getattr(inner, "learning_rate", None)
    try:
        if callable(lr) and not isinstance(lr, tf.Variable):
            lr = lr(inner.iterations)
        return _f(lr)
    except Exception:  # an exotic schedule: leave it out rather than fail the epoch
        return None


# ---- public API -------------------------------------------------------------------------------

def prepare(cfg: TrainConfig, hardware=None, output_explicit: bool | None = None,
            task: Task | None = None):
    """Check everything, set up the strategy and load the data; writes nothing.
    Returns (hardware, decision, task, bundle, output, distribution)."""
    validate(cfg)
    hw = hardware or hw_mod.detect()
    decision = prec.resolve(cfg.precision, hw)
    # Before the data: the strategy must exist before TensorFlow's first tensor.
    dist = distribute.setup(cfg.strategy, cfg.batch_size, len(hw.gpus))
    if cfg.resume and not cfg.output:
        raise UsageError("--resume needs --output (or TFMP_OUTPUT) naming the run to continue",
                         "--resume --output <folder of the interrupted run>")
    output = cfg.output or default_output(cfg, decision.policy)
    check_output_writable(output)
    if dist.multi_worker and checkpointing.has_checkpoint(output):
        # Multi-worker jobs are restarted by a cluster manager with the same command: like
        # Keras' BackupAndRestore, continue from the last backup instead of starting over.
        cfg.resume = True
    if cfg.resume and not checkpointing.has_checkpoint(output):
        raise UsageError(f"--resume found no checkpoint in {os.path.join(output, 'checkpoints')!r}",
                         "--resume with the --output of a run that saved a checkpoint")
    if not cfg.resume and dist.is_chief and os.path.exists(os.path.join(output, "metrics.json")):
        raise UsageError(f"output directory {output!r} already holds a run",
                         "--resume to continue it, or a new --output")
    task = task or Task.from_config(cfg)
    if cfg.resume:
        check_same_task(output, task)
    bundle = task.load_data(dist.global_batch, cfg.data_dir or default_data_dir(cfg.workspace),
                            image_dir=cfg.image_dir, max_train_samples=cfg.max_train_samples,
                            max_val_samples=cfg.max_val_samples, seed=cfg.seed,
                            offline=cfg.offline, data_dir_explicit=data_dir_chosen(cfg))
    return hw, decision, task, bundle, output, dist


def check_same_task(output: str, task: Task) -> None:
    """--resume continues the same job: a run whose model, dataset, loss or metrics spec
    changed would restore weights into something else (or fail deep in TensorFlow)."""
    import json

    path = os.path.join(output, "metrics.json")
    try:
        with open(path, encoding="utf-8") as fh:
            previous = json.load(fh)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path!r} cannot be read ({type(exc).__name__}); the run cannot be "
                         "resumed safely", "restore it from a copy, or start a new --output")\
            from None
    before = previous.get("task") if isinstance(previous, dict) else None
    if not isinstance(before, dict):
        before = {"model": previous.get("config", {}).get("model"),
                  "dataset": previous.get("config", {}).get("dataset")} \
            if isinstance(previous, dict) else {}
    now = task.describe()
    changed = [k for k in ("model", "dataset", "loss", "metrics") if k in before
               and before.get(k) != now.get(k)]
    if changed:
        what = ", ".join(f"{k} {before.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise UsageError(f"--resume: the run in {output!r} was trained with a different spec ({what})",
                         "the same --model, --dataset, --loss and --metrics as the run being "
                         "resumed, or a new --output")


def train(config: TrainConfig, on_step: StepCallback | None = None, hardware=None,
          announce: bool = True, task: Task | None = None) -> dict:
    """Run a training job; return the metrics dict (also written to <output>/metrics.json).

    ``on_step`` is called every ``config.log_every`` steps with
    ``{"step", "epoch", "loss", "grad_norm", "loss_scale", "skipped_steps"}``.
    ``metrics["status"]`` is ``completed``, ``interrupted`` (SIGTERM/SIGINT; a checkpoint was
    saved, rerun with ``resume=True``) or ``diverged`` (see ``metrics["diagnosis"]``).
    Bad input raises ``app.errors.UsageError`` before anything is written.
    """
    cfg = config
    hw, decision, task, bundle, output, dist = prepare(cfg, hardware, task=task)
    if announce:
        prec.announce(decision)
        print(dist.describe(), flush=True)
    loop = cfg.loop
    if dist.multi_worker and loss_scale.IS_KERAS3 and loop == "fit":
        # Keras 3's fit has no multi-worker-aware BackupAndRestore (it neither syncs nor uses
        # worker temp folders); the custom loop's checkpoints are the backup.  docs/distributed.md
        print("note: multi-worker training on Keras 3 runs the custom loop (--loop custom); "
              "its per-epoch checkpoints are the backup a restarted job resumes from",
              file=sys.stderr, flush=True)
        loop = "custom"
    env = envreport.collect(hw)
    cfg.output = output
    previous = None
    if cfg.resume:
        import json

        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(output, "metrics.json"), encoding="utf-8") as fh:
                previous = json.load(fh)
    run = _Run(cfg, task, decision, bundle, output, on_step, env, dist)
    run.metrics["distribute"]["loop"] = loop
    stop = _StopFlag()
    old_policy = prec.global_policy_name()
    try:
        with _signal_handlers(stop):
            try:
                run.build(stop)
            except UserCodeError as exc:
                clash = _clash(exc.original, decision.policy, task)
                if clash:
                    raise MixedPrecisionClash(clash) from None
                raise
            start = 0
            if cfg.resume:
                start = run.ckpt.restore_latest()  # UsageError if incompatible: nothing written
                run.stats.steps.assign(run.ckpt.step)
                if previous:
                    run.metrics["epochs"] = [e for e in previous.get("epochs", [])
                                             if e["epoch"] <= start]
                    run.metrics["started_utc"] = previous.get("started_utc", run.metrics["started_utc"])
                    run.previous_steps = [r for r in previous.get("steps", [])
                                          if r["step"] <= int(run.ckpt.step.numpy())]
                print(f"resuming from {run.ckpt.restored_path} at epoch {start + 1}",
                      file=sys.stderr)
            try:
                _run_and_record(run, cfg, dist, output, loop, start, decision, task)
            except Exception as exc:
                code = output_faults.classify(exc)
                if code is None:
                    raise
                raise _output_fault(run, exc, code, output) from None
    finally:
        prec.apply_policy(old_policy)
    return run.metrics


def _output_fault(run: "_Run", exc: BaseException, code: int, output: str):
    """Clean up after a failed write and describe it (see app/output_faults.py)."""
    ckpt_dir = os.path.join(output, checkpointing.CHECKPOINT_DIR)
    output_faults.remove_partial_checkpoints(ckpt_dir)
    latest = checkpointing.newest_complete(ckpt_dir)
    hint = (f"run the same command with --resume to continue from {os.path.basename(latest)}"
            if latest else "run the same command again (no checkpoint was completed)")
    fault = output_faults.OutputFault(output_faults.path_of(exc, output), code,
                                      f"{type(exc).__name__}", hint)
    run.metrics["status"] = "failed"
    run.metrics["diagnosis"] = fault.line()[len("error: "):]
    run.metrics["finished_utc"] = utc_now_iso()
    with contextlib.suppress(Exception):   # the disk may still be full: best effort
        run.write_metrics()
    with contextlib.suppress(Exception):
        run.writer.close()
    return fault


def _run_and_record(run: "_Run", cfg, dist, output, loop, start, decision, task):
    """The loop, the final model and metrics.json; every write in here may fail (disk full)."""
    run.open_outputs()
    try:
        if start < cfg.epochs:
            (run.run_fit if loop == "fit" else run.run_custom)(start)
        run.metrics["status"] = "completed"
        if cfg.save_model:
            # Every worker saves (saving may read synced variables), only the chief
            # into --output; the others into a temporary folder, then delete it.
            target = dist.write_dir(output)
            os.makedirs(target, exist_ok=True)
            path = checkpointing.save_final_model(run.model, target)
            if dist.is_chief:
                run.metrics["model_path"] = path
            dist.cleanup(target)
    except TrainingInterrupted as exc:
        done = len(run.metrics["epochs"])
        path = run.ckpt.save(done, int(run.stats.steps.numpy()))
        run.metrics["status"] = "interrupted"
        run.metrics["signal"] = exc.signum
        print(f"interrupted: checkpoint {path} saved after {done} completed epoch(s); run "
              "the same command with --resume to finish", file=sys.stderr, flush=True)
    except TrainingDiverged as exc:
        run.metrics["status"] = "diverged"
        run.metrics["diagnosis"] = f"{exc}; {DIAGNOSIS}"
        print(f"error: training diverged at {run.metrics['diagnosis']}", file=sys.stderr,
              flush=True)
    except Exception as exc:
        if output_faults.classify(exc) is not None:
            raise  # a failed write: train() cleans up and says what to do
        # Unexpected (e.g. out of memory): leave an honest metrics.json, then re-raise;
        # a dtype clash in the user's layer becomes check's one-line diagnosis.
        clash = _clash(exc, decision.policy, task)
        run.metrics["status"] = "failed"
        run.metrics["diagnosis"] = clash or f"{type(exc).__name__}: {str(exc)[:500]}"
        run.metrics["finished_utc"] = utc_now_iso()
        run.write_metrics()
        if clash:
            raise MixedPrecisionClash(clash) from None
        raise
    run.metrics["finished_utc"] = utc_now_iso()
    run.write_metrics()
    run.writer.close()
