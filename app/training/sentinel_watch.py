"""The sentinel between steps: the monitor asks it, at every check, whether the step
counters show a fault (``app.numerics.rules``) and lets it probe each layer's headroom
every ``--numerics-every`` steps; at a fault the run asks it for the diagnosis
(``app.numerics.replay``).  What it saw goes into metrics.json's ``numerics``."""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Optional, Sequence

import tensorflow as tf

from app.core.errors import NumericsFault
from app.numerics import replay, rules
from app.numerics.diagnosis import Diagnosis, unreplayed
from app.numerics.headroom import Headroom, HeadroomProbe
from app.precision import loss_scale
from app.task import losses, model_layers


class SentinelWatch:
    def __init__(self, state, model, loss_fn, *, every: int, policy: str, loss_scaled: bool,
                 max_skipped_steps: int, probe_batch=None, global_batch: int = 1,
                 worker: Optional[int] = None, workers: int = 1,
                 pool: Optional[Callable[[object], list]] = None,
                 warn: Optional[Callable[[str], None]] = None,
                 on_probe: Optional[Callable[[int, dict], None]] = None, rows=None,
                 built_weights_max: Optional[float] = None, command_line: bool = True,
                 float32_layers: Sequence[str] = ()):
        # worker/workers: this worker's index and their number (multi-worker; worker None
        # otherwise); pool: every worker's JSON value, in worker order (Distribution.pool_json).
        # built_weights_max: a resumed run's weights' largest as the model was built, before
        # the checkpoint's were restored (the replay measures growth from there).
        # command_line, float32_layers: the run is tfmp train's (else app.train's) and the
        # layers it computes in float32, for the words of the headroom warnings (a fault's
        # report takes both from report()'s arguments and metrics.json).
        self.command_line, self.float32_layers = command_line, tuple(float32_layers)
        self.state, self.model, self.loss_fn = state, model, loss_fn
        self.every, self.policy, self.loss_scaled = every, policy, loss_scaled
        self.max_skipped_steps, self.global_batch, self.worker, self.workers = (
            max_skipped_steps, global_batch, worker, max(1, workers))
        self.pool = pool
        self.entries = model_layers.walk(model)
        self.probe = HeadroomProbe(model, self.entries) if probe_batch is not None else None
        self.probe_x = None if probe_batch is None else tf.nest.map_structure(
            tf.convert_to_tensor, probe_batch[0])
        self.headroom = Headroom()
        self.warnings: list = []
        self.last_probe = 0
        self.epoch_start_step = 0
        self.start_weights_max = replay.weights_max(model)
        self.built_weights_max = built_weights_max
        self.lock = threading.Lock()
        self.warn = warn or (lambda line: print(f"warning: {line}", file=sys.stderr, flush=True))
        self.probe_seconds = 0.0
        self.on_probe = on_probe
        self.rows = rows   # the training data's rows (app.task.data_rows), or None
        # Steps skipped that no epoch's row holds yet (the monitor's: StepMonitor sets it).
        self.unrecorded_skips: Callable[[], int] = lambda: 0

    def begin_epoch(self, step: int) -> None:
        self.epoch_start_step = step

    def fault(self, loss_scale_now: float) -> Optional[rules.Fault]:
        """The fault the counters show now (the latch, or a rule over the skipped steps)."""
        return rules.fault(self.state.counters(), loss_scaled=self.loss_scaled, policy=self.policy,
                           max_skipped_steps=self.max_skipped_steps,
                           loss_scale_now=loss_scale_now)

    def probe_if_due(self, step: int) -> Optional[rules.Fault]:
        """Every ``every`` steps: each layer's headroom (warnings once a layer) and the
        weights; a non-finite weight is a fault."""
        if self.probe is None or step - self.last_probe < self.every:
            return None
        with self.lock:
            self.last_probe = step - step % self.every
            t0 = time.perf_counter()
            probed = self.probe.measure(self.probe_x)
            for line in self.headroom.update(step, probed.layers, self.command_line,
                                             self.float32_layers):
                self.warnings.append(line)
                self.warn(line)
            if self.on_probe is not None:
                self.on_probe(step, self.headroom.scalars())
            self.probe_seconds += time.perf_counter() - t0
        return None if probed.weights_finite else rules.weights_fault(step)

    def raise_fault(self, optimizer, model=None) -> None:
        """Raise NumericsFault for what the counters show, a due probe finds, or, given the
        ``model`` (an epoch's end), a non-finite weight (an update that overflowed)."""
        step = int(self.state.stats.steps.numpy())
        fault = (self.fault(float(loss_scale.current_loss_scale(optimizer)))
                 or self.probe_if_due(step))
        if fault is None and model is not None and replay.nonfinite_weights(model.weights):
            fault = rules.weights_fault(step)
        if fault is not None:
            raise NumericsFault(fault)

    def diagnose(self, fault: rules.Fault, epoch: int, float32_layers: Sequence[str] = (),
                 command_line: bool = True):
        """The replay's diagnosis (``diagnose`` below), or None with nothing to replay;
        ``float32_layers``: the layers the run computes in float32 (--float32-layers);
        ``command_line``: the fix in tfmp train's words, else app.train's."""
        return diagnose(self, fault, epoch, float32_layers, command_line)

    def report(self, fault: rules.Fault, metrics: dict, *, epoch: int, checkpoint: str,
               fallback: str, output: Optional[str] = None, command_line: bool = True) -> None:
        """The fault's diagnosis into ``metrics`` (numerics.fault, the one-line diagnosis,
        status diverged) and its block on stderr; ``fallback``: what to try, when there is
        no batch to replay; ``output``, ``command_line``: the run's folder, and whether
        ``tfmp train`` (else ``app.train``) runs it, for the words of what to do next."""
        fault = fault.in_words(command_line)
        diag = self.diagnose(fault, epoch, run_float32_layers(metrics), command_line)
        if diag is None:   # a rule's fault, or one the step kept no batch of
            diag = unreplayed(fault.headline, fault.kind, fault.step, epoch, self.policy,
                              command_line=command_line, fallback=fallback,
                              weights=(replay.nonfinite_weights(self.model.weights)
                                       if fault.kind == "weights" else ()))
        numerics = metrics.setdefault("numerics", {})
        numerics["checkpoint"] = checkpoint
        numerics["fault"] = diag.to_json()
        lines, summary = diag.lines(output, command_line), diag.summary()
        metrics.update(status="diverged", diagnosis=summary)
        print("\n".join(lines), file=sys.stderr, flush=True)

    def to_json(self, skipped_steps: int) -> dict:
        """metrics.json's ``numerics``; ``skipped_steps``: those the epochs recorded hold,
        to which the steps skipped since are added (an epoch a fault or a signal ended)."""
        skipped_steps += self.unrecorded_skips()
        return {"sentinel": True, "every": self.every, "skipped_steps": skipped_steps,
                "headroom": self.headroom.to_json(), "warnings": list(self.warnings),
                "probe_seconds": round(self.probe_seconds, 3), "fault": None}


def run_float32_layers(metrics: dict) -> tuple:
    """The layers the run computes in float32, as it names them: metrics.json's
    ``task.float32_layers`` (--float32-layers, app.train's float32_layers=, or those a
    --resume kept), what a fix naming another layer must name too."""
    from app.core.errors import UsageError
    from app.task import float32_layers

    try:
        return float32_layers.parse((metrics.get("task") or {}).get("float32_layers"))
    except UsageError:
        return ()


def diagnose(watch: SentinelWatch, fault: rules.Fault, epoch: int,
             float32_layers: Sequence[str] = (), command_line: bool = True):
    """Replay the stashed batch of each local replica (the first whose replay shows the
    fault is the one named); None without a stash (a rule's fault, not the latch's).
    Several workers: each replays its own replicas' batches, and all of them take the first
    worker's that shows the fault (``pool``), so the chief's metrics.json names it."""
    found = _diagnose_here(watch, fault, epoch, tuple(float32_layers), command_line)
    if watch.pool is None:
        return found
    everyone = [d for d in watch.pool(None if found is None else found.to_json()) if d]
    shown = [d for d in everyone if d["verdict"] != "not reproduced"]
    if shown or everyone:
        return Diagnosis.from_json((shown or everyone)[0])
    return found


def _diagnose_here(watch: SentinelWatch, fault: rules.Fault, epoch: int,
                   float32_layers: tuple = (), command_line: bool = True):
    batches = watch.state.batches() if watch.state.latched() else []
    in_epoch = max(0, fault.step - watch.epoch_start_step - 1)
    local = max(1, len(watch.state.stash))
    piece = max(1, watch.global_batch // (local * watch.workers))   # one replica's share
    micro = watch.state.fault_micro_batch()   # --accumulate: the micro-batch's place
    start = (micro if micro >= 0 else in_epoch) * watch.global_batch
    found = None
    for i, batch in enumerate(batches):
        # The data are split by position: each global batch in replica-sized pieces, worker
        # w's local replica i taking piece i * workers + w (TensorFlow's rebatch, then the
        # shard by worker: distribute.shard_by_data).
        first = start + (i * watch.workers + (watch.worker or 0)) * piece
        failed = replay.FailedStep(
            fault, epoch, first, watch.policy, losses.name_of(watch.loss_fn),
            watch.start_weights_max, replica=i if len(batches) > 1 else None,
            worker=watch.worker, rows=watch.rows, built_weights_max=watch.built_weights_max,
            float32_layers=float32_layers, command_line=command_line)
        found = replay.diagnose(watch.model, watch.loss_fn, watch.entries, batch, failed)
        if found.verdict != "not reproduced":
            return found
    return found
