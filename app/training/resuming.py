"""What ``--resume`` may continue: the previous run's metrics.json, the same task, and the
float32 layers it was trained with (kept, or replaced by the ones given: a fix after a
numerics fault); where inside its epoch it continues (another --batch-size or --accumulate
starts that epoch over); and the other side of it, the folder a new run may not write in
(one that holds a run, or a run's names)."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import sys
from typing import List, Optional

from app.core.errors import UsageError
from app.core.settings import listed, spelled
from app.run_folder import checkpoints as checkpointing
from app.task.task import Task
from app.training import accumulate, early_stop
from app.training.config import TrainConfig

# ``said`` below: how the user gave each setting (``app.core.settings.given_as``), whose
# words the lines use: tfmp train's flags, or app.train's keywords (``resume=True``).


def _restore(said) -> str:
    """What a metrics.json that cannot be trusted leaves the user to do."""
    return f"restore it from a copy, or start a new {spelled(said, 'output')}"


def read_previous_metrics(output: str, required: bool = True, said=None) -> Optional[dict]:
    """The metrics.json of the run being resumed.  A run writes it before its first
    checkpoint, so one missing beside a checkpoint was deleted or lost: without it the run's
    model and dataset cannot be checked and its earlier epochs would be dropped from the
    record, so it is one line unless not ``required`` (None: a multi-worker job's worker,
    whose folder the chief's metrics.json need not be in)."""
    path = os.path.join(output, "metrics.json")
    try:
        with open(path, encoding="utf-8") as fh:
            previous = json.load(fh)
    except FileNotFoundError:
        if required:
            raise UsageError(f"{spelled(said, 'resume')}: {path!r} is missing beside the run's "
                             "checkpoints: the model and dataset it trained and its epochs so "
                             "far are not known, so the run cannot be resumed safely",
                             _restore(said)) from None
        return None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path!r} cannot be read ({type(exc).__name__}); the run cannot be "
                         "resumed safely", _restore(said)) from None
    wrong = _not_a_mapping(previous)
    if wrong:
        raise UsageError(f"{path!r} is not the metrics of a run ({wrong}, not a mapping); the run "
                         "cannot be resumed safely", _restore(said))
    return previous


def check_holds_no_run(output: str, said=None) -> None:
    """A new run never writes over a finished (or failed) one: checked in ``prepare`` to
    refuse early, and again under the folder's lock, where no other run can finish in
    between."""
    if not os.path.exists(os.path.join(output, "metrics.json")):
        _check_holds_none_of_a_runs_names(output, said)
        return
    try:
        status = read_previous_metrics(output).get("status")
    except UsageError:   # unreadable: not known to have failed
        status = None
    new_output = spelled(said, "output")
    if status == "failed" and not checkpointing.has_checkpoint(output):
        # nothing --resume would find: say what is left to do
        raise UsageError(f"output directory {output!r} holds a run that failed before its "
                         "first checkpoint (metrics.json says why): nothing to resume",
                         f"a new {new_output}, or remove that folder (rm -r "
                         f"{shlex.quote(output)}) to start the run again there")
    raise UsageError(f"output directory {output!r} already holds a run",
                     f"{spelled(said, 'resume')} to continue it, or a new {new_output}")


# What a run writes in its folder besides metrics.json: a folder that already holds one of
# them, with no run's metrics.json, is someone's project (a Python package named `model`, a
# `checkpoints` folder of their own), and saving the model replaces `model/` whole.
_RUN_NAMES = ("model", "model.keras", checkpointing.FINAL_WEIGHTS, checkpointing.CHECKPOINT_DIR,
              "tensorboard", early_stop.BEST_DIR, "backup")


def _check_holds_none_of_a_runs_names(output: str, said=None) -> None:
    """Refused when a name a run writes is there and the folder holds no run's metrics.json,
    however it came to be: someone's project, or a run's folder whose metrics.json was
    deleted (its checkpoints and model are still worth keeping; --resume refuses it too, so
    the user restores the file or picks another folder).  The one exception is what a run
    leaves when a second Ctrl-C ends it before its first epoch is recorded: its lock file
    and its ``tensorboard/``, nothing a new run would lose (``_LEFT_BEFORE_THE_FIRST_EPOCH``)."""
    taken = [name for name in _RUN_NAMES if os.path.lexists(os.path.join(output, name))]
    if _a_runs_own_start(output):
        taken = [name for name in taken if name not in _LEFT_BEFORE_THE_FIRST_EPOCH]
    if taken:
        raise UsageError(f"output directory {output!r} already holds {', '.join(taken)} and no "
                         "run (no metrics.json): a run writes its model, checkpoints and "
                         "TensorBoard logs under those names and would replace them",
                         f"a new {spelled(said, 'output')} (a run's own folder, e.g. "
                         "runs/NAME), or a folder "
                         "without " + ", ".join(_RUN_NAMES))


# What a run writes before its first epoch's record (the lock file aside): the TensorBoard
# folder, opened with the recorder.  Checkpoints, best/ and the model come later, at or after
# an epoch's end, so a folder holding them is never just a run's aborted start.
_LEFT_BEFORE_THE_FIRST_EPOCH = ("tensorboard",)


def _a_runs_own_start(output: str) -> bool:
    """The lock file is there: a run of this program began in the folder (the lock file is
    its first write and stays)."""
    from app.run_folder.lock import LOCK_NAME

    return os.path.exists(os.path.join(output, LOCK_NAME))


def check_same_task(previous: Optional[dict], task: Task, output: str, said=None) -> None:
    """--resume continues the same job: a run whose model, dataset, loss or metrics spec
    changed would restore weights into something else (or fail deep in TensorFlow)."""
    if previous is None:
        return
    before = _section(previous, "task") or {k: _section(previous, "config").get(k)
                                            for k in ("model", "dataset")}
    if not before.get("model") or not before.get("dataset"):   # cut short, or edited by hand
        raise UsageError(f"{os.path.join(output, 'metrics.json')!r} names no model and dataset "
                         "the run was trained on; the run cannot be resumed safely",
                         _restore(said))
    now = task.describe()
    changed = [k for k in ("model", "dataset", "loss", "metrics") if k in before
               and before.get(k) != now.get(k)]
    if changed:
        what = ", ".join(f"{k} {before.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise UsageError(f"{spelled(said, 'resume')}: the run in {output!r} was trained with a "
                         f"different spec ({what})",
                         f"the same {listed(said, 'model', 'dataset', 'loss', 'metrics')} as "
                         f"the run being resumed, or a new {spelled(said, 'output')}")


def resumed_precision(decision, previous: Optional[dict], output: str, resolve, said=None):
    """--resume continues in the precision the run trained in.  Under ``auto`` (the default:
    no precision asked for) that is the run's own, with a note when auto would pick another
    here (a CPU run resumed on a GPU box); one asked for that differs is one line: the
    checkpoint's optimizer state, loss scale and epochs belong to the run's precision.
    ``resolve(policy)``: the decision for a policy named explicitly."""
    from app.core.catalog import POLICIES

    was = _section(previous, "precision").get("policy")
    if was not in POLICIES or was == decision.policy:
        return decision
    if decision.requested == "auto":
        print(f"note: {spelled(said, 'resume')} keeps the run's precision, {was} (auto would "
              f"pick {decision.policy} here)", file=sys.stderr, flush=True)
        # Still what the user asked for: auto (metrics.json said "requested": the run's own
        # policy, as if named).  The kept policy is checked as one named (``resolve``).
        return dataclasses.replace(resolve(was), requested=decision.requested)
    raise UsageError(f"{spelled(said, 'resume')}: the run in {output!r} trained under {was}; "
                     f"{spelled(said, 'precision', decision.requested)} would continue it "
                     f"under {decision.policy}",
                     f"{spelled(said, 'precision', was)} or auto (the run's own), or a new "
                     f"{spelled(said, 'output')} for a run under {decision.policy}")


def resumed_float32_layers(cfg: TrainConfig, task: Task, previous: Optional[dict]):
    """--resume keeps the float32 layers the run was trained with when none are given; given
    ones (a fix after a fault) replace them, and a line says so.  The weights fit either
    way: a layer's variables are float32 under every policy."""
    recorded = _section(previous, "task").get("float32_layers")
    if recorded is None:
        recorded = _section(previous, "config").get("float32_layers")
    from app.task import float32_layers as f32

    try:
        was = f32.parse(recorded)
    except UsageError:
        was = ()   # not written by this program: nothing to keep
    if cfg.float32_layers is None:
        if was:
            print(f"note: --resume keeps the run's float32 layers ({f32.flag(was)})",
                  file=sys.stderr, flush=True)
        return (dataclasses.replace(cfg, float32_layers=f32.text(was)),
                task.with_float32_layers(was, f32.KEPT_BY_RESUME))
    if tuple(task.float32_layers) != was:
        print(f"note: the run was trained with float32 layers "
              f"{f32.text(was) or '(none)'}; it continues with "
              f"{f32.text(task.float32_layers) or '(none)'}", file=sys.stderr, flush=True)
    return cfg, task


def resumed_class_weight(cfg: TrainConfig, previous: Optional[dict]) -> TrainConfig:
    """--resume keeps the class weights the run was trained with when none are given (the
    loss would change under it otherwise); given ones replace them, and a line says so."""
    recorded = _section(previous, "config").get("class_weight")
    from app.task import class_weights

    try:
        was = class_weights.text(class_weights.parse(recorded))
    except UsageError:
        was = None   # not written by this program: nothing to keep
    if cfg.class_weight is None:
        if was:
            print(f"note: --resume keeps the run's class weights ({class_weights.FLAG} {was})",
                  file=sys.stderr, flush=True)
        return dataclasses.replace(cfg, class_weight=was)
    if cfg.class_weight != was:
        print(f"note: the run was trained with {class_weights.FLAG} {was or '(none)'}; it "
              f"continues with {cfg.class_weight}", file=sys.stderr, flush=True)
    return cfg


def resumed_learning_rate(cfg: TrainConfig, previous: Optional[dict]) -> TrainConfig:
    """--resume keeps the learning rate the run was trained at when none is given (its
    checkpoint's optimizer holds it); a given one replaces it once the checkpoint is restored
    (``set_learning_rate``), and a line says so.  Either way metrics.json records the rate
    that trains."""
    was = _section(previous, "config").get("learning_rate")
    if isinstance(was, bool) or not isinstance(was, (int, float)) or not math.isfinite(was) \
            or was <= 0 or was == cfg.learning_rate:
        return cfg   # not written by this program, or the same
    if "learning_rate" not in cfg.given:
        print(f"note: --resume keeps the run's learning rate ({was:g})", file=sys.stderr,
              flush=True)
        return dataclasses.replace(cfg, learning_rate=float(was))
    print(f"note: the run was trained at learning rate {was:g}; it continues at "
          f"{cfg.learning_rate:g}", file=sys.stderr, flush=True)
    return cfg


def set_learning_rate(optimizer, value: float) -> None:
    """The optimizer's learning rate after a restore put the checkpoint's back (a Keras 2
    hyperparameter or a Keras 3 variable; the LossScaleOptimizer passes it to the one it
    wraps)."""
    rate = optimizer.learning_rate
    if hasattr(rate, "assign"):
        rate.assign(value)
    else:   # a schedule or a plain number: set as Keras sets it
        optimizer.learning_rate = value


def counted_class_weights(cfg: TrainConfig, previous: Optional[dict]) -> Optional[List[float]]:
    """The class weights a balanced run counted when it began (metrics.json's
    ``data.class_weight``), when it continues balanced: ``class_weights.weigh`` uses them
    instead of counting the labels again.  None otherwise, or when the table is not one this
    program wrote (then the labels are counted as for a new run)."""
    from app.task import class_weights

    try:
        balanced = class_weights.parse(cfg.class_weight) == class_weights.BALANCED and \
            class_weights.parse(_section(previous, "config").get("class_weight")) == \
            class_weights.BALANCED
    except UsageError:
        return None
    table = _section(previous, "data").get("class_weight") if balanced else None
    if not isinstance(table, list) or not table or not all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w)
            and w >= 0 for w in table):
        return None
    return [float(w) for w in table]


def _not_a_mapping(previous) -> Optional[str]:
    """What of a read metrics.json is not the mapping this program writes (the file, or its
    config, task or data part), in words; None when each is."""
    if not isinstance(previous, dict):
        return f"the file is {type(previous).__name__}"
    for key in ("config", "task", "data"):
        if previous.get(key) is not None and not isinstance(previous[key], dict):
            return f"its {key!r} is {type(previous[key]).__name__}"
    return None


def _section(previous: Optional[dict], key: str) -> dict:
    """metrics.json's ``key`` part; {} where the file or the part is not what this program
    writes (edited by hand, or from another tool)."""
    part = previous.get(key) if isinstance(previous, dict) else None
    return part if isinstance(part, dict) else {}


# metrics.json's record of an epoch a --resume at another --batch-size or --accumulate started
# over: {"epoch": N, "at_step": S}, S the step count it started from.  Its batches are counted
# from there by a later --resume inside that epoch (the steps before S were of the other size).
EPOCH_STARTED_OVER = "epoch_started_over"


def continue_the_epoch(run, metrics: dict, start: int, step: int) -> int:
    """The (micro-)batches of epoch ``start + 1`` the checkpoint's ``step`` already trained,
    which this run skips; 0 when it starts that epoch from its first batch.  A checkpoint
    saved inside the epoch at another --batch-size or --accumulate counts batches of that
    size: the epoch starts over (skipping that many batches of this size would skip the
    wrong ones), a note says so and metrics.json records where it started
    (``EPOCH_STARTED_OVER``)."""
    began = _epoch_began_at(run, metrics, start)
    resized = _resized(run)
    skip = 0 if resized else accumulate.trained_in_epoch(run, start, step, began)
    if not skip:
        cut = _say_a_cut_epoch_starts_over(metrics["epochs"], start, step, resized, began)
        if cut and resized:
            metrics[EPOCH_STARTED_OVER] = {"epoch": start + 1, "at_step": step}
    return skip


def _epoch_began_at(run, metrics: dict, start: int) -> Optional[int]:
    """The step count epoch ``start + 1`` began at: where a --resume at another size started
    it over (kept in metrics.json for the next --resume inside it), else the step count the
    epoch before it ended at, as recorded.  None: not recorded (an older metrics.json)."""
    over = (run.previous or {}).get(EPOCH_STARTED_OVER)
    if isinstance(over, dict) and over.get("epoch") == start + 1 and \
            isinstance(over.get("at_step"), int):
        metrics[EPOCH_STARTED_OVER] = dict(over)
        return over["at_step"]
    if start == 0:
        return 0
    ended = [e.get("steps") for e in metrics["epochs"] if e.get("epoch") == start]
    return ended[0] if ended and isinstance(ended[0], int) else None


def _resized(run):
    """Does this run count an epoch's batches otherwise than the run it continues (another
    --batch-size, --accumulate or replica count)?  None: no; else what changed, in words, as
    (then, now): ("batch size 128", "batch size 64"), ("5 micro-batches per update", "4
    micro-batches per update"), or both joined; True: unknown (an older metrics.json without
    a batch size), assumed so."""
    previous = run.previous or {}
    then = previous.get("accumulation")
    batch_then = (previous.get("config") or {}).get("batch_size")
    batch_now = run.config.batch_size
    if isinstance(then, dict):
        micro_then, n_then = then.get("micro_batch"), then.get("accumulate")
        micro_now, n_now = run.dist.global_batch, run.config.accumulate or 1
        if (micro_then, n_then) == (micro_now, n_now):
            return None
        said_then, said_now = [], []
        if micro_then != micro_now:
            if batch_then != batch_now and batch_then is not None:
                said_then.append(f"batch size {batch_then}")
                said_now.append(f"batch size {batch_now}")
            else:   # the same batch size on other replicas
                said_then.append(f"a batch of {micro_then} per step (batch size x replicas)")
                said_now.append(f"a batch of {micro_now} per step (batch size x replicas)")
        if n_then != n_now:
            said_then.append(_per_update(n_then))
            said_now.append(_per_update(n_now))
        return " and ".join(said_then), " and ".join(said_now)
    if batch_then is None:
        return True
    if batch_then != batch_now:
        return f"batch size {batch_then}", f"batch size {batch_now}"
    return None


def _per_update(n) -> str:
    """An accumulation in words."""
    if n == 1:
        return "1 batch per update (no accumulation)"
    return f"{n} micro-batches per update" if n is not None else "an unrecorded accumulation"


def _say_a_cut_epoch_starts_over(epochs: list, start: int, step: int,
                                 resized: "bool | tuple" = True,
                                 began: Optional[int] = None) -> bool:
    """A checkpoint saved inside epoch ``start + 1`` whose batches this run cannot count:
    that epoch trains from its first batch again.  Said, where it was silent; the weights
    keep what those batches taught them (True: said).  ``resized``: another --batch-size or
    --accumulate is why (``_resized``: what changed, then and now, which the note names;
    True: not known which, the batch size is named); else the checkpoint came after the
    epoch's last batch and before its end was recorded (a signal then), and that is what is
    said (a sentinel fault's checkpoint is never one: it holds the step before the fault).
    ``began``: the step count the epoch began at (None: the recorded end of the one
    before)."""
    if began is not None:
        ended = began
    else:
        ended = epochs[start - 1].get("steps") if 0 < start <= len(epochs) else 0
    if not (isinstance(ended, int) and step > ended):
        return False
    if isinstance(resized, tuple):   # what changed, then and now (``_resized``)
        print(f"note: the checkpoint was saved {step - ended} step(s) into epoch {start + 1} "
              f"with {resized[0]}, and this run has {resized[1]}: that epoch starts over "
              "from its first batch (the weights keep what those steps taught them)",
              file=sys.stderr, flush=True)
    elif resized:   # unknown what (an older metrics.json)
        print(f"note: the checkpoint was saved {step - ended} step(s) into epoch {start + 1}, "
              "at the batch size the run had then; at this run's batch size that epoch "
              "starts over from its first batch (the weights keep what those steps "
              "taught them)", file=sys.stderr, flush=True)
    else:
        print(f"note: the checkpoint was saved after the last of epoch {start + 1}'s "
              f"{step - ended} step(s), before the epoch was recorded; it trains again from "
              "its first batch (the weights keep what those steps taught them)",
              file=sys.stderr, flush=True)
    return True
