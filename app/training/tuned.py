"""Using a tune's result: ``train --tuned DIR/tune.json`` and ``--scale-lr linear``.

``read_tuned`` validates a tune.json against the job about to run (same model and dataset
specs) and returns the verified choice; ``merge`` lets flags given explicitly win over it;
``scaled_learning_rate`` is the linear scaling rule (Goyal et al., 2017: multiply the
learning rate by k when the batch grows k times), off unless asked for.  Pure functions:
``train`` and ``benchmark`` call them before anything is written.

Batch sizes in tune.json are per device, like ``train --batch-size`` under ``tf.distribute``
(per replica), so a tuned size carries over to a mirrored job on identical GPUs unchanged.
The batch ``--scale-lr linear`` scales for is per replica too (micro-batch x N): the replicas
are not known when the configuration is resolved, before the strategy exists, and
docs/distributed.md leaves the learning rate unscaled for them; only a ``--global-batch``
given is the whole update's, over all replicas, and is scaled for as such.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import List, Optional

from app.core.errors import UsageError
from app.core.catalog import POLICIES
from app.core.settings import BY_NAME

# The tune.json format: written by the tuner (app/tuner/report.py), read here.
SCHEMA = "tfmp-tune/1"

SCALE_LR_CHOICES = BY_NAME["scale_lr"].choices   # app.core.settings: the one list
TUNED_FORMS = "the tune.json that `tfmp tune` wrote for this --model and --dataset"


@dataclass(frozen=True)
class TunedChoice:
    path: str
    precision: str
    batch_size: int
    samples_per_second: Optional[float]
    budget_bytes: int
    # The batch the learning rate was configured for, when the tune recorded one.
    reference_batch: Optional[int] = None
    # tune --global-batch: micro-batches of batch_size per update (1: none)
    accumulate: int = 1

    def to_dict(self) -> dict:
        return {"path": self.path, "precision": self.precision, "batch_size": self.batch_size,
                "samples_per_second": self.samples_per_second, "budget_bytes": self.budget_bytes,
                "accumulate": self.accumulate}


def _damaged(path: str, why: str) -> UsageError:
    return UsageError(f"--tuned {path!r} is not a usable tune file ({why})", TUNED_FORMS)


def read_tuned(path: str, model: str, dataset: str) -> TunedChoice:
    """The verified choice of the tune at ``path`` (a tune.json, or the folder holding it),
    made for ``model`` and ``dataset``.  UsageError when the file is missing, damaged, not
    verified, or from another model or dataset."""
    if os.path.isdir(path):
        path = os.path.join(path, "tune.json")
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise UsageError(f"--tuned {path!r} does not exist", TUNED_FORMS) from None
    except (OSError, ValueError) as exc:
        raise _damaged(path, f"{type(exc).__name__}: {str(exc)[:80]}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise _damaged(path, f"not a {SCHEMA} document")
    task = doc.get("task") if isinstance(doc.get("task"), dict) else {}
    if not task.get("model") or not task.get("dataset"):   # cut short, or edited by hand
        raise _damaged(path, "it names no model and dataset it was tuned for")
    mismatched = [f"{k} {task.get(k)!r}, not {v!r}" for k, v in (("model", model),
                                                                  ("dataset", dataset))
                  if task.get(k) != v]
    if mismatched:
        raise UsageError(f"--tuned {path!r} was tuned for another job ({'; '.join(mismatched)})",
                         f"a tune of --model {model} --dataset {dataset}, or run "
                         f"`tfmp tune --model {model} --dataset {dataset}`")
    choice, verified = doc.get("choice"), doc.get("verified")
    if not isinstance(choice, dict):
        raise _damaged(path, "it holds no choice: no size fitted the budget")
    policy, batch = choice.get("precision"), choice.get("batch_size")
    if policy not in POLICIES:
        raise _damaged(path, f"choice precision {policy!r} is not one of {', '.join(POLICIES)}")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise _damaged(path, f"choice batch_size {batch!r} is not a positive integer")
    accumulate = choice.get("accumulate", 1)
    if not isinstance(accumulate, int) or isinstance(accumulate, bool) or accumulate < 1:
        raise _damaged(path, f"choice accumulate {accumulate!r} is not a positive integer")
    if not (isinstance(verified, dict) and verified.get("fits")
            and verified.get("precision") == policy and verified.get("batch_size") == batch
            and verified.get("accumulate", 1) == accumulate):
        raise _damaged(path, "its choice was not verified")
    budget = doc.get("budget_bytes")
    if not isinstance(budget, int) or budget < 1:
        raise _damaged(path, f"budget_bytes {budget!r} is not a positive integer")
    sps = choice.get("samples_per_second")
    reference = doc.get("reference_batch_size")
    if reference is not None and (not isinstance(reference, int) or isinstance(reference, bool)
                                  or reference < 1):
        raise _damaged(path, f"reference_batch_size {reference!r} is not a positive integer")
    return TunedChoice(path, policy, batch, float(sps) if isinstance(sps, (int, float)) else None,
                       budget, reference, accumulate)


def best_batches(path: str, model: str, dataset: str) -> dict:
    """``{policy: best_batch}`` of every precision that had a size fit, from a tune.json
    (validated as ``read_tuned`` does): what ``benchmark --tuned`` compares, each policy at
    its own fastest batch."""
    read_tuned(path, model, dataset)
    if os.path.isdir(path):
        path = os.path.join(path, "tune.json")
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    precisions = doc.get("precisions")
    if not isinstance(precisions, dict):
        raise _damaged(path, "it has no precisions")
    out = {}
    for policy, entry in precisions.items():
        best = entry.get("best_batch") if isinstance(entry, dict) else None
        if policy in POLICIES and isinstance(best, int) and not isinstance(best, bool) \
                and best >= 1:
            out[policy] = best
    return out


@dataclass(frozen=True)
class Merged:
    precision: str
    batch_size: int
    notes: List[str]


def merge(tuned: TunedChoice, precision: Optional[str], batch_size: Optional[int]) -> Merged:
    """Flags given explicitly win; the notes say which value came from where."""
    notes = []
    if precision is not None and precision != tuned.precision:
        notes.append(f"--precision {precision} overrides the tuned {tuned.precision}")
    if batch_size is not None and batch_size != tuned.batch_size:
        notes.append(f"--batch-size {batch_size} overrides the tuned {tuned.batch_size}")
    final_p = precision if precision is not None else tuned.precision
    final_b = batch_size if batch_size is not None else tuned.batch_size
    if precision is not None and final_p != tuned.precision and batch_size is None:
        notes.append(f"batch {final_b} was tuned for {tuned.precision}, not {final_p}: it may "
                     "not fit under the budget")
    return Merged(final_p, final_b, notes)


def scaled_learning_rate(mode: str, learning_rate: float, configured_batch: int,
                         batch_size: int) -> float:
    """``linear``: the learning rate times batch_size / configured_batch (the batch the
    learning rate was chosen for); ``none``: unchanged."""
    if mode not in SCALE_LR_CHOICES:
        raise UsageError(f"scale_lr must be one of {', '.join(SCALE_LR_CHOICES)}. "
                         f"Received: scale_lr={mode!r}", ", ".join(SCALE_LR_CHOICES))
    if configured_batch < 1 or batch_size < 1:
        raise UsageError(f"batch sizes must be at least 1 (configured {configured_batch}, "
                         f"used {batch_size})", "integers >= 1")
    if mode == "none":
        return learning_rate
    return learning_rate * batch_size / configured_batch


def optimization_note(configured_batch: int, batch_size: int, mode: str,
                      learning_rate: float, new_learning_rate: float,
                      what: Optional[str] = None) -> Optional[str]:
    """The console line when the tuned batch changes the optimisation.  ``batch_size``: the
    batch an update sees; ``what``: how the line names it (default ``batch N``)."""
    if batch_size == configured_batch:
        return None
    ratio = batch_size / configured_batch
    what = what or f"batch {batch_size}"
    if mode == "linear":
        return (f"{what} is {ratio:.2g}x the {configured_batch} the learning rate "
                f"was set for: --scale-lr linear makes it {new_learning_rate:g} "
                f"(from {learning_rate:g})")
    steps = "fewer, larger" if ratio > 1 else "more, smaller"
    return (f"{what} is {ratio:.2g}x the {configured_batch} the learning rate was "
            f"set for: {steps} steps per epoch change the optimisation; consider "
            f"--scale-lr linear (learning rate {learning_rate * ratio:g})")


def update_batch(micro_batch: int, accumulate: Optional[int] = None,
                 global_batch: Optional[int] = None) -> dict:
    """The batch an update sees, as far as it is known before the strategy exists (the
    replicas are not): ``micro_batch`` x the micro-batches per update in effect
    (``accumulate``: the tune's or one given), per replica like every batch size here; or
    the ``global_batch`` given (--global-batch: the whole update's, over all replicas; N is
    then known only with the replicas, None unless given)."""
    if global_batch is not None:
        return {"batch": global_batch, "micro_batch": micro_batch, "accumulate": accumulate,
                "per_replica": False}
    n = accumulate or 1
    return {"batch": micro_batch * n, "micro_batch": micro_batch, "accumulate": n,
            "per_replica": True}


def _batch_words(update: dict) -> str:
    """How the optimisation note names the batch an update sees."""
    if not update["per_replica"]:
        return (f"the global batch {update['batch']} an update sees (--global-batch, over all "
                "replicas)")
    if update["accumulate"] == 1:
        return f"batch {update['batch']} per replica"
    return (f"an update's batch {update['batch']} per replica (micro-batch "
            f"{update['micro_batch']} x {update['accumulate']})")


@dataclass(frozen=True)
class Applied:
    """What ``train --tuned`` trains with, and the ``tuned`` block of its metrics.json."""
    precision: str
    batch_size: int
    learning_rate: float
    record: dict
    accumulate: Optional[int] = None   # the tune's accumulation, when taken


def apply(path: str, *, model: str, dataset: str, precision: Optional[str],
          batch_size: Optional[int], learning_rate: float, scale_lr: str,
          default_batch: int, accumulation_given: bool = False,
          accumulate: Optional[int] = None, global_batch: Optional[int] = None) -> Applied:
    """The tune at ``path`` applied to a job: ``precision`` and ``batch_size`` are the ones
    given explicitly (flag or TFMP_ variable; None when not), which win over the tune's.
    The learning rate is scaled (``scale_lr`` linear) from the batch it was configured for,
    the tune's ``reference_batch_size`` or else ``default_batch``, to the batch an update
    sees: micro-batch x N, the N in effect (the tune's, or the ``accumulate`` given), or the
    ``global_batch`` given.  A tune's accumulation (tune --global-batch) is taken with its
    micro-batch, unless --accumulate or --global-batch (``accumulation_given``, or their
    values ``accumulate`` and ``global_batch``) or --batch-size was given."""
    choice = read_tuned(path, model, dataset)
    merged = merge(choice, precision, batch_size)
    reference = choice.reference_batch or default_batch
    accumulation_given = (accumulation_given or accumulate is not None
                          or global_batch is not None)
    take_n = choice.accumulate > 1 and not accumulation_given and batch_size is None
    update = update_batch(merged.batch_size, choice.accumulate if take_n else accumulate,
                          global_batch)
    new_lr = scaled_learning_rate(scale_lr, learning_rate, reference, update["batch"])
    taken = [name for name, given in (("precision", precision), ("batch_size", batch_size))
             if given is None] + (["accumulate"] if take_n else [])
    if choice.accumulate > 1 and not take_n:
        merged.notes.append(f"the tune's accumulation ({choice.batch_size} x "
                            f"{choice.accumulate}) is not used: a batch or accumulation was "
                            "given")
    if accumulation_given and accumulate is None and global_batch is None:
        # a caller that said an accumulation was given but not which: N is not known here
        merged.notes.append("the accumulation given is not counted in the batch the "
                            "learning rate is scaled for")
    overridden = {name: {"tuned": tuned_value, "used": given}
                  for name, given, tuned_value in (("precision", precision, choice.precision),
                                                   ("batch_size", batch_size, choice.batch_size))
                  if given is not None}
    record = {
        "path": os.path.abspath(choice.path),
        "choice": {"precision": choice.precision, "batch_size": choice.batch_size,
                   "accumulate": choice.accumulate,
                   "samples_per_second": choice.samples_per_second},
        "budget_bytes": choice.budget_bytes,
        "taken": taken, "overridden": overridden, "notes": merged.notes,
        "batch_size_is_per_replica": True,
        "reference_batch_size": reference,
        "scale_lr": scale_lr,
        # the batch the rate was scaled to: micro-batch x N (update_batch)
        "learning_rate": {"before": learning_rate, "after": new_lr,
                          "update_batch": update["batch"],
                          "micro_batch": update["micro_batch"],
                          "accumulate": update["accumulate"],
                          "update_batch_is_per_replica": update["per_replica"]},
        "optimization_note": optimization_note(reference, update["batch"], scale_lr,
                                               learning_rate, new_lr, _batch_words(update)),
    }
    return Applied(merged.precision, merged.batch_size, new_lr, record,
                   choice.accumulate if take_n else None)


def console_line(record: dict, replicas: Optional[int] = None) -> str:
    """The one line ``train --tuned`` prints: what it took, and how the batch changes the
    optimisation.  ``replicas`` (the strategy's, when the caller knows it): more than one
    says what an update sees over them, which a per-replica scaling does not count."""
    taken = record["taken"]
    used = ", ".join(f"{k.replace('_', ' ')} {record['choice'][k]}" for k in taken) or "nothing"
    parts = [f"tuned: {used} from {record['path']}"]
    parts += record["notes"]
    if record["optimization_note"]:
        parts.append(record["optimization_note"])
    lr = record.get("learning_rate") or {}
    if replicas and replicas > 1 and lr.get("update_batch_is_per_replica"):
        whole = lr["update_batch"] * replicas
        parts.append(f"that is per replica: the update sees {whole} over {replicas} replicas, "
                     f"which the learning rate is not scaled for (--global-batch {whole} "
                     "scales it for the whole update)")
    return "; ".join(parts)
