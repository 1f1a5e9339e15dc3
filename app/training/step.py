"""The one training step, and the train and eval steps built from it.

``forward_backward`` and ``train_step`` are the step every path runs: the custom loop
(``CustomSteps``), the tuner's trials (their memory and speed are this step's) and
``tfmp check``'s probe (with scales of its own).  ``--loop fit`` runs Keras' own step,
compiled here with the same loss and metrics.  Both loops record the step statistics
(``app.training.step_stats``) inside the train step, so neither runs Python per step to log."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import tensorflow as tf

from app.precision import loss_scale
from app.task.losses import weighted
from app.training import accumulate, step_stats


class ForwardBackward(NamedTuple):
    predictions: Any
    per_example: Any      # the task's per-example loss, float32
    loss: Any             # averaged over the global batch, plus regularization
    grads: list           # of the scaled loss, for model.trainable_variables
    regularization: Any = None   # the model's own losses (model.losses) summed; None: none


def _regularization(model):
    """The model's own losses (weight and activity regularization) summed, as float32, or
    None when it has none."""
    if not model.losses:
        return None
    return tf.add_n([tf.cast(v, tf.float32) for v in model.losses])


def forward_backward(model, loss_fn, x, y, scale: Optional[Callable[[Any], Any]] = None,
                     sample_weight=None) -> ForwardBackward:
    """Forward, the loss, and the gradients of ``scale(loss)`` (the loss itself when
    ``scale`` is None).  Per-example losses (times their ``sample_weight``) are summed and
    divided by the *global* batch (``compute_average_loss``), and regularization is split
    over the replicas, as Keras' fit does: the replicas' gradients are summed by the
    all-reduce."""
    with tf.GradientTape() as tape:
        preds = model(x, training=True)
        per_example = weighted(loss_fn(y, preds), sample_weight)   # float32 (cast inside)
        loss = tf.nn.compute_average_loss(per_example)
        regularization = _regularization(model)
        if regularization is not None:
            loss += tf.nn.scale_regularization_loss(regularization)
        scaled = loss if scale is None else scale(loss)
    return ForwardBackward(preds, per_example, loss,
                           tape.gradient(scaled, model.trainable_variables), regularization)


def _batch(x, y, sample_weight):
    """The batch as the data gave it, for the sentinel's replay."""
    return (x, y) if sample_weight is None else (x, y, sample_weight)


def train_step(model, loss_fn, opt, x, y, sentinel=None, sample_weight=None):
    """One optimizer step: forward, loss (each sample's times its ``sample_weight``), loss
    scaling (the optimizer's), gradients, apply (skipped, and the scale lowered, when a
    scaled gradient is not finite).  With a ``sentinel``
    (``app.training.sentinel.SentinelState``) no faulty step reaches the weights and the
    first fault is latched with its batch.  Returns the ``ForwardBackward`` and
    ``loss_scale.Applied``."""
    out = forward_backward(model, loss_fn, x, y, lambda loss: loss_scale.scale_loss(opt, loss),
                           sample_weight)
    batch = _batch(x, y, sample_weight)
    variables = model.trainable_variables
    if sentinel is None:
        return out, loss_scale.unscale_and_apply(opt, out.grads, variables)
    if not loss_scale.is_loss_scaled(opt):
        sentinel.guard(opt, out.grads, out.loss, batch,
                       lambda g: opt.apply_gradients(zip(g, variables)))
        return out, loss_scale.Applied(list(out.grads), None, None)
    done = []

    def apply(g):   # behind the guard: the scaled gradients, unscaled and applied
        done.append(loss_scale.unscale_and_apply(opt, g, variables))
        return done[-1].skipped
    sentinel.guard(opt, out.grads, out.loss, batch, apply)
    return out, done[-1]


def accumulated_train_step(model, loss_fn, opt, x, y, acc, sentinel=None, record=None,
                           forward=None, sample_weight=None):
    """``train_step`` for one micro-batch of an accumulation (``app.training.accumulate``):
    the optimizer is called on the group's last micro-batch only.  ``forward(out)`` runs
    right after the forward pass (the running loss); ``record(mean_fn, skipped, update)``
    after the apply (the step statistics).  Returns the ``ForwardBackward``."""
    out = forward_backward(model, loss_fn, x, y, lambda loss: loss_scale.scale_loss(opt, loss),
                           sample_weight)
    if forward is not None:
        forward(out)
    apply, scale_in, scale_out = loss_scale.apply_path(opt, model.trainable_variables)
    accumulate.micro_batch(acc, opt, out.grads, accumulate.batch_samples(x), apply,
                           scale_in=scale_in, scale_out=scale_out, sentinel=sentinel,
                           loss=out.loss, batch=_batch(x, y, sample_weight), record=record)
    return out


class _LossMetric:
    """The running mean of the training loss that Keras' fit keeps (both Kerases name it 'loss')."""

    def __init__(self, model):
        self.model = model

    def result(self):
        for m in self.model.metrics:
            if m.name == "loss":
                return step_stats.metric_mean(m)
        return float("nan")


def fit_steps_per_execution(cfg, replicas: int = 1) -> int:
    """fit's steps per tf.function call: ``--steps-per-execution`` when it says more than 1,
    else on one replica under ``--accumulate N`` the N micro-batches of a group, so that
    Keras' per-call work is paid once per update, as for the plain batch.  Not with several
    replicas: Keras 3 (3.15) cannot run the update's cross-replica cond inside its multi-step
    loop ("You must feed a value for placeholder tensor")."""
    asked = int(cfg.steps_per_execution or 1)
    if asked > 1 or replicas > 1:
        return asked
    return max(1, int(cfg.accumulate or 1))


def compile_for_fit(parts, jit: bool, steps_per_execution: int) -> None:
    """Compile ``parts.model`` for Keras' fit with the task's loss and metrics and the step
    statistics recorded inside the train step (tests/benchmarks time exactly this)."""
    loss_metric = _LossMetric(parts.model)
    parts.stats.attach_to(parts.optimizer, loss=loss_metric.result, sentinel=parts.sentinel,
                          accumulator=parts.accumulator)
    if parts.sentinel is not None:
        parts.sentinel.fit.attach(parts.model)
    if parts.accumulator is not None:
        parts.accumulator.fit.attach(parts.model)
    extra = {"jit_compile": True} if jit else {}  # else Keras' own default
    with parts.strategy.scope():  # Keras 2: metric objects must come from the model's scope
        metrics = parts.built.make_metrics()
    # weighted_metrics=[]: the sample weights weigh the loss, not the metrics (documented),
    # said so here, where Keras 2 otherwise warns at every validation that they were meant
    # for weighted_metrics.
    parts.model.compile(optimizer=parts.optimizer, loss=parts.built.loss, metrics=metrics,
                        weighted_metrics=[], steps_per_execution=steps_per_execution, **extra)


def add_batch_loss(mean, per_example, regularization=None) -> None:
    """Add a (micro-)batch's loss to the running ``mean`` (a ``keras.metrics.Mean``) as
    Keras' fit does: the batch's mean (each sample's loss times its weight, summed, over the
    batch's size) plus the model's ``regularization`` (its own losses, whole, as fit adds
    them to the loss it reports), weighted by the batch's sample count, so that the result
    is the mean over every sample seen, not a mean of batch means (a short last batch
    counts for its samples).  On each replica its own share: the metric's sums add up over
    the replicas.  An empty share (a replica without samples in the epoch's last batch)
    adds nothing."""
    samples = tf.cast(tf.shape(per_example)[0], tf.float32)
    batch_mean = tf.math.divide_no_nan(tf.reduce_sum(per_example),
                                       tf.cast(tf.size(per_example), tf.float32))
    if regularization is not None:
        batch_mean += regularization
    mean.update_state(batch_mean, sample_weight=samples)


class CustomSteps:
    """``train_step(*batch)`` and ``eval_step(*batch)`` for the custom loop (``train_step``
    above on every replica), with their running loss and metrics.  A batch is (x, y) or
    (x, y, sample_weight): as in Keras' fit, the weights weigh the loss, not the metrics
    (compile's ``metrics``, not its ``weighted_metrics``)."""

    def __init__(self, parts, jit: bool):
        self.parts = parts
        with parts.strategy.scope():
            self.train_loss = tf.keras.metrics.Mean()
            self.val_loss = tf.keras.metrics.Mean()
            self.train_metrics = parts.built.make_metrics()
            self.val_metrics = parts.built.make_metrics()
        self.train_step = tf.function(self._distributed(self._train_fn),
                                      jit_compile=bool(jit) or None)
        self.eval_step = tf.function(self._distributed(self._eval_fn))

    def _distributed(self, fn):
        strategy = self.parts.strategy

        def run(*batch):
            return strategy.run(fn, args=batch)
        return run

    def _train_fn(self, x, y, sample_weight=None):
        opt, train_loss, parts = self.parts.optimizer, self.train_loss, self.parts

        def running_loss():   # the log row reads the running loss
            return step_stats.metric_mean(train_loss)

        def scale():
            return loss_scale.current_loss_scale(opt)
        if parts.accumulator is not None:
            def record(grads, skipped, update):
                parts.stats.record(grads, skipped, None, loss=running_loss, loss_scale=scale,
                                   update=update)
            out = accumulated_train_step(
                parts.model, parts.built.loss, opt, x, y, parts.accumulator, parts.sentinel,
                record, lambda o: add_batch_loss(train_loss, o.per_example, o.regularization),
                sample_weight)
        else:
            out, applied = train_step(parts.model, parts.built.loss, opt, x, y,
                                      parts.sentinel, sample_weight)
            add_batch_loss(train_loss, out.per_example, out.regularization)
            parts.stats.record(applied.grads, applied.skipped, applied.divide_by,
                               loss=running_loss, loss_scale=scale)
        for m in self.train_metrics:
            m.update_state(y, out.predictions)

    def _eval_fn(self, x, y, sample_weight=None):
        preds = self.parts.model(x, training=False)
        add_batch_loss(self.val_loss, weighted(self.parts.built.loss(y, preds), sample_weight),
                       _regularization(self.parts.model))
        for m in self.val_metrics:
            m.update_state(y, preds)

    def reset(self):
        for m in (self.train_loss, self.val_loss, *self.train_metrics, *self.val_metrics):
            m.reset_state() if hasattr(m, "reset_state") else m.reset_states()

    def progress(self) -> list:
        """(name, value) pairs for the progress bar: the running loss and metrics."""
        return [("loss", float(self.train_loss.result()))] + [
            (m.name, float(m.result())) for m in self.train_metrics]

    def logs(self) -> dict:
        """The epoch's figures, named as Keras' fit names them."""
        return {"loss": self.train_loss.result(),
                **{m.name: m.result() for m in self.train_metrics},
                "val_loss": self.val_loss.result(),
                **{"val_" + m.name: m.result() for m in self.val_metrics}}
