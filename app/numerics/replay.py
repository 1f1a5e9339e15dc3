"""The replay of a failing batch from the weights that failed, layer by layer, forward then
backward, under the run's policy and again with every layer in float32, and what it says
(``diagnose``: an ``app.numerics.diagnosis.Diagnosis``).

Each pass is one traced function (a new one per pass: the float32 pass changes the
layers' policies): the tap (``app.numerics.tap``) records every layer call while tracing,
and the function returns, for each call, whether its outputs are finite, their largest
finite magnitude, its inputs' largest, and whether the gradients through its outputs and
inputs are; then each variable's gradient and each sample's loss.  The backward pass
differentiates the loss times the loss scale the failing step ran with, so a float16
gradient overflows where training's did.  The pass runs with ``training=True``, as the
step did (dropout draws anew); the model's non-trainable state (BatchNormalization's moving
statistics) is put back afterwards (``state_kept``).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf

from app.numerics import diagnosis as dx
from app.numerics import inside, limits, rules
from app.numerics.tap import Tap, largest_finite
from app.precision import finite, layer_policy
from app.task.data_rows import MOST_LISTED, SHOWN, nonfinite_rows
from app.task.losses import weighted

# Weights this many times larger than at the start, with the batch non-finite in float32
# too, point at the optimizer (the learning rate) rather than the model.
GROWTH_FOR_OPTIMIZER = 1e4
# The rows of at most this many samples whose loss is not finite are looked for (each a
# search of the training data).
MOST_ROWS_SEARCHED = 12


@dataclass
class CallResult:
    path: str
    class_name: str
    dtype: Optional[str]
    layer: object
    out_finite: bool
    out_max: float
    in_max: float
    grad_out_finite: bool
    grad_in_finite: bool
    # What Keras cast to the layer's 16-bit dtype before its call (``tap.cast_sources``):
    # its largest finite magnitude before the cast (0: nothing cast), whether the inputs the
    # call took are finite, and the layer whose output it was (None: not a recorded one,
    # the model's input say).
    in_cast_max: float = 0.0
    in_finite: bool = True
    cast_from: Optional[str] = None


@dataclass
class PassResult:
    calls: List[CallResult]
    loss_finite: bool
    # Per sample of the batch: its loss is finite; None when the loss function returns no
    # value per sample (a loss that reduces itself to a scalar): the loss as a whole.
    sample_finite: Optional[np.ndarray]
    bad_variables: List[str]       # variables whose gradient is not finite, backward order
    bad_objects: list = None       # the same variables

    @property
    def finite(self) -> bool:
        return (self.loss_finite and not self.bad_variables
                and all(c.out_finite and c.grad_in_finite for c in self.calls))


def run_pass(model, loss_fn, entries, x, y, scale: float, sample_weight=None) -> PassResult:
    """One forward and backward pass of ``x, y`` through ``model`` as its layers' policies
    are now, gradients of ``loss * scale`` (each sample's loss times its ``sample_weight``,
    as training weighed it)."""
    variables = list(model.trainable_variables)
    meta: list = []
    meta_rank: list = []   # the rank of what the loss function returns (None: unknown)

    @tf.function
    def run(x, y, scale, sample_weight):
        with tf.GradientTape() as tape:
            with Tap(entries) as tap, tap.recording() as calls:
                preds = model(x, training=True)
            per_example = weighted(loss_fn(y, preds), sample_weight)
            loss = tf.reduce_mean(tf.cast(per_example, tf.float32))
            if model.losses:
                loss += tf.cast(tf.add_n(model.losses), tf.float32)
            scaled = tf.cast(loss, tf.float32) * scale
        meta[:] = calls
        flat = [t for c in calls for t in c.inputs + c.outputs]
        grads = tape.gradient(scaled, variables + flat,
                              unconnected_gradients=tf.UnconnectedGradients.NONE)
        var_grads, rest = grads[:len(variables)], grads[len(variables):]
        per_call, i = [], 0
        for c in calls:
            g_in, g_out = rest[i:i + len(c.inputs)], rest[i + len(c.inputs):i + len(c.inputs) + len(c.outputs)]
            i += len(c.inputs) + len(c.outputs)
            per_call.append(tf.stack([
                tf.cast(finite.all_finite(c.outputs), tf.float32), largest_finite(c.outputs),
                largest_finite(c.inputs), tf.cast(finite.all_finite(g_out), tf.float32),
                tf.cast(finite.all_finite(g_in), tf.float32), largest_finite(c.cast_from),
                tf.cast(finite.all_finite(c.inputs), tf.float32) if c.inputs
                else tf.constant(1.0)]))
        # Each sample's loss, one row a sample: a loss of any rank (a loss that reduces
        # itself to a scalar is one row, the batch as a whole).
        lead = tf.reduce_prod(tf.shape(per_example)[:1])
        sample = tf.reshape(tf.cast(per_example, tf.float32), [lead, -1])
        meta_rank[:] = [per_example.shape.rank]
        return (tf.stack(per_call) if per_call else tf.zeros([0, 7]),
                tf.math.is_finite(loss),
                tf.reduce_all(tf.math.is_finite(sample), axis=1),
                tf.stack([finite.all_finite([g]) for g in var_grads]) if var_grads else tf.zeros([0], tf.bool))

    per_call, loss_ok, sample_ok, var_ok = run(x, y, tf.constant(scale, tf.float32),
                                               sample_weight)
    per_call = per_call.numpy()
    calls = [CallResult(c.path, c.class_name, c.dtype, c.layer, bool(r[0]), float(r[1]),
                        float(r[2]), bool(r[3]), bool(r[4]), float(r[5]), bool(r[6]),
                        _made_by(c.cast_from, meta[:i]))
             for i, (c, r) in enumerate(zip(meta, per_call))]
    bad = list(reversed([v for v, ok in zip(variables, var_ok.numpy()) if not ok]))
    sample_ok = sample_ok.numpy()
    # Per sample only when the loss returns a value for each sample of the batch: a scalar
    # (or a loss whose first dimension is not the batch's) names no sample.
    per_sample = (meta_rank[0] if meta_rank else None) != 0 and \
        sample_ok.shape[0] == batch_size(x)
    return PassResult(calls, bool(loss_ok), sample_ok if per_sample else None,
                      [v.name for v in bad], bad)


def _made_by(tensors, before) -> Optional[str]:
    """The path of the recorded layer call among ``before`` whose output one of
    ``tensors`` is (the innermost), None for none."""
    names = {t.name for t in tensors}
    if not names:
        return None
    for c in before:
        if any(getattr(o, "name", None) in names for o in c.outputs):
            return c.path
    return None


def batch_size(x) -> Optional[int]:
    """The number of samples in the batch ``x`` (any structure), None when unknown."""
    for t in tf.nest.flatten(x):
        shape = getattr(t, "shape", None)
        if shape is not None and len(shape) and shape[0] is not None:
            return int(shape[0])
    return None


@contextlib.contextmanager
def all_float32(entries, model):
    """Every layer (and the model) computing in float32 for the duration."""
    layers = [model] + [layer for _path, layer, _parent in entries]
    before = [(layer, layer_policy.policy_name(layer)) for layer in layers]
    try:
        for layer in layers:
            layer_policy.set_policy(layer, "float32")
        yield
    finally:
        for layer, name in before:
            layer_policy.set_policy(layer, name)


def nonfinite_samples(x) -> List[int]:
    """Positions in the batch of the samples of ``x`` (any structure) that are not finite."""
    bad = None
    for t in tf.nest.flatten(x):
        if not getattr(getattr(t, "dtype", None), "is_floating", False):
            continue
        a = np.asarray(t)
        rows = nonfinite_rows(a) if a.ndim else None
        if rows is not None:
            bad = rows if bad is None else (bad | rows)
    return [int(i) for i in np.flatnonzero(bad)] if bad is not None else []


def nonfinite_weights(variables) -> List[str]:
    """The names of the variables that hold a NaN or inf: one check (one sync) for all of
    them, the names only when it fails."""
    variables = finite.floating_variables(variables)
    checks = [tf.reduce_all(tf.math.is_finite(v)) for v in variables]
    if not checks or bool(tf.reduce_all(tf.stack(checks))):
        return []
    return [v.name for v, ok in zip(variables, checks) if not bool(ok)]


def weights_max(model) -> float:
    vals = [float(tf.reduce_max(tf.abs(tf.cast(v, tf.float32)))) for v in model.trainable_variables
            if int(tf.size(v)) > 0]
    return max(vals) if vals else 0.0


def epsilon_of(layer, dtype: str) -> Optional[tuple]:
    """(attribute, value) of a constant on the layer named like an epsilon that is 0 in
    ``dtype``: the usual cause of a norm or a division that is finite in float32 only."""
    for attr, value in sorted(vars(layer).items()):
        if "eps" in attr.lower() and isinstance(value, float) and limits.underflows(value, dtype):
            return attr.lstrip("_"), value
    return None


def first_bad(p: PassResult) -> Optional[tuple]:
    """(call, phase) where the pass first went non-finite: the first layer (in execution
    order) whose output is not, else, backward, the last one whose gradient went bad inside
    it (finite through its output, not through its inputs)."""
    for c in p.calls:
        if not c.out_finite:
            return c, "forward"
    if not p.loss_finite:
        return None
    for c in reversed(p.calls):
        if c.grad_out_finite and not c.grad_in_finite:
            return c, "backward"
    return None


@dataclass
class FailedStep:
    """What the training run knows of the failing step."""
    fault: rules.Fault
    epoch: int                     # 1-based
    position: int                  # the batch's first sample's position in the epoch
    policy: str
    loss_name: Optional[str]       # the loss the run uses (app.task.losses.name_of), or None
    start_weights_max: Optional[float] = None   # the weights' largest when the run began
    replica: Optional[int] = None
    worker: Optional[int] = None
    rows: Optional[object] = None  # the training data's rows (app.task.data_rows.DataRows)
    # The weights' largest as the model was built, before a resumed run's checkpoint put
    # its own in; None: the run began from those (start_weights_max).
    built_weights_max: Optional[float] = None
    # The layers the run computes in float32 (--float32-layers, as the run names them): a
    # fix naming another layer names them too, since the flag's value replaces them.
    float32_layers: Sequence[str] = ()
    # The run is tfmp train's (the fix names flags), else app.train's (its keywords).
    command_line: bool = True

    @property
    def reference_weights_max(self) -> Optional[float]:
        """The size the weights' growth is measured from: as the model was built.  A resumed
        run's own start is no measure: it may begin from weights that grew already (a
        checkpoint saved at an optimizer's fault), which it would call normal."""
        return self.built_weights_max or self.start_weights_max

    @property
    def began_grown(self) -> bool:
        """This run began from weights that had grown already (a resumed checkpoint's)."""
        return bool(self.built_weights_max and self.start_weights_max and
                    self.start_weights_max >= GROWTH_FOR_OPTIMIZER * self.built_weights_max)


def diagnose(model, loss_fn, entries, batch, failed: FailedStep) -> dx.Diagnosis:
    """Replay ``batch`` ((x, y) or (x, y, sample_weight)) from the model's weights now."""
    t0 = time.perf_counter()
    x, y, sample_weight = batch[0], batch[1], (batch[2] if len(batch) > 2 else None)
    fault = failed.fault

    def done(where, verdict, fix, **facts):
        return dx.Diagnosis(fault.headline, fault.kind, fault.step, failed.epoch, failed.policy,
                            where, verdict, fix, replica=failed.replica, worker=failed.worker,
                            seconds=round(time.perf_counter() - t0, 2), **facts)

    bad_samples = nonfinite_samples(x) or nonfinite_samples(y)
    if bad_samples:
        where = dx.Where("input samples", samples=[failed.position + i for i in bad_samples])
        named = _name_rows(where, failed.rows, x, y, bad_samples, nonfinite=True)
        what = named or ("that sample" if len(bad_samples) == 1 else "those samples") + (
            " (NaN or inf in the data)")
        return done(where, "data", f"repair or drop {what}; check how the data is read and "
                    "normalised", float32_finite=False)
    bad_weights = nonfinite_weights(model.weights)
    if bad_weights:
        return done(dx.Where("weights", name=", ".join(bad_weights[:4])), "optimizer",
                    "an update sent the weights out of range: lower --learning-rate (by 10x or "
                    "more), or clip the gradients (clipnorm= on your optimizer)",
                    float32_finite=False)
    with state_kept(model):
        run = run_pass(model, loss_fn, entries, x, y, fault.loss_scale, sample_weight)
        with all_float32(entries, model):
            f32 = run_pass(model, loss_fn, entries, x, y, 1.0, sample_weight)

        def look_inside(index: int, dtype: str):   # a forward pass more, state kept too
            seen = inside.look(model, entries, x, index, dtype)
            if seen is not None and seen.cause == "overflow":   # and its value in float32
                with all_float32(entries, model):
                    seen.float32_largest = inside.largest_of(model, entries, x, index,
                                                             seen.op, seen.occurrence)
            return seen
        return _verdict(run, f32, failed, done, model, x, y, look_inside)


@contextlib.contextmanager
def state_kept(model):
    """The model's non-trainable state (BatchNormalization's moving statistics, any layer's
    counters) as it was before the replay: the passes run with ``training=True`` and would
    move it, with a non-finite batch into NaN, and the state that failed is the user's to
    examine (``app.train``) after the report."""
    kept = [(v, tf.identity(v)) for v in finite.variables_of(model.non_trainable_variables)]
    try:
        yield
    finally:
        for v, value in kept:
            v.assign(value)


def _verdict(run: PassResult, f32: PassResult, failed: FailedStep, done, model, x, y,
             look_inside=None):
    found = first_bad(run)
    precision = f32.finite and failed.policy != "float32"
    if found is not None:
        call, phase = found
        where = dx.Where("layer", call.path, call.class_name, call.dtype, phase)
        twin = next((c for c in f32.calls if c.path == call.path), None)
        f32_max = twin.out_max if (twin is not None and twin.out_finite and phase == "forward") else None
        facts = dict(float32_finite=f32.finite, largest_before=call.in_max,
                     float32_largest=f32_max)
        if precision and phase == "forward" and _cast_overflow(call):
            # What went in was finite and past the dtype's largest before Keras cast it to
            # the layer's 16 bits: inf in its call from the start.
            dtype = call.dtype or failed.policy
            fix = dx.cast_fix(call.path, dtype, call.cast_from, call.in_cast_max,
                              kept=failed.float32_layers, command_line=failed.command_line)
            return done(where, "precision", fix,
                        layers=dx.float32_set(failed.float32_layers, call.path),
                        cause="overflow", cast_input_largest=call.in_cast_max,
                        cast_input_from=call.cast_from, **facts)
        if precision:
            dtype = call.dtype or failed.policy
            cause, op, constant, op_largest = _cause(run, call, phase, f32_max, dtype,
                                                     look_inside)
            epsilon = None if cause == "overflow" else (
                epsilon_of(call.layer, dtype) or (None if constant is None else (None, constant)))
            fix = dx.layer_fix(call.path, dtype, phase, epsilon, cause=cause,
                               kept=failed.float32_layers, command_line=failed.command_line)
            return done(where, "precision", fix,
                        layers=dx.float32_set(failed.float32_layers, call.path), cause=cause,
                        inside_op=op, inside_float32_largest=op_largest, **facts)
        return _not_precision(where, failed, done, model, facts)
    if not run.loss_finite:
        whole = run.sample_finite is None
        in_batch = [] if whole else [int(i) for i in np.flatnonzero(~run.sample_finite)]
        where = dx.Where("loss", failed.loss_name, samples=[failed.position + i for i in in_batch],
                         whole=whole)
        _name_rows(where, failed.rows, x, y, in_batch[:MOST_ROWS_SEARCHED], nonfinite=False)
        if precision:
            return done(where, "precision", "compute the loss in float32: cast the predictions "
                        "with tf.cast(y_pred, tf.float32) first, or make the last layer float32",
                        float32_finite=True)
        return _not_precision(where, failed, done, model, dict(float32_finite=False))
    if run.bad_variables:
        owner = _owner(run.bad_objects[0], run.calls)
        where = (dx.Where("layer", owner.path, owner.class_name, owner.dtype, "backward")
                 if owner is not None else dx.Where("weights", run.bad_variables[0], phase="backward"))
        if precision and owner is not None:
            return done(where, "precision", dx.layer_fix(owner.path, owner.dtype or "float16",
                                                         "backward", kept=failed.float32_layers,
                                                         command_line=failed.command_line),
                        layers=dx.float32_set(failed.float32_layers, owner.path),
                        float32_finite=True)
        if precision:
            return done(where, "precision", f"the gradient of {run.bad_variables[0]} overflows "
                        "in 16 bits: clip it, or run its layer in float32", float32_finite=True)
        return _not_precision(where, failed, done, model, dict(float32_finite=False))
    return done(dx.Where("none"), "not reproduced",
                "the batch that failed is finite when replayed (dropout draws anew, or the "
                "weights moved since): run `tfmp check --steps N` with the same data, or "
                "lower --learning-rate", float32_finite=f32.finite)


def _cast_overflow(call: CallResult) -> bool:
    """The inputs the call took are not finite because Keras' cast to its 16-bit dtype
    overflowed: what was cast is finite and past that dtype's largest."""
    return (not call.in_finite and call.dtype is not None
            and call.in_cast_max > limits.largest(call.dtype))


def _cause(run: PassResult, call: CallResult, phase: str, f32_max: Optional[float], dtype: str,
           look_inside) -> tuple:
    """(overflow | underflow | None, the op where it began, a constant of the call that is 0
    in ``dtype``, what that op's value reaches in float32 when it overflowed) for the layer
    where a forward value first went non-finite.  Its magnitudes
    say overflow when float32's value passes the dtype's largest or what goes in is within
    4x of it; else they say nothing (a 16-bit softmax over logits its own matmul overflowed
    stays under 1 in float32, as a 0/0 does): the ops of its call are looked at
    (``app.numerics.inside``)."""
    if phase != "forward":
        return None, None, None, None
    limit = limits.largest(dtype)
    if (f32_max is not None and f32_max >= limit) or call.in_max >= limit / 4:
        return "overflow", None, None, None
    index = next((i for i, c in enumerate(run.calls) if c is call), None)
    seen = look_inside(index, dtype) if (look_inside and index is not None) else None
    if seen is None:
        return None, None, None, None
    return seen.cause, seen.op, seen.constant, seen.float32_largest


def _name_rows(where: dx.Where, rows, x, y, in_batch: List[int], nonfinite: bool) -> str:
    """Fill ``where`` with the training data's rows the batch's samples ``in_batch`` are
    (``rows``: ``app.task.data_rows``' DataRows or DatasetElements, or None: nothing to
    name) and, when ``nonfinite``, every row (element) of the data that holds a NaN or an
    inf; returns the fix's words for those, '' when there are none to name."""
    if rows is None:
        return ""
    try:
        where.rows = rows.rows_of(tf.nest.map_structure(np.asarray, x), np.asarray(y),
                                  in_batch)
    except (ValueError, IndexError, TypeError):   # a batch not shaped like the data's rows
        where.rows = []
    if not nonfinite:
        where.data = rows.data_name if where.rows else None
        return ""
    every = rows.nonfinite()
    if not every:
        where.rows = []
        return ""
    where.data = rows.holding()
    where.bad_rows, where.bad_rows_total = every[:MOST_LISTED], rows.nonfinite_total()
    listed = ""
    if where.bad_rows_total > SHOWN:   # the JSON (metrics.json, check's) keeps more
        listed = "; the JSON report's where.bad_rows lists " + (
            "them" if where.bad_rows_total <= len(where.bad_rows)
            else f"the first {len(where.bad_rows)}")
    return f"{rows.list_text()}: {rows.count_text()}{listed}"


def _owner(variable, calls: List[CallResult]) -> Optional[CallResult]:
    """The innermost recorded layer owning ``variable``."""
    for c in calls:   # inner layers first (the order calls return in)
        if any(v is variable for v in getattr(c.layer, "trainable_weights", [])):
            return c
    return None


def _not_precision(where, failed: FailedStep, done, model, facts):
    reference = failed.reference_weights_max
    grown = reference and weights_max(model) >= GROWTH_FOR_OPTIMIZER * reference
    if grown:
        return done(where, "optimizer", _optimizer_fix(model, failed), **facts)
    if where.kind == "loss":
        return done(where, "model", "the loss is non-finite in float32 too: guard it (e.g. "
                    "tf.math.log(tf.maximum(p, 1e-7)), tf.math.divide_no_nan), or check the "
                    + ("batch's labels" if where.whole else "labels of those samples"), **facts)
    return done(where, "model", f"layer '{where.name}' computes a non-finite value in float32 "
                "too: look in it for log(0), a division by 0, sqrt of a negative or exp of a "
                "large value; or lower --learning-rate", **facts)


def _optimizer_fix(model, failed: FailedStep) -> str:
    if failed.began_grown:
        # Resumed from a checkpoint of weights that had grown: this run's own learning rate
        # is not the cause, and none undoes what those weights hold.
        return (f"the weights were {failed.start_weights_max:.3g} when this run began, from "
                f"the checkpoint it resumed ({failed.built_weights_max:.3g} as the model was "
                "built), and no learning rate brings them back: train from new weights, with a "
                "--learning-rate 10x or more lower than the run that grew them, or clip the "
                "gradients (clipnorm= on your optimizer)")
    return (f"the weights grew to {weights_max(model):.3g}: lower --learning-rate (by 10x or "
            "more), or clip the gradients (clipnorm= on your optimizer)")
