"""The numerics sentinel inside the training step: every step, is the loss finite, are the
gradients; a step that is not never reaches the weights, and the first fault is latched
with its batch, so the state that failed can be replayed (``app.numerics.replay``).

Cost per step: one scalar test of the loss; without loss scaling one pass over the
gradients (``all_finite``, the pass a LossScaleOptimizer makes anyway) and a ``tf.cond``
around the apply; under loss scaling nothing more than the optimizer's own check (a
faulty step is handed to it poisoned, so it skips it).  Several replicas agree with one
scalar all-reduce.  No ``check_numerics`` ops: they break XLA.

The latch (``fault_step``, ``fault_code``: ``app.numerics.rules``) is set at the step:
* the loss is not finite (forward);
* without loss scaling, a gradient is not finite;
* under loss scaling, ``rules.FLOOR_PATIENCE`` steps in a row skipped at the floor.
From then on every update is skipped; the monitor reads the latch between steps.

The variables live outside the strategy's scope, like ``StepStats``: the first replica of
each worker writes the latch, each replica stashes its own batch.
"""
from __future__ import annotations

import threading
import tensorflow as tf

from app.numerics import rules
from app.precision import loss_scale
from app.training.batch_stash import BatchStash


def _var(name, dtype, value=0):
    return tf.Variable(tf.constant(value, dtype), trainable=False, name=name)


class SentinelState:
    """The latch and the stashed batches, in variables the step writes."""

    def __init__(self, stats, element_spec, local_replicas: int = 1, batch_size: int = 0):
        self.stats = stats
        self.fault_step = _var("sentinel_fault_step", tf.int64, -1)
        self.fault_code = _var("sentinel_fault_code", tf.int64)
        self.fault_scale = _var("sentinel_fault_scale", tf.float32, 1.0)
        self.run_start = _var("sentinel_run_start", tf.int64)
        self.floor_in_a_row = _var("sentinel_floor_in_a_row", tf.int64)
        # --accumulate: the faulty micro-batch's place in its epoch (-1: not accumulating)
        self.fault_micro = _var("sentinel_fault_micro_batch", tf.int64, -1)
        self.stash = BatchStash(element_spec, local_replicas, batch_size)
        self.fit = FitView()

    # ---- read from Python, between steps ------------------------------------------------
    def counters(self) -> rules.Counters:
        st = self.stats
        code = int(self.fault_code.numpy())   # first: see _latch
        return rules.Counters(
            step=int(st.steps.numpy()), fault_step=int(self.fault_step.numpy()),
            fault_code=code, fault_scale=float(self.fault_scale.numpy()),
            run_start=int(self.run_start.numpy()), skipped_total=int(st.nonfinite_total.numpy()),
            worst_run=int(st.max_consecutive.numpy()))

    def latched(self) -> bool:
        return int(self.fault_code.numpy()) > 0

    def batches(self) -> list:
        """The stashed batch of each local replica, as the dataset's structure."""
        return self.stash.batches()

    # ---- inside the step ----------------------------------------------------------------
    def guard(self, opt, grads, loss, batch, apply, accumulated: bool = False,
              position=None) -> tuple:
        """Apply ``grads`` with ``apply(grads)`` (which returns whether the LossScaleOptimizer
        skipped the step, or None without one) unless the step is faulty or a fault is
        latched; latch a new fault with ``batch``.  ``accumulated``: ``apply(grads, ok)``
        is a micro-batch of ``app.training.accumulate`` returning (skipped, update); it
        applies no group holding a micro-batch that is not ``ok``, and the step latched is
        the update the micro-batch belongs to, ``position`` the micro-batch's place in its
        epoch (latched too, for the replay's sample numbers).  Returns (the gradients as applied, the
        skipped tensor or None, the update tensor or None).
        ``loss`` None (a fit step whose train_step never called compute_loss): the
        gradients alone decide."""
        grads = list(grads)
        latched = self.fault_step >= 0
        loss_ok = tf.constant(True) if loss is None else loss_scale.agreed(
            tf.reduce_all(tf.math.is_finite(tf.cast(loss, tf.float32))))
        step = self.stats.steps + 1
        none, forward = tf.constant(0, tf.int64), tf.constant(1, tf.int64)
        update = None
        if loss_scale.is_loss_scaled(opt):
            before = loss_scale.current_loss_scale(opt)
            grads = loss_scale.poisoned(grads, tf.logical_or(latched, tf.logical_not(loss_ok)))
            skipped, update = apply(grads, None) if accumulated else (apply(grads), None)
            at_floor = tf.logical_and(skipped, before <= rules.FLOOR)
            floor = tf.where(self._floor_run(at_floor, update) >= rules.FLOOR_PATIENCE,
                             tf.constant(3, tf.int64), none)
            code = tf.where(loss_ok, floor, forward)
            self._note_skips(skipped, step)
        else:
            before, skipped = tf.constant(1.0), None
            grads_ok = loss_scale.agreed(loss_scale.all_finite(grads))
            ok = tf.logical_and(tf.logical_not(latched), tf.logical_and(loss_ok, grads_ok))
            if accumulated:
                _, update = apply(grads, ok)
            else:
                _apply_if(ok, lambda *g: apply(list(g)), grads)
            code = tf.where(loss_ok, tf.where(grads_ok, none, tf.constant(2, tf.int64)), forward)
        if batch is not None:
            self._latch(tf.logical_and(tf.logical_not(latched), code > 0), code, step, before,
                        batch, position)
        return grads, skipped, update

    def _floor_run(self, at_floor, update=None):
        """Updates in a row skipped at the floor, this one counted (a micro-batch that did
        not update leaves the count as it is)."""
        new = tf.where(at_floor, self.floor_in_a_row + 1, tf.constant(0, tf.int64))
        if update is not None:
            new = tf.where(update, new, self.floor_in_a_row)
        return _first_replica_assign(self.floor_in_a_row, new)

    def _note_skips(self, skipped, step):
        # stats.consecutive still holds the run before this step: a run begins here.
        begins = tf.logical_and(skipped, tf.equal(self.stats.consecutive, 0))
        _first_replica_assign(self.run_start, tf.where(begins, step, self.run_start))

    def _latch(self, new, code, step, scale, batch, position=None):
        """At a new fault: the code, the step and the scale (first replica), and each
        replica's own batch.  Written every step with ``tf.where`` (keep or replace) rather
        than under a ``tf.cond``: a cond holding the batch measured ~25% of a small CNN's
        step in waiting (bench_sentinel.py), a select of a batch-sized buffer costs far less.
        A sample of unknown shape (no fixed-size stash) is written under a cond."""
        replica = _replica_index()
        if not self.stash.fixed:
            tf.cond(new, lambda: _write(self, True, code, step, scale, batch, replica, position),
                    lambda: tf.constant(False))
            return
        _write(self, new, code, step, scale, batch, replica, position)

def _write(state, new, code, step, scale, batch, replica, position=None):
    """``SentinelState._latch``'s writes: keep each value, or replace it at a new fault."""
    def keep_or(value, var):
        return var.assign(tf.where(new, tf.cast(value, var.dtype), var), read_value=False)
    with tf.control_dependencies(state.stash.write(replica, batch, new)):
        stashed = state.stash.count.assign_add(tf.cast(new, tf.int64))
        if replica == 0:
            # The code last, after everything it vouches for: a reader that sees it
            # set (the monitor's thread, mid-step) sees the rest (``counters``).
            with tf.control_dependencies([stashed]):
                done = [keep_or(step, state.fault_step), keep_or(scale, state.fault_scale)]
                if position is not None:
                    done.append(keep_or(position, state.fault_micro))
            with tf.control_dependencies(done):
                keep_or(code, state.fault_code)
    return tf.constant(True)


class FitView:
    """What the optimizer wrapper (``step_stats.attach_stats_to_optimizer``) needs of
    ``Model.fit``'s own step: its batch and its loss, seen by wrapping this model instance's
    ``train_step`` and ``compute_loss`` (both Kerases call them by attribute).  Per thread:
    MirroredStrategy traces each replica's step in a thread of its own."""

    def __init__(self):
        self._local = threading.local()

    def attach(self, model) -> None:
        local, train_step, compute_loss = self._local, model.train_step, model.compute_loss

        def watched_train_step(data):
            local.batch = data
            try:
                return train_step(data)
            finally:
                local.batch = local.loss = None

        def watched_compute_loss(*args, **kwargs):
            loss = compute_loss(*args, **kwargs)
            local.loss = loss
            return loss
        object.__setattr__(model, "train_step", watched_train_step)
        object.__setattr__(model, "compute_loss", watched_compute_loss)

    def step(self):
        """(loss, batch) of the fit step being traced in this thread (loss None when the
        model's own train_step does not call compute_loss, or it is another graph's)."""
        loss, batch = getattr(self._local, "loss", None), getattr(self._local, "batch", None)
        graph = tf.compat.v1.get_default_graph()
        if loss is not None and getattr(loss, "graph", graph) is not graph:
            loss = None
        return loss, batch


def _replica_index() -> int:
    """This replica's index among the worker's local replicas (a Python int in the graph)."""
    ctx = loss_scale.multi_replica_context()
    if ctx is None:
        return 0
    local = len(tf.distribute.get_strategy().extended.worker_devices)
    rid = tf.get_static_value(ctx.replica_id_in_sync_group)
    return int(rid) % local if rid is not None else 0


def _first_replica_assign(var, value):
    """Assign in the first replica only (the others read it); returns the new value."""
    if _replica_index() != 0:
        return value
    var.assign(value)
    return value


def _apply_if(ok, apply, grads) -> None:
    """Run ``apply(*grads)`` only when ``ok`` (the same on every replica).  Several replicas:
    the ``cond`` is taken in the cross-replica context, since TensorFlow refuses a cond in a
    replica context whose branch synchronises (the optimizer's all-reduce), as Keras'
    LossScaleOptimizer does."""
    ctx = loss_scale.multi_replica_context()

    def yes_one():
        apply(*grads)
        return tf.constant(True)
    if ctx is None:
        tf.cond(ok, yes_one, lambda: tf.constant(False))
        return

    def cross(distribution, ok, *per_replica):
        def yes():
            distribution.extended.call_for_each_replica(apply, args=per_replica)
            return tf.constant(True)
        first = distribution.experimental_local_results(ok)[0]
        return tf.cond(first, yes, lambda: tf.constant(False))
    ctx.merge_call(cross, args=(ok, *grads))
