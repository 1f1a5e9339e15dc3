"""Training: ``train(config)`` runs a whole job and returns the metrics dict.

Order of work (nothing is written before every input has been checked):
  1. ``prepare``: validate the config, resolve the precision, check the output folder,
     and that this TensorFlow can run a built-in model's layer kinds under the policy here
     (``app.machine.kernels``), load the data and, with --resume, check the run being continued;
  2. ``build_parts``: inside ``get_strategy().scope()``, set the policy, build the model
     and the optimizer (wrapped in a LossScaleOptimizer for mixed_float16), the step
     statistics and the checkpointer; with --resume, restore the checkpoint;
  3. the chief takes the output folder's lock (``app.run_folder.lock``: one run per folder),
     a folder the run named itself (no --output) first made its own (another run started
     in the same second may have taken the name since step 1: this one moves on to -2), and
     a ``Recorder`` opens the folder; ``--loop fit`` (Keras fit) or ``--loop
     custom`` (GradientTape step, ``app.training.loops``) train, recording metrics.json and a
     checkpoint after every epoch;
  4. save the final model.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Optional

import tensorflow as tf

from app.run_folder import checkpoints as checkpointing
from app.training import distribute, early_stop
from app.machine import envreport
from app.machine import hardware as hw_mod
from app.machine import cpu_threads, nvml, xla_toolchain
from app.training import loops
from app.precision import keras_version, loss_scale
from app.training import profiling, step_stats
from app.run_folder import write_faults as output_faults
from app.precision import policy as prec
from app.training.config import (TrainConfig, claim_unused, data_dir_chosen, default_base,
                                 default_data_dir, unused, validate)
from app.core import folders
from app.core.settings import spelled, together
from app.core.catalog import MIN_UPDATES_PER_EPOCH
from app.core.errors import (MixedPrecisionClash, NumericsFault,
                             TrainingDiverged, TrainingInterrupted, UsageError, UserCodeError,
                             unprefixed)
from app.training.interrupts import (StopFlag, resume_advice, signal_handlers,
                                     stopped_before_start)
from app.training.monitor import StepMonitor
from app.training import accumulate
from app.training.accumulate import Accumulator
from app.training.sentinel import SentinelState
from app.training.sentinel_watch import SentinelWatch
from app.numerics.replay import weights_max
from app.training.recorder import (Recorder, ResumedEpoch, StepCallback, continue_metrics,
                                   new_metrics, plain_lines)
from app.run_folder.lock import RunLock
from app.training.resuming import (check_holds_no_run, check_same_task, continue_the_epoch,
                                   counted_class_weights, read_previous_metrics,
                                   resumed_class_weight,
                                   resumed_float32_layers, resumed_learning_rate,
                                   resumed_precision, set_learning_rate)
from app.training.runnable import runnable_by_kinds, runnable_when_built
from app.task import class_weights, model_layers
from app.task.float32_layers import flag as f32_flag
from app.task.task import BuiltModel, Task

DIAGNOSIS = (
    "the loss or the gradients became non-finite and loss scaling could not recover. "
    "Try, in order: lower --learning-rate (e.g. by 10x); check the data for NaN/inf or "
    "unnormalised inputs (inputs should be float32 in [0, 1]); keep BatchNormalization, "
    "softmax and the loss in float32 (the built-in models do); if it only happens with "
    "mixed_float16, compare with --precision float32 or mixed_bfloat16."
)


def get_strategy(dist: distribute.Distribution | None = None) -> tf.distribute.Strategy:
    """The distribution strategy chosen by ``--strategy`` (see ``app.training.distribute``); the
    default one-device strategy when none was set up."""
    return dist.strategy if dist is not None else tf.distribute.get_strategy()


# ---- 1. prepare: every check, nothing written ------------------------------------------------

@dataclass(frozen=True, eq=False)
class Prepared:
    """A checked job, data loaded, nothing written yet."""
    config: TrainConfig       # a resolved copy: ``output`` and ``resume`` filled in
    hardware: Any             # app.machine.hardware.HardwareInfo
    decision: prec.PrecisionDecision
    task: Task
    bundle: Any               # app.task.data.DataBundle
    dist: distribute.Distribution
    previous: Optional[dict] = None   # --resume: the metrics.json of the run continued
    # No --output: the run folder's name before its -2, -3, ... (``output`` is the first
    # free one when prepare() looked; ``train`` claims it, or the next one free then).
    default_base: Optional[str] = None
    # How the user gave each setting (``app.core.settings.given_as``): the words of the lines
    # said after prepare() about a setting, --resume or resume=True (``settings.spelled``).
    said: Any = None

    @property
    def output(self) -> str:
        return self.config.output


def prepare(cfg: TrainConfig, hardware=None, task: Task | None = None,
            said: Optional[dict] = None) -> Prepared:
    """Check everything, set up the strategy and load the data; writes nothing and leaves
    ``cfg`` as it was.  ``said``: how the user gave each setting
    (``app.core.settings.given_as``), for a value refused only once the data are loaded."""
    said = {} if said is None else said   # an empty GivenAs is still app.train's
    validate(cfg, words=said)
    hw = hardware or hw_mod.detect()
    decision = prec.resolve(cfg.precision, hw)
    if cfg.tuning and "precision" in cfg.tuning.get("taken", ()):   # not asked for by name
        decision = dataclasses.replace(decision, reason="taken from the tune, --tuned")
    # Before the data: the strategy must exist before TensorFlow's first tensor.
    dist = distribute.setup(cfg.strategy, cfg.batch_size, len(hw.gpus))
    cfg = accumulate.resolve(cfg, dist)
    decision = runnable_by_kinds(decision, cfg.model if task is None else task.model.spec, hw)
    xla_toolchain.check_jit(cfg.jit, hw.gpus)
    # TF32 for float32 (compute capability 8.0+): before the first op, recorded by envreport.
    tf.config.experimental.enable_tensor_float_32_execution(cfg.tf32 == "on")
    resume_word, output_word = spelled(said, "resume"), spelled(said, "output")
    if cfg.resume and not cfg.output:
        raise UsageError(f"{resume_word} needs {output_word} (or TFMP_OUTPUT) naming the run to "
                         "continue", together(said, resume_word, spelled(
                             said, "output", "<folder of the interrupted run>")))
    base = None if cfg.output else default_base(cfg, decision.policy)
    output = cfg.output or unused(base)
    folders.check_writable(output)
    if dist.is_chief:
        # A live run in this folder is named before anything else is said about it (a
        # second run would interleave its checkpoints and metrics.json with the first's).
        RunLock(output, said=said).check_free()
    # Multi-worker jobs are restarted by a cluster manager with the same command: like
    # Keras' BackupAndRestore, continue from the last backup instead of starting over.
    resume = cfg.resume or (dist.multi_worker and checkpointing.has_checkpoint(output))
    if resume and not checkpointing.has_checkpoint(output):
        raise checkpointing.no_checkpoint(os.path.join(output, checkpointing.CHECKPOINT_DIR),
                                          said)
    if not resume and dist.is_chief:
        check_holds_no_run(output, said)
    task = task or Task.from_config(cfg, said)
    previous, counted = None, None
    if resume:
        previous = read_previous_metrics(output, required=dist.is_chief, said=said)
        check_same_task(previous, task, output, said)
        decision = resumed_precision(decision, previous, output, lambda policy: runnable_by_kinds(
            dataclasses.replace(prec.resolve(policy, hw), reason="the run's own, kept by "
                                f"{resume_word}"), task.model.spec, hw), said)
        cfg, task = resumed_float32_layers(cfg, task, previous)
        cfg = resumed_class_weight(cfg, previous)
        cfg = resumed_learning_rate(cfg, previous)
        counted = counted_class_weights(cfg, previous)
    bundle = task.load_data(dist.global_batch, cfg.data_dir or default_data_dir(cfg.workspace),
                            image_dir=cfg.image_dir, max_train_samples=cfg.max_train_samples,
                            max_val_samples=cfg.max_val_samples, seed=cfg.seed,
                            offline=cfg.offline, data_dir_explicit=data_dir_chosen(cfg))
    bundle = class_weights.weigh(bundle, class_weights.parse(cfg.class_weight), counted,
                                 said.get("class_weight"))
    chosen = runnable_when_built(decision, task, bundle)
    if chosen is not decision:
        decision = chosen
        if not cfg.output:   # named for the policy
            base = default_base(cfg, decision.policy)
            output = unused(base)
    return Prepared(dataclasses.replace(cfg, output=output, resume=resume), hw, decision, task,
                    bundle, dist, previous, base, said)


# ---- 2. build: model, optimizer, step statistics, checkpointer -------------------------------

@dataclass(frozen=True, eq=False)
class TrainingParts:
    """What the loops drive, built under the policy inside the strategy's scope."""
    model: Any
    optimizer: Any                    # a LossScaleOptimizer under mixed_float16
    strategy: tf.distribute.Strategy
    built: BuiltModel                 # the task's loss and metrics factory
    stats: step_stats.StepStats
    checkpointer: checkpointing.Checkpointer
    sentinel: Optional[SentinelState] = None   # None: --no-sentinel
    accumulator: Optional[Accumulator] = None  # None: one batch per update

    @property
    def loss_scaled(self) -> bool:
        return loss_scale.is_loss_scaled(self.optimizer)


def build_parts(run: Prepared, stop: StopFlag | None = None) -> TrainingParts:
    """Set the seed and the policy, build the model and the optimizer (the policy stays
    set: ``train`` restores the previous one when it ends)."""
    cfg = run.config
    tf.keras.utils.set_random_seed(cfg.seed)
    prec.apply_policy(run.decision.policy)
    strategy = get_strategy(run.dist)
    with strategy.scope():
        built = run.task.build(run.bundle, run.bundle.sample_batch)
        opt = built.optimizer or tf.keras.optimizers.Adam(learning_rate=cfg.learning_rate)
        if not loss_scale.is_loss_scaled(opt):
            opt = loss_scale.wrap_optimizer(opt, run.decision.policy,
                                            initial_scale=cfg.initial_loss_scale)
        loss_scale.build_optimizer(opt, built.model.trainable_variables)
    for note in run.bundle.notes + built.notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    for warning in built.warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    ckpt_dir = os.path.join(run.output, checkpointing.CHECKPOINT_DIR)
    ckpt = checkpointing.Checkpointer(run.output, built.model, opt,
                                      write_dir=run.dist.write_dir(ckpt_dir))
    if stop is not None:
        stop.model = built.model
    stats = step_stats.StepStats(log_every=cfg.log_every)
    # A replica's batch holds at most the training set: a --batch-size past it (the whole
    # set in one batch) must not size the sentinel's copy of the batch by the flag.
    rows = min(cfg.batch_size, run.bundle.train_samples or cfg.batch_size)
    sentinel = (SentinelState(stats, run.bundle.train.element_spec, _local_replicas(strategy),
                              rows) if cfg.sentinel else None)
    return TrainingParts(built.model, opt, strategy, built, stats, ckpt, sentinel,
                         accumulate.for_run(run, built.model, strategy))


def _local_replicas(strategy) -> int:
    try:
        return len(strategy.extended.worker_devices)
    except RuntimeError:   # the default strategy: one device
        return 1


def make_recorder(run: Prepared, parts: TrainingParts, metrics: dict,
                  on_step: StepCallback | None = None,
                  previous_steps: Optional[list] = None, start: int = 0,
                  skip: int = 0, folder_lock: Optional[RunLock] = None) -> Recorder:
    """The run's recorder (``open()`` it, the folder's lock held: its first write into the
    output folder).  ``start``, ``skip``: a resumed run's first epoch and the batches of it
    already trained.  ``folder_lock``: the chief's lock on the folder."""
    recorder = Recorder(run.output, metrics, parts, epochs=run.config.epochs,
                        train_samples=run.bundle.train_samples, is_chief=run.dist.is_chief,
                        plain=plain_lines(run.config.progress), on_step=on_step,
                        previous_steps=previous_steps, folder_lock=folder_lock)
    recorder.resumed = ResumedEpoch.at(start, skip, accumulate.steps_per_epoch(run),
                                       run.dist.global_batch, run.bundle.train_samples)
    if run.config.early_stop:
        best_dir = os.path.join(run.output, early_stop.BEST_DIR)
        recorder.early = early_stop.EarlyStop(run.config.early_stop, run.output, parts.model,
                                              write_dir=run.dist.write_dir(best_dir),
                                              saves_model=run.config.save_model,
                                              monitor=run.config.early_stop_on)
    return recorder


def make_monitor(run: Prepared, parts: TrainingParts, recorder: Recorder,
                 stop: StopFlag | None = None, built_weights_max: Optional[float] = None,
                 command_line: bool = True) -> StepMonitor:
    cfg = run.config
    watch = None
    # Multi-worker without TF_CONFIG is one worker, with no cluster to name.
    cluster = run.dist.cluster if run.dist.multi_worker else None
    if parts.sentinel is not None:
        watch = SentinelWatch(parts.sentinel, parts.model, parts.built.loss,
                              every=cfg.numerics_every, policy=run.decision.policy,
                              loss_scaled=parts.loss_scaled,
                              max_skipped_steps=cfg.max_skipped_steps,
                              probe_batch=run.bundle.sample_batch,
                              global_batch=run.dist.global_batch,
                              worker=cluster.rank if cluster else None,
                              workers=cluster.num_workers if cluster else 1,
                              pool=run.dist.pool_json if cluster else None,
                              on_probe=recorder.record_probe, rows=run.bundle.train_rows,
                              built_weights_max=built_weights_max,
                              # the warnings' fix in the run's words, with its float32 layers
                              command_line=command_line,
                              float32_layers=run.task.float32_layers)
        recorder.watch = watch
    return StepMonitor(cfg.log_every, cfg.max_skipped_steps, parts.loss_scaled, parts.optimizer,
                       parts.stats, stop or StopFlag(), recorder.record_step, watch)


# ---- the whole job ---------------------------------------------------------------------------

def train(config: TrainConfig, on_step: StepCallback | None = None, hardware=None,
          announce: bool = True, task: Task | None = None,
          repeat_signal_exits: bool = False, said: Optional[dict] = None) -> dict:
    """Run a training job; return the metrics dict (also written to <output>/metrics.json).

    ``on_step`` is called every ``config.log_every`` steps with
    ``{"step", "epoch", "loss", "grad_norm", "loss_scale", "skipped_steps"}``.
    ``metrics["status"]`` is ``completed``, ``interrupted`` (SIGTERM/SIGINT; a checkpoint was
    saved, rerun with ``resume=True``) or ``diverged`` (see ``metrics["diagnosis"]``).
    Bad input raises ``app.core.errors.UsageError`` before anything is written.
    ``repeat_signal_exits``: a second SIGTERM/SIGINT ends the process at once (the command
    line's; app/training/interrupts.py).  ``said``: how the user gave each setting (a flag,
    a TFMP_ variable, app.train's keyword: ``app.core.settings.given_as``), which a value
    refused once the model is built is named by.
    """
    said = {} if said is None else said   # an empty GivenAs is still app.train's
    try:
        run, loop, metrics = _ready(config, hardware, task, said, announce)
    except KeyboardInterrupt:
        # Before the handlers below: Python's own raised it, in the checks or the data's
        # loading; nothing is written yet, so there is nothing to save or resume.
        return stopped_before_start(config, command_line=repeat_signal_exits)
    stop = StopFlag()
    stop.output = run.output
    with _policy_restored(), signal_handlers(stop, repeat_signal_exits):
        parts = _build_or_explain(run, stop)
        if run.config.early_stop:   # the metrics are known once the model is built
            early_stop.check_monitor(run.config.early_stop_on, parts.built.metric_names,
                                     said.get("early_stop_on"))
        _warn_of_the_amx_hang(run, parts.model, metrics["environment"]["cpu_threads"])
        # A resumed run's weights as built, before the checkpoint's: the sentinel measures
        # their growth from there (a checkpoint saved at an optimizer's fault holds weights
        # that grew, which the resumed run's own start would call normal).
        built_weights_max = (weights_max(parts.model)
                             if run.config.resume and parts.sentinel is not None else None)
        start, skip, previous_steps = _resume(run, parts, metrics)
        if run.dist.is_chief and run.default_base:
            run = _claim_default_folder(run, parts, metrics, stop)
        # The chief holds the folder from its first write until it ends (app/run_folder/lock.py);
        # workers of a multi-worker job write only their own temporary folders.
        lock = RunLock(run.output, said=said)
        recorder = make_recorder(run, parts, metrics, on_step, previous_steps, start, skip,
                                 folder_lock=lock)
        monitor = make_monitor(run, parts, recorder, stop, built_weights_max,
                               command_line=repeat_signal_exits)
        with contextlib.ExitStack() as held:
            # Taken before a failed write is described: describing one cleans the folder and
            # records "failed" in it, which a run refused the folder must never do (its
            # refusal, OutputInUse or LockOfAnotherUser, says so in one line, exit 2).
            if run.dist.is_chief:
                held.enter_context(lock)
                if not run.config.resume:
                    # Another run may have finished here since prepare() looked.
                    check_holds_no_run(run.output, said)
            held.enter_context(_output_faults_described(recorder, repeat_signal_exits))
            recorder.open()
            # A second signal ends the process at once: metrics.json must not say "running".
            stop.on_stop_at_once = recorder.record_stop_at_once
            # Only the command line has a second signal end the process: its runs are told
            # to rerun with --resume, app.train's with resume=True.
            _train_and_save(run, parts, recorder, monitor, loop, start, skip,
                            command_line=repeat_signal_exits)
    return metrics


def _ready(config: TrainConfig, hardware, task: Task | None, said, announce: bool):
    """(the prepared run, its loop, its metrics before training): every check, the data
    loaded, what the run is said; nothing written."""
    run = prepare(config, hardware, task=task, said=said)
    if announce:
        prec.announce(run.decision)
        if run.config.tuning:
            from app.training.tuned import console_line

            print(console_line(run.config.tuning, run.dist.replicas), flush=True)
        print(run.dist.describe(), flush=True)
        if (run.config.accumulate or 1) > 1:
            print(f"accumulate: {run.config.accumulate} micro-batches of {run.dist.global_batch} "
                  f"per update, global batch {run.config.global_batch}", flush=True)
        whole = _batch_holds_the_set(run.dist.global_batch * (run.config.accumulate or 1),
                                     run.bundle.train_samples)
        if whole:
            print(f"note: {whole}", file=sys.stderr, flush=True)
        late = profiling.past_the_end(run)
        if late:
            print(f"note: {late}", file=sys.stderr, flush=True)
        jit_note = xla_toolchain.cpu_note(run.config.jit, run.hardware.gpus)
        if jit_note:
            print(f"note: {jit_note}", file=sys.stderr, flush=True)
        shortage = nvml.shortage_now() if run.hardware.gpus else None
        if shortage:   # a notebook kernel holding the GPU: said now, not at an OOM far in
            print(f"note: {shortage}", file=sys.stderr, flush=True)
    loop = _loop(run)
    return run, loop, new_metrics(run, envreport.collect(run.hardware), loop)


def _claim_default_folder(run: Prepared, parts: TrainingParts, metrics: dict,
                          stop: StopFlag) -> Prepared:
    """The folder the run chose (no --output) made its own, after every check and just before
    its lock is taken: prepare() only looked, so another run started in the same second may
    have made it since (and would hold its lock).  Then this run moves on to the next free
    name, ``-2``, ``-3``, ..., and what names the folder follows.  An --output the user gave
    is theirs: its lock refuses a second run (``RunLock``)."""
    output = claim_unused(run.default_base)
    if output == run.output:
        return run
    parts.checkpointer.move_to(output)   # nothing saved yet, nothing restored (no --resume)
    metrics["config"]["output"] = output
    stop.output = output
    return dataclasses.replace(run, config=dataclasses.replace(run.config, output=output))


def _warn_of_the_amx_hang(run: Prepared, model, threads: dict) -> None:
    """A run started without the image's entrypoint on a CPU with AMX: TF 2.9's bfloat16
    convolutions can deadlock there (``threads``: the environment report's
    ``cpu_threads``, app/machine/cpu_threads.py); said only for a model that has one."""
    from app.machine import kernels

    if run.decision.policy != "mixed_bfloat16" or not threads["amx_hang"]:
        return
    convolutions = [path for path, layer, _ in model_layers.walk(model)
                    if "Conv" in (kernels.kind_of(layer) or "")]
    if convolutions:
        more = f" and {len(convolutions) - 1} more" if len(convolutions) > 1 else ""
        which = f"this model's {convolutions[0]!r}{more}"
        print(f"warning: {cpu_threads.hang_warning(which)}", file=sys.stderr, flush=True)


def _batch_holds_the_set(per_update: int, train_samples) -> str | None:
    """The note for an update batch as large as the training set: one update an epoch,
    which trains little per epoch however fast (tune never chooses such a batch)."""
    if not train_samples or per_update < train_samples:
        return None
    return (f"the global batch of {per_update:,} holds the whole training set "
            f"({train_samples:,} samples): one update an epoch; a smaller --batch-size makes "
            f"more (tfmp tune leaves at least {MIN_UPDATES_PER_EPOCH})")


def _loop(run: Prepared) -> str:
    if run.dist.multi_worker and keras_version.IS_KERAS3 and run.config.loop == "fit":
        # Keras 3's fit has no multi-worker-aware BackupAndRestore (it neither syncs nor uses
        # worker temp folders); the custom loop's checkpoints are the backup.  docs/distributed.md
        print("note: multi-worker training on Keras 3 runs the custom loop (--loop custom); "
              "its per-epoch checkpoints are the backup a restarted job resumes from",
              file=sys.stderr, flush=True)
        return "custom"
    return run.config.loop


@contextlib.contextmanager
def _policy_restored():
    old_policy = prec.global_policy_name()
    try:
        yield
    finally:
        prec.apply_policy(old_policy)


def _build_or_explain(run: Prepared, stop: StopFlag) -> TrainingParts:
    try:
        return build_parts(run, stop)
    except UserCodeError as exc:
        clash = clash_diagnosis(exc.original, run.decision.policy, run.task)
        if clash:
            raise MixedPrecisionClash(clash) from None
        raise


def _resume(run: Prepared, parts: TrainingParts, metrics: dict):
    """(first epoch to train, micro-batches of it already trained, the continued run's step
    records)."""
    if not run.config.resume:
        return 0, 0, []
    # UsageError if incompatible: nothing written
    start = parts.checkpointer.restore_latest(run.said)
    if parts.built.optimizer is None:   # the app's own Adam: the rate the config records
        set_learning_rate(parts.optimizer, run.config.learning_rate)
    step = int(parts.checkpointer.step.numpy())
    parts.stats.steps.assign(step)
    previous_steps = continue_metrics(metrics, run.previous, start, step)
    skip = 0 if run.dist.multi_worker else continue_the_epoch(run, metrics, start, step)
    if parts.accumulator is not None:
        parts.accumulator.start_at(skip)
    cfg = run.config
    if cfg.early_stop and early_stop.should_stop(metrics["epochs"], cfg.early_stop,
                                                 cfg.early_stop_on):
        # Stopped early before: another epoch would only be trained to be thrown away.
        said = early_stop.stop_line(metrics["epochs"], cfg.early_stop, cfg.save_model,
                                    cfg.early_stop_on)
        print(f"resuming from {parts.checkpointer.restored_path}: the run stopped early after "
              f"{start} epoch(s) ({said}), so nothing is left to train (a larger "
              "--early-stop trains on)", file=sys.stderr)
        return cfg.epochs, 0, previous_steps
    if start >= run.config.epochs:
        # Nothing is left to train: say so, not "resuming ... at epoch 10" of a 3-epoch run,
        # nor finish an epoch past --epochs that was cut short.
        part = f" and part of epoch {start + 1}" if skip else ""
        print(f"resuming from {parts.checkpointer.restored_path}: {start} epoch(s){part} "
              f"trained, and --epochs {run.config.epochs} asks for no more, so nothing is "
              f"left to train (--epochs {start + 1} or more trains on)", file=sys.stderr)
        return start, 0, previous_steps
    where = f" after {skip} batch(es) of epoch {start + 1}" if skip else f" at epoch {start + 1}"
    print(f"resuming from {parts.checkpointer.restored_path}{where}", file=sys.stderr)
    return start, skip, previous_steps


@contextlib.contextmanager
def _output_faults_described(recorder: Recorder, command_line: bool):
    """Every write of the run happens in here; one that fails (disk full) becomes an
    OutputFault, with the last complete checkpoint left to resume from."""
    try:
        yield
    except Exception as exc:
        code = output_faults.classify(exc)
        if code is None:
            raise
        raise _output_fault(recorder, exc, code, command_line) from None


def _train_and_save(run: Prepared, parts: TrainingParts, recorder: Recorder,
                    monitor: StepMonitor, loop: str, start: int, skip: int = 0, *,
                    command_line: bool):
    """The loop and the final model; the run's end goes into metrics.json."""
    cfg = run.config
    try:
        if start < cfg.epochs:
            run_loop = loops.run_fit if loop == "fit" else loops.run_custom
            run_loop(run, parts, recorder, monitor, start, skip)
        recorder.metrics["status"] = "completed"
        if recorder.early is not None:
            epochs = recorder.metrics["epochs"]
            restored = recorder.early.restore_best(epochs) if cfg.save_model else None
            recorder.metrics["early_stop"] = recorder.early.to_json(epochs, restored)
        if cfg.save_model:
            # Every worker saves (saving may read synced variables), only the chief
            # into --output; the others into a temporary folder, then delete it.
            target = run.dist.write_dir(run.output)
            folders.make_folder(target)
            path = checkpointing.save_final_model(parts.model, target)
            if run.dist.is_chief:
                recorder.metrics["model_path"] = path
            run.dist.cleanup(target)
    except TrainingInterrupted as exc:
        done = len(recorder.metrics["epochs"])
        path = parts.checkpointer.save(done, int(parts.stats.steps.numpy()))
        # metrics.json says so before the line announcing the checkpoint: a second
        # signal right after the first ends the process at once, and left "running"
        # beside a saved checkpoint.
        recorder.finish("interrupted", signal=exc.signum)
        advice = resume_advice(run.output, "output" in cfg.given, command_line)
        print(f"interrupted: checkpoint {path} saved after {done} completed epoch(s); "
              f"{advice}", file=sys.stderr, flush=True)
    except NumericsFault as exc:
        # The state that failed is kept (no faulty update landed): --resume after the fix.
        # The steps after the fault, until the loop noticed it, trained nothing but counted
        # and (loss scaling) lowered the scale: rewound to the state the faulty step began
        # from, so the resume trains again from its batch at the scale it had.
        step = (parts.sentinel.rewind(parts.optimizer) if parts.sentinel is not None
                else int(parts.stats.steps.numpy()))
        path = parts.checkpointer.save(len(recorder.metrics["epochs"]), step)
        monitor.watch.report(exc.fault, recorder.metrics, epoch=monitor.epoch + 1,
                             checkpoint=path, fallback=DIAGNOSIS, output=run.output,
                             command_line=command_line)
    except TrainingDiverged as exc:
        recorder.metrics.update(status="diverged", diagnosis=f"{exc}; {DIAGNOSIS}")
        print(f"error: training diverged at {recorder.metrics['diagnosis']}", file=sys.stderr,
              flush=True)
    except Exception as exc:
        if output_faults.classify(exc) is not None:
            raise  # a failed write: train() cleans up and says what to do
        # An op with no kernel here for the policy's 16-bit dtype, reached only in training
        # (an augmentation layer's): the refusal naming the layer, as at build time.
        refusal = model_layers.refusal_from_build_error(exc, run.task.model.spec, parts.model)
        if refusal is not None:
            recorder.finish("failed", diagnosis=unprefixed(refusal.line()))
            raise refusal from None
        # Unexpected (e.g. out of memory): leave an honest metrics.json, then re-raise;
        # a dtype clash in the user's layer becomes check's one-line diagnosis.
        clash = clash_diagnosis(exc, run.decision.policy, run.task)
        hint = None
        if run.hardware.gpus:
            hint = nvml.oom_hint(exc)   # who else holds the GPU's memory (NVML)
            if hint:
                recorder.metrics["gpu_memory_holders"] = hint
        recorder.finish("failed", diagnosis=clash or f"{type(exc).__name__}: {str(exc)[:500]}")
        if hint:
            print(f"note: {hint}", file=sys.stderr, flush=True)
        if clash:
            raise MixedPrecisionClash(clash) from None
        raise
    recorder.finish(recorder.metrics["status"])
    recorder.close()


def _output_fault(recorder: Recorder, exc: BaseException, code: int, command_line: bool):
    """Clean up after a failed write and describe it (see app/run_folder/write_faults.py)."""
    output = recorder.output
    ckpt_dir = os.path.join(output, checkpointing.CHECKPOINT_DIR)
    output_faults.remove_partial_checkpoints(ckpt_dir)
    checkpointing.remove_partial_model(output)   # frees its space for metrics.json's "failed"
    latest = checkpointing.newest_complete(ckpt_dir)
    # In the words of what started the run (tfmp train's flag, app.train's keyword).
    resume = "--resume" if command_line else "resume=True"
    again = "run the command again" if command_line else "call app.train again"
    hint = (f"run the same {'command' if command_line else 'app.train call'} with {resume} to "
            f"continue from {os.path.basename(latest)}" if latest else
            f"{again} with a new {'--output' if command_line else 'output=...'}, or after "
            f"removing that folder (rm -r {shlex.quote(output)}): no checkpoint was completed, "
            "so there is nothing to resume")
    fault = output_faults.OutputFault(output_faults.path_of(exc, output), code,
                                      f"{type(exc).__name__}", hint)
    with contextlib.suppress(Exception):   # the disk may still be full: best effort
        recorder.finish("failed", diagnosis=unprefixed(fault.line()))
    with contextlib.suppress(Exception):
        recorder.close()
    return fault


def clash_diagnosis(exc: BaseException, policy: str, task: Task) -> Optional[str]:
    """check's one-line diagnosis (text) for a 16-bit/float32 clash under a mixed policy,
    else None.  (``app.doctor.run`` turns the same diagnosis into a Finding.)"""
    from app.precision import dtype_clash

    if policy == "float32" or not dtype_clash.is_dtype_clash(exc):
        return None
    return dtype_clash.describe(exc, policy, "" if task.model.builtin else task.model.spec,
                                float32_flag=lambda name: f32_flag([name]))
