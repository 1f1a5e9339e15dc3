"""The numerics sentinel inside the training step: every step, is the loss finite, are the
gradients; a step that is not never reaches the weights, and the first fault is latched
with its batch, so the state that failed can be replayed (``app.numerics.replay``).

Cost per step, without loss scaling: one sum over the gradients, the loss and ``halt``
(0, NaN once a fault is latched) - finite only when every element is (``finite.sum_finite``:
the pass a LossScaleOptimizer makes anyway, in half its ops, and a large dense kernel's
gradient proved finite from its two smaller factors before it is made) - then the update
behind one pivot that is dead unless the test passed (``_gated``; in ``Model.fit``'s step
a ``tf.cond``, which measured faster there), and a ``tf.cond`` for the fault's branch.
Nothing else runs on an ordinary step:
on a CPU each scalar op costs microseconds, and what the fault was is worked out in its
branch.  Under loss scaling: a scalar test of the loss, a read of the optimizer's step
count (for ``rewind``), and nothing more than the optimizer's own check (a faulty step is handed to it poisoned, so it skips it).  Several
replicas agree in one all-reduce a step (the gradients and the loss together).  No
``check_numerics`` ops: they break XLA.

The latch (``fault``: the step, the code of ``app.numerics.rules``, the loss scale and the
optimizer's step count before the step, one variable written by one assign) is set at the
step:
* the loss is not finite (forward);
* without loss scaling, a gradient is not finite;
* under loss scaling, ``rules.FLOOR_PATIENCE`` steps in a row skipped at the floor.
From then on every update is skipped; the monitor reads the latch between steps.  The
steps that run before it does (up to ``--log-every`` in the custom loop, a poll's worth in
fit) still count, and under loss scaling each is handed to the optimizer poisoned, which
lowers the scale: ``rewind`` puts the step count, the scale and the optimizer's iterations
back to what they were before the faulty step, so the checkpoint saved at the fault holds
the state that failed and a ``--resume`` after the fix trains from it.

The batch is stashed at the fault only, in a branch an ordinary step does not take (a
cond taken when the update is not, without loss scaling; under loss scaling a cond at the
step's end taken by any skipped step), so an ordinary step copies nothing batch-sized.
(The copy at every step's start that this replaced took 0-1.4% of the small CNN's step on
a 2-core CPU; on a GPU it is a batch-sized device copy a step.)  The latch is written in
the same branch, after the stash.  Every replica decides from values the replicas agree
on (the loss and gradient checks, the optimizer's skip), so each keeps its own part of
the same step.

The variables live outside the strategy's scope, like ``StepStats``: the first replica of
each worker writes the latch, each replica stashes its own batch.
"""
from __future__ import annotations

import threading

import numpy as np
import tensorflow as tf

from app.numerics import rules
from app.precision import finite, loss_scale
from app.training.batch_stash import BatchStash


def _var(name, dtype, value=0):
    return tf.Variable(tf.constant(value, dtype), trainable=False, name=name)


class SentinelState:
    """The latch and the stashed batches, in variables the step writes."""

    def __init__(self, stats, element_spec, local_replicas: int = 1, batch_size: int = 0):
        self.stats = stats
        # (step, code, the loss scale's float32 bits, under --accumulate the faulty
        # micro-batch's place in its epoch, else -1, and under loss scaling the optimizer's
        # iterations before the step, else -1): one variable, so a reader in another
        # thread (fit's poll) never sees a code without the rest.
        self.fault = tf.Variable(tf.constant([-1, 0, _scale_bits(1.0), -1, -1], tf.int64),
                                 trainable=False, name="sentinel_fault")
        # 0, or NaN once a fault is latched: the unscaled guard adds it to its sum of the
        # gradients, so after a fault no update is applied, for no op of its own.
        self.halt = _var("sentinel_halt", tf.float32)
        self.run_start = _var("sentinel_run_start", tf.int64)
        self.floor_in_a_row = _var("sentinel_floor_in_a_row", tf.int64)
        self.stash = BatchStash(element_spec, local_replicas, batch_size)
        self.fit = FitView()

    # ---- read from Python, between steps ------------------------------------------------
    def counters(self) -> rules.Counters:
        st = self.stats
        fault_step, code, scale, _, _ = (int(v) for v in self.fault.numpy())
        return rules.Counters(
            step=int(st.steps.numpy()), fault_step=fault_step, fault_code=code,
            fault_scale=_scale_of(scale), run_start=int(self.run_start.numpy()),
            skipped_total=int(st.nonfinite_total.numpy()), worst_run=int(st.max_consecutive.numpy()),
            in_a_row=int(st.consecutive.numpy()))

    def latched(self) -> bool:
        return int(self.fault.numpy()[1]) > 0

    def fault_micro_batch(self) -> int:
        """Under --accumulate, the faulty micro-batch's place in its epoch; else -1."""
        return int(self.fault.numpy()[3])

    def rewind(self, opt) -> int:
        """After a latched fault, before the checkpoint is saved: undo what the steps
        that ran from the faulty one on did to the counters, and return the step count to
        save.  Their updates never landed (``halt``, or under loss scaling the poisoned
        gradients), but each counted a step, and under loss scaling each lowered the scale
        (Keras 2's also counted an optimizer iteration).  Back to the state the faulty
        step started from: the step count before it, the loss scale it ran with (latched:
        ``before``) and the optimizer's iterations then; a ``--resume`` after the fix
        trains the failing batch again, at a scale that can train.  The skipped steps
        they added to the count are taken off it too (metrics.json's
        ``numerics.skipped_steps`` counts loss scaling's skips).  No latch (a rule's
        fault, a weight): the counters as they are."""
        step, code, scale, _, iterations = (int(v) for v in self.fault.numpy())
        if code <= 0 or step < 1:
            return int(self.stats.steps.numpy())
        halted = int(self.stats.steps.numpy()) - (step - 1)
        self.stats.steps.assign(step - 1)
        if loss_scale.is_loss_scaled(opt):
            loss_scale.set_loss_scale(opt, _scale_of(scale))
            # Each of them was counted a skipped step (handed to the optimizer poisoned):
            # not loss scaling's overflow, and not in metrics.json's count of it.
            total = self.stats.nonfinite_total
            total.assign(tf.maximum(total - halted, 0))
        if iterations >= 0:
            opt.iterations.assign(iterations)
        return step - 1

    def batches(self) -> list:
        """The stashed batch of each local replica, as the dataset's structure."""
        return self.stash.batches()

    # ---- inside the step ----------------------------------------------------------------
    def guard(self, opt, grads, loss, batch, apply, accumulated: bool = False,
              position=None, pivot: bool = True) -> tuple:
        """Apply ``grads`` with ``apply(grads)`` (which returns whether the LossScaleOptimizer
        skipped the step, or None without one) unless the step is faulty or a fault is
        latched; latch a new fault with ``batch``.  ``accumulated``: ``apply(grads, ok)``
        is a micro-batch of ``app.training.accumulate`` returning (skipped, update); it
        applies no group holding a micro-batch that is not ``ok``, and the step latched is
        the update the micro-batch belongs to, ``position`` the micro-batch's place in its
        epoch (latched too, for the replay's sample numbers).  Returns (the gradients as applied, the
        skipped tensor or None, the update tensor or None).
        ``loss`` None (a fit step whose train_step never called compute_loss): the
        gradients alone decide.  ``pivot`` False: the update in a ``tf.cond`` rather than
        behind a pivot (``_gated``), as ``Model.fit``'s step wants it."""
        grads = list(grads)
        if loss_scale.is_loss_scaled(opt):
            return _guard_scaled(self, opt, grads, loss, batch, apply, accumulated, position)
        return _guard_unscaled(self, grads, loss, batch, apply, accumulated, position,
                               pivot=pivot and getattr(opt, "built", True))

    def _latch(self, code, step, scale, position, iterations=None):
        """The latch's write for the stash's branch: the first replica's, after its stash.
        ``code`` and ``step``: functions giving them, called inside the branch;
        ``iterations``: the optimizer's before the step (under loss scaling), or None."""
        if _replica_index() != 0:
            return None
        return lambda: _write_fault(self.fault, self.halt, code(), step(), scale, position,
                                    iterations)

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


def _guard_scaled(state: SentinelState, opt, grads, loss, batch, apply, accumulated,
                  position) -> tuple:
    """Under loss scaling: a faulty step is handed to the optimizer poisoned (it skips
    it); the floor's run is counted, and every skipped step's batch is kept (a skip is
    rare, and the fault step is one: the stash then holds the batch of the step the
    latch names)."""
    latched = state.fault[0] >= 0
    loss_ok = tf.constant(True) if loss is None else loss_scale.agreed(_finite(loss))
    step = state.stats.steps + 1
    before = loss_scale.current_loss_scale(opt)
    # Read before the update, as ``before`` is (the latch keeps both for ``rewind``).
    iterations = tf.identity(opt.iterations)
    grads = loss_scale.poisoned(grads, tf.logical_or(latched, tf.logical_not(loss_ok)))
    skipped, update = apply(grads, None) if accumulated else (apply(grads), None)
    at_floor = tf.logical_and(skipped, before <= rules.FLOOR)
    floor = tf.where(state._floor_run(at_floor, update) >= rules.FLOOR_PATIENCE,
                     tf.constant(3, tf.int64), tf.constant(0, tf.int64))
    code = tf.where(loss_ok, floor, tf.constant(1, tf.int64))
    state._note_skips(skipped, step)
    if batch is not None:
        # Every replica the same: the floor count is written by the first replica only.
        suspect = tf.logical_or(tf.logical_not(loss_ok), skipped)
        _cond(tf.logical_and(tf.logical_not(latched), suspect), state.stash.writer(
            _replica_index(), batch,
            then=state._latch(lambda: code, lambda: step, before, position, iterations)))
    return grads, skipped, update


def _guard_unscaled(state: SentinelState, grads, loss, batch, apply, accumulated,
                    position, pivot: bool = True) -> tuple:
    """Without loss scaling: the update only when one sum of the gradients, the loss and
    ``halt`` (NaN once a fault is latched) is finite.  On a CPU each scalar op of the step
    costs microseconds, so an ordinary step runs no other: the sum, a test, the gate.
    What the fault was, and whether one is latched already, is worked out in the
    fault's branch."""
    several = loss_scale.multi_replica_context() is not None
    all_finite = finite.sum_finite(grads, scalars=[tf.convert_to_tensor(state.halt), loss])
    agreed_loss = None
    if several and loss is not None:
        # Whether the loss was finite everywhere is agreed on here, outside the fault's
        # branch (no collective may run inside a replica's cond), in the same all-reduce.
        ok, agreed_loss = loss_scale.agreed_all(all_finite, _finite(loss))
    else:
        ok = loss_scale.agreed(all_finite)
    keep = None
    if batch is not None:
        def code():   # the loss, else a gradient
            loss_ok = (tf.constant(True) if loss is None else
                       agreed_loss if agreed_loss is not None else _finite(loss))
            return tf.where(loss_ok, tf.constant(2, tf.int64), tf.constant(1, tf.int64))
        write = state.stash.writer(_replica_index(), batch, then=state._latch(
            code, lambda: state.stats.steps + 1, tf.constant(1.0), position))

        # A new fault only: one latched before keeps its batch.  Several replicas read
        # the latch before the step, as the first one writes it in its branch.
        free = state.fault[0] < 0 if several else None

        def keep():
            _cond(state.fault[0] < 0 if free is None else free, write)
    update = None
    if accumulated:
        _, update = apply(grads, ok)
    elif loss_scale.strategy_replica_context() is None:
        _gated(ok, lambda: apply(grads), keep, pivot=pivot)
        return grads, None, None
    else:   # under a strategy, one replica or several: the update synchronises
        _apply_if(ok, lambda *g: apply(list(g)), grads)
    if keep is not None:
        _cond(ok, lambda: None, keep)
    return grads, None, update


def _write_fault(fault, halt, code, step, scale, position=None, iterations=None) -> None:
    """A new fault (``code`` > 0) into the latch ``fault``: its step, code, scale,
    micro-batch position and the optimizer's iterations before it, in one assign (one variable: a reader in another thread never
    sees a code without the rest); ``halt`` becomes NaN, which stops every update after
    it.  Run by the first replica, after its stash, in the branch only a suspect step
    takes."""
    micro = tf.constant(-1, tf.int64) if position is None else tf.cast(position, tf.int64)
    iters = (tf.constant(-1, tf.int64) if iterations is None
             else tf.cast(iterations, tf.int64))
    value = tf.stack([step, code, _scale_bits(scale), micro, iters])
    new = code > 0
    with tf.control_dependencies([fault.assign(tf.where(new, value, fault), read_value=False)]):
        halt.assign(tf.where(new, float("nan"), halt), read_value=False)


def _finite(loss):
    """Is the loss finite (every element of a loss that is not a scalar)."""
    ok = tf.math.is_finite(tf.cast(loss, tf.float32))
    return ok if ok.shape.rank == 0 else tf.reduce_all(ok)


def _scale_bits(scale):
    """The loss scale as its float32 bit pattern in an int64 (the latch is one int64 vector)."""
    if isinstance(scale, float):
        return int(np.array(scale, np.float32).view(np.int32))
    return tf.cast(tf.bitcast(tf.cast(scale, tf.float32), tf.int32), tf.int64)


def _scale_of(bits: int) -> float:
    return float(np.array(bits, np.int64).astype(np.int32).view(np.float32))


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


def _cond(pred, then, otherwise=None) -> None:
    """Run ``then()`` (and else ``otherwise()``) for their effects only."""
    def branch(fn):
        def run():
            fn()
            return tf.constant(True)
        return run
    tf.cond(pred, branch(then), branch(otherwise or (lambda: None)))


def _gated(ok, then, otherwise=None, pivot: bool = True) -> None:
    """One replica: ``then()`` only when ``ok``, else ``otherwise()``, for their effects.

    Every op ``then`` makes waits on a pivot that is dead unless ``ok`` (a Switch and its
    Identity, as ``tf.cond`` was built before it was one op): on a skipped step none of
    them runs, not even the optimizer's step count, and on an ordinary step they start
    the moment ``ok`` is known.  A ``tf.cond`` around the update routes every tensor its
    branch reads (each gradient, variable and optimizer slot: 45 for the mlp) through a
    Switch and an Identity, one after another on one thread after the test: about 60 us of
    the mlp's 3.3 ms step in TF 2.9's trace, 1.0 +- 0.4 points of its cost pooled over
    120 pairs of processes (docs/numerics-cost-record.md).  ``otherwise`` stays a
    ``tf.cond``: its branch reads the step counter that later ops write, which must not
    inherit a dead input on every ordinary step.  For the same reason nothing after
    ``then`` in the step may touch the variables it writes (the model's and the
    optimizer's); the steps here touch neither.
    XLA compiles no Switch: under ``jit_compile`` the whole is a ``tf.cond``; so it is
    when not ``pivot``: in ``Model.fit``'s step (Keras 2's fit measured the pivot 2 points
    slower than the cond), and in Keras 3's first trace of the custom step, which makes
    the optimizer's variables, whose initial values TensorFlow lifts out of the function
    and no control edge may hold (the second trace makes none)."""
    if _in_xla() or not pivot:
        _cond(ok, then, otherwise)
        return
    # On a GPU the Switch reads ``ok`` in host memory, as any cond's does: the update's
    # kernels are launched once the test's result reaches the host (docs/numerics.md).
    if_not, if_ok = tf.raw_ops.Switch(data=ok, pred=ok)
    # The Identity is the pivot: a control edge from the Switch itself is never dead.
    if_ok_pivot = tf.identity(if_ok)
    with tf.control_dependencies([if_ok_pivot]):
        then()
    # A Merge is live whichever way the Switch went.  TensorFlow's automatic control
    # dependencies make it wait on every stateful op before it and stand in for them as
    # the step's control output and the last writer of their variables, so no dead op
    # is either: a dead control output would make the outputs of any function the step
    # is inlined into dead on a skipped step (Keras 3's fit did, while fit took this path).
    tf.raw_ops.Merge(inputs=[if_not, if_ok_pivot])
    if otherwise is not None:
        _cond(ok, lambda: None, otherwise)


def _in_xla() -> bool:
    """Is the step being traced for XLA (``jit_compile``)?  True when it cannot tell."""
    try:
        from tensorflow.python.ops import control_flow_util  # internal; TF 2.9 to 2.21 have it
    except ImportError:
        return True
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def _apply_if(ok, apply, grads) -> None:
    """Under a strategy (one replica or several): run ``apply(*grads)`` on each replica only
    when ``ok`` (the same on every replica).  The ``cond`` is taken in the cross-replica
    context, since TensorFlow refuses a cond in a replica context whose branch synchronises
    (the optimizer's all-reduce, or Keras 2's merge_call for one replica), as Keras'
    LossScaleOptimizer does."""
    def cross(distribution, ok, *per_replica):
        def yes():
            distribution.extended.call_for_each_replica(apply, args=per_replica)
            return tf.constant(True)
        first = distribution.experimental_local_results(ok)[0]
        return tf.cond(first, yes, lambda: tf.constant(False))
    loss_scale.strategy_replica_context().merge_call(cross, args=(ok, *grads))
