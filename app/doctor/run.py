"""One check: build the model under the policy, read its layers, run the probe and the
comparison, and return the report dict (``app.doctor.report`` renders it)."""
from __future__ import annotations

import time
from typing import Optional

from app.doctor import compare as compare_mod
from app.doctor import layers as layers_mod
from app.task import float32_layers, model_layers
from app.task.data import several_inputs, shape_json
from app.doctor import probe as probe_mod
from app.doctor.report import BLOCKER, INFO, WARNING, Finding, counts, sort_findings, verdict
from app.core.errors import PrecisionUnsupported, UsageError, UserCodeError
from app.core.settings import seed_problem
from app.core.signals import interrupts_outside_tensorflow

SCHEMA_VERSION = 1
DEFAULT_PRECISION = "mixed_float16"
DEFAULT_BATCH = 32
DEFAULT_STEPS = 5


def check_args(batch_size: int, steps: int, seed: int = 0) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch_size must be a positive integer. Received: batch_size={batch_size!r}",
                         "1 or more, e.g. 32")
    if not isinstance(steps, int) or steps < 1:
        raise UsageError(f"steps must be a positive integer. Received: steps={steps!r}",
                         "1 or more (default 5)")
    problem = seed_problem("seed", seed)
    if problem:
        raise UsageError(*problem)


def synthetic_shape(task) -> tuple:
    """The sample shape for synthetic data: --input-shape, else a built-in's own."""
    shape = task.input_shape or task.model.preferred_input_shape(task.image_size)
    if shape is None:
        raise UsageError(f"model {task.model.spec!r}: no input shape for synthetic data",
                         "--input-shape D,D,... (input_shape= in app.check), e.g. 28,28,1 or "
                         "784; or --dataset SPEC to check on your data")
    return tuple(shape)


def load_bundle(task, batch_size: int, steps: int, seed: int, data_dir: Optional[str]):
    """Only as many samples as the steps need; built-in datasets are read, never downloaded."""
    import os

    from app.training.config import TrainConfig, default_data_dir, env_value

    if task.dataset.builtin and task.dataset.spec == "synthetic" and not task.model.builtin:
        synthetic_shape(task)
    if data_dir is None:  # where train keeps the built-in datasets
        data_dir = env_value("data_dir") or default_data_dir(
            env_value("workspace") or TrainConfig.workspace)
    if task.dataset.builtin and task.dataset.spec not in ("synthetic", "images") \
            and not os.path.isdir(data_dir):
        raise UsageError(f"dataset {task.dataset.spec!r}: check reads it from {data_dir!r} and "
                         "never downloads, and that folder does not exist",
                         f"run `tfmp train --dataset {task.dataset.spec}` once (it "
                         "downloads), set TFMP_DATA_DIR or TFMP_WORKSPACE, or omit --dataset "
                         "for synthetic data")
    return task.load_data(batch_size, data_dir, max_train_samples=batch_size * (steps + 1),
                          max_val_samples=batch_size, seed=seed, offline=True,
                          data_dir_explicit=False)


def _batches(bundle, steps: int):
    """steps + 1 full batches: the first for the probe and the before/after loss, the rest
    for the training steps (repeated when the data has fewer)."""
    out, size = [], None
    for batch in bundle.train:   # (x, y[, sample_weight]); x a tensor or a dict of them
        rows = int(batch[1].shape[0])
        if size is None:
            size = rows
        if rows != size:
            continue  # a smaller last batch would recompile the step
        out.append(tuple(batch))
        if len(out) == steps + 1:
            break
    if not out:
        raise UsageError("the dataset gave no training batch", "a non-empty dataset")
    n = len(out)
    while len(out) < steps + 1:
        out.append(out[len(out) % n])
    return out


def run_check(task, precision: str = DEFAULT_PRECISION, batch_size: int = DEFAULT_BATCH,
              steps: int = DEFAULT_STEPS, seed: int = 0, data_dir: Optional[str] = None,
              hardware=None) -> dict:
    """The report dict.  Raises UsageError (bad input) or UserCodeError (their code raised
    something that is not a mixed-precision clash); restores the global dtype policy."""
    from app.precision import policy as prec

    check_args(batch_size, steps, seed)
    prec.validate_name(precision)
    t0 = time.perf_counter()
    from app.machine import hardware as hw_mod

    hw = hardware or hw_mod.detect()
    decision = prec.resolve(precision, hw)
    before = prec.global_policy_name()
    try:
        # A notebook's Interrupt too: never raised inside the model's own py_function.
        with interrupts_outside_tensorflow():
            bundle = load_bundle(task, batch_size, steps, seed, data_dir)
            if decision.requested == "auto":   # what train would pick for this model
                from app.training.runnable import auto_runnable

                decision = auto_runnable(decision, task, bundle, hw)
            report = _check(task, bundle, decision, hw, batch_size, steps, seed)
    finally:
        prec.apply_policy(before)
    report["seconds"] = round(time.perf_counter() - t0, 2)
    return report


def _build(task, bundle, policy, seed, sample):
    import tensorflow as tf

    from app.precision import policy as prec

    prec.apply_policy(policy)
    tf.keras.utils.set_random_seed(seed)
    return task.build(bundle, sample)


def _new_report(task, bundle, decision, hw, batch_size, steps) -> dict:
    import tensorflow as tf

    return {
        "schema_version": SCHEMA_VERSION,
        "model": task.model.spec, "dataset": task.dataset.spec,
        "precision": decision.to_dict(), "policy": decision.policy,
        "batch_size": batch_size, "steps": steps,
        "float32_layers": list(task.float32_layers),   # as given; the full paths once built
        "data": {"input_shape": shape_json(bundle.input_shape), "num_classes": bundle.num_classes,
                 "label_kind": bundle.label_kind},
        "environment": {"tensorflow": tf.__version__,
                        "keras": str(getattr(tf.keras, "__version__", "?")),
                        "gpus": [g.name for g in hw.gpus]},
        "layers": [], "probe": {"ran": False}, "comparison": {"ran": False},
    }


def _policy_findings(policy: str, hw) -> list:
    findings = []
    if not policy.startswith("mixed_"):
        findings.append(Finding(INFO, "policy", None,
                                f"the policy is {policy}: nothing runs in 16 bits, so there is "
                                "little for mixed precision to break",
                                "check with --precision mixed_float16 (GPU) or mixed_bfloat16 "
                                "to see what mixed precision would do"))
    if policy == "mixed_float16" and not hw.gpus:
        findings.append(Finding(INFO, "hardware", None,
                                "no GPU here: float16 math on a CPU is slow (the check compiles "
                                "its float16 steps with XLA when it can); train float16 on a "
                                "GPU with Tensor Cores", None))
    return findings


def _data_findings(report: dict, bundle) -> list:
    """Every training row that holds NaN or inf (arrays: read once, in slices; a user's
    tf.data dataset: found in the pass that counted it at load): a batch holding one stops
    training at its step, wherever it falls in the epoch, so they are named before a run
    rather than one fault at a time."""
    rows = bundle.train_rows
    if rows is None:
        return []
    from app.task.data_rows import MOST_LISTED, SHOWN

    bad = rows.nonfinite()
    report["data"].update(nonfinite_rows=bad[:MOST_LISTED],
                          nonfinite_rows_total=rows.nonfinite_total())
    if not bad:
        return []
    return [Finding(BLOCKER, "data", None, f"{rows.count_text()}: {rows.list_text()}",
                    "repair or drop them: training stops at the first batch that holds one "
                    "(the numerics sentinel, exit 3)"
                    + ("; the report's data.nonfinite_rows lists them"
                       if rows.nonfinite_total() > SHOWN else ""))]


def _check(task, bundle, decision, hw, batch_size, steps, seed) -> dict:
    import tensorflow as tf

    from app.precision import dtype_clash

    policy = decision.policy
    mixed = policy.startswith("mixed_")
    report = _new_report(task, bundle, decision, hw, batch_size, steps)
    findings = _policy_findings(policy, hw) + _data_findings(report, bundle)
    batches = _batches(bundle, steps)
    x0, y0 = batches[0][:2]   # the probe looks at the model's numbers: unweighted
    try:
        built = _build(task, bundle, policy, seed, bundle.sample_batch)
    except PrecisionUnsupported as exc:   # a layer type this TensorFlow cannot run here
        findings.append(_kernels_finding(exc))
        return _finish(report, findings)
    except UserCodeError as exc:
        if mixed and dtype_clash.is_dtype_clash(exc.original):
            findings.append(_clash_finding(exc.original, policy, task))
            return _finish(report, findings)
        raise
    model = built.model
    report["notes"] = list(bundle.notes) + list(built.notes)   # as train prints them
    report["float32_layers"] = list(built.float32_layers)
    entries = model_layers.walk(model)
    weights0 = model.get_weights()

    # --- forward pass, capturing every layer's output -----------------------------------------
    prediction, clash = None, None
    with probe_mod.capture(entries) as captured:
        try:
            prediction = model(x0, training=True)
        except Exception as exc:
            refusal = model_layers.refusal_from_build_error(exc, task.model.spec, model)
            if refusal is not None:   # an op (of a training-only layer) with no 16-bit kernel
                findings.append(_kernels_finding(refusal))
                return _finish(report, findings)
            if mixed and dtype_clash.is_dtype_clash(exc):
                clash = _clash_finding(exc, policy, task)
            else:
                raise UserCodeError(task.model.spec, f"running the model on one batch under "
                                    f"{policy}", exc) from exc
    rows = layers_mod.table(entries, captured)
    report["layers"] = rows
    outputs = probe_mod.model_outputs(model, prediction, captured, entries)
    input_channels = (int(bundle.input_shape[-1]) if not several_inputs(bundle.input_shape)
                      and len(bundle.input_shape) >= 3 else None)
    findings += layers_mod.dtype_findings(model, entries, rows, policy, outputs,
                                          chosen=built.float32_layers)
    if mixed:
        findings += layers_mod.tensor_core_findings(entries, rows, batch_size,
                                                    bundle.num_classes, input_channels)
    if clash is not None:
        findings.append(clash)
        return _finish(report, findings)

    # --- the loss and one backward step ---------------------------------------------------------
    loss = probe_mod.finite_float(tf.reduce_mean(built.loss(y0, prediction)))
    # float16 on a CPU is ~60x slower without XLA.  Not on TF 2.9 (Keras 2): its XLA CPU
    # backend aborts the whole process on CPUs with AVX512-FP16 (LLVM "Cannot select: f16 =
    # fexp"), which no fallback can catch.
    from app.precision.keras_version import IS_KERAS3

    jit = policy == "mixed_float16" and not hw.gpus and IS_KERAS3
    step = probe_mod.gradient_fn(model, built.loss, jit)
    probe = {"ran": True, "loss": loss, "xla": jit}
    if loss is None:
        from app.numerics.rules import Fault

        fault = Fault("forward", 1, f"the loss is NaN or infinite under {policy} on the first "
                      "batch", 1.0)
        findings.append(_numerics_finding(report, task, model, entries, built.loss, (x0, y0),
                                          fault, policy, batch_size, rows=bundle.train_rows))
        report["probe"] = probe
        return _finish(report, findings)  # the gradients of a NaN loss say nothing more
    try:
        grads = probe_mod.probe_gradients(step, x0, y0, policy)
    except Exception as exc:
        if mixed and dtype_clash.is_dtype_clash(exc):
            findings.append(_clash_finding(exc, policy, task))
            report["probe"] = probe
            return _finish(report, findings)
        raise UserCodeError(task.model.spec, f"computing gradients under {policy}", exc) from exc
    probe.update({k: v for k, v in grads.items() if k != "grads"})
    probe["xla"] = jit and not getattr(step, "fallback", lambda: False)()
    report["probe"] = probe
    findings += _gradient_findings(grads, policy, model, entries)
    if not grads["gradients_finite"] or loss is None:
        return _finish(report, findings)

    # --- float32 against the policy, from the same weights --------------------------------------
    model.set_weights(weights0)
    report["comparison"] = _compare(task, bundle, built, model, step, batches, policy, seed,
                                    weights0, findings, mixed)
    if report["comparison"].get("numerics"):
        report["numerics"] = report["comparison"]["numerics"]
    return _finish(report, findings)


def _gradient_findings(grads: dict, policy: str, model, entries) -> list:
    """What one backward step's gradients say: non-finite ones (naming the layer owning the
    first such variable) block; under mixed_float16, how much underflows without scaling."""
    findings = []
    if not grads["gradients_finite"]:
        owner = probe_mod.nonfinite_variable_owner(grads["grads"], model.trainable_variables,
                                                   entries)
        findings.append(Finding(
            BLOCKER, "nonfinite", owner,
            f"the gradients are NaN or infinite under {policy}"
            + (" even with the loss scale lowered to "
               f"{grads['loss_scale']:g}" if grads.get("loss_scale") else ""),
            "find the layer that overflows (values above 65504 in float16) and keep it in "
            "float32 with dtype='float32'"
            + (f" (for {owner!r}, without editing the model: {float32_layers.flag([owner])})"
               if owner in {p for p, _l, _par in entries} else "")
            + ", or use mixed_bfloat16"))
    if policy == "mixed_float16" and grads.get("zero_share_scaled") is not None:
        lost = max(0.0, grads["zero_share_unscaled"] - grads["zero_share_scaled"])
        findings.append(Finding(
            INFO, "underflow", None,
            f"{100 * lost:.2f}% of gradient elements underflow to zero in float16 without loss "
            f"scaling ({100 * grads['zero_share_unscaled']:.2f}% are zero without it, "
            f"{100 * grads['zero_share_scaled']:.2f}% with a loss scale of "
            f"{grads['loss_scale']:g})",
            "keep loss scaling on: train does it; in your own loop wrap the optimizer in a "
            "LossScaleOptimizer and scale the loss (app.precision.loss_scale)"))
    return findings


def _compare(task, bundle, built, model, step, batches, policy, seed, weights0, findings,
             mixed) -> dict:
    """The ``steps`` training steps under the policy, watched as the sentinel watches
    training (a fault stops them and is replayed), then for a mixed policy the same steps
    under float32 from the same weights, and the losses compared."""
    import tensorflow as tf

    from app.numerics import replay

    x_eval, y_eval = batches[0][:2]
    train = batches[1:]
    opt = built.optimizer or tf.keras.optimizers.Adam(learning_rate=1e-3)
    # As train records it: weights that grow 1e4x by the fault point at the learning rate.
    start_weights_max = replay.weights_max(model)
    try:
        ran = compare_mod.train_steps(model, built.loss, opt, step, train, policy, x_eval, y_eval)
    except Exception as exc:
        raise UserCodeError(task.model.spec, f"training {len(train)} step(s) under {policy}",
                            exc) from exc
    if ran["fault"] is not None:   # the sentinel's rules stopped the policy's steps
        return _stopped(task, built, model, ran, policy, len(train), int(y_eval.shape[0]),
                        findings, start_weights_max, bundle.train_rows)
    watched = {"ran": True, "steps": len(train), "compared": False,
               "policy_start": ran["start"], "policy_end": ran["end"],
               "policy_train_losses": ran["train_losses"], "skipped_steps": ran["skipped_steps"]}
    if not mixed:
        # Nothing to compare float32 with, but its steps were watched: a NaN in the data or
        # a learning rate that sends the weights to inf is found here too, before a long run.
        return watched
    # Everything is float32 there: no --float32-layers to find (Keras numbers a second
    # build's automatic layer names on from the first's, so they would not match).
    built32 = _build(task.with_float32_layers(()), bundle, "float32", seed, bundle.sample_batch)
    if built32.model is model:
        return {"ran": False, "why": "the model function returns the same model object each "
                "time, so there is no separate float32 model to compare with"}
    try:
        built32.model.set_weights(weights0)
        same = True
    except ValueError:
        same = False  # different structure per policy: both start from the same seed
    opt32 = built32.optimizer or tf.keras.optimizers.Adam(learning_rate=1e-3)
    step32 = probe_mod.gradient_fn(built32.model, built32.loss, jit=False)
    ref = compare_mod.train_steps(built32.model, built32.loss, opt32, step32, train, "float32",
                                  x_eval, y_eval)
    out = {**watched, "compared": True, "same_weights": same,
           "float32_start": ref["start"], "float32_end": ref["end"],
           "float32_train_losses": ref["train_losses"],
           "relative_difference_start": compare_mod.relative(ref["start"], ran["start"]),
           "relative_difference_end": compare_mod.relative(ref["end"], ran["end"])}
    if ran["end"] is None and ref["end"] is not None:
        findings.append(Finding(
            BLOCKER, "nonfinite", None,
            f"after {len(train)} step(s) the loss is NaN or infinite under {policy} but finite "
            "under float32", "keep the layers that overflow in float32 (dtype='float32'), and "
            "keep loss scaling on"))
        return out
    for key, tol, when in (("relative_difference_start", compare_mod.START_TOLERANCE, "before"),
                           ("relative_difference_end", compare_mod.END_TOLERANCE, "after")):
        diff = out[key]
        if diff is not None and diff > tol.get(policy, 0.1):
            findings.append(Finding(
                WARNING, "loss_difference", None,
                f"the loss under {policy} differs from float32 by {100 * diff:.1f}% {when} "
                f"{len(train)} training step(s) from the same weights (more than "
                f"{100 * tol.get(policy, 0.1):.0f}%)",
                "keep the softmax, the loss and normalization layers in float32 "
                "(dtype='float32'); look for layers with very large or very small values"))
            break
    if ran["skipped_steps"]:
        findings.append(Finding(
            INFO, "loss_scale", None,
            f"{ran['skipped_steps']} of {len(train)} step(s) were skipped while the dynamic "
            "loss scale settled (normal at the start of training)", None))
    return out


def _stopped(task, built, model, ran, policy: str, steps: int, batch_size: int, findings,
             start_weights_max: float, rows=None) -> dict:
    """The watched steps stopped at a fault: its replay as a blocker, and where it stopped."""
    watched: dict = {}
    findings.append(_numerics_finding(watched, task, model, model_layers.walk(model), built.loss,
                                      ran["fault"]["batch"], ran["fault"]["fault"], policy,
                                      batch_size, start_weights_max, rows))
    return {"ran": True, "steps": steps, "stopped_at_step": ran["fault"]["fault"].step,
            "numerics": watched.get("numerics"), "policy_train_losses": ran["train_losses"],
            "skipped_steps": ran["skipped_steps"]}


def _numerics_finding(report: dict, task, model, entries, loss_fn, batch, fault, policy: str,
                      batch_size: int, start_weights_max: Optional[float] = None,
                      rows=None) -> Finding:
    """The sentinel's replay of the failing batch (``app.numerics.replay``) as a blocker:
    where the non-finite value began, whether float32 fails too, and the fix."""
    from app.numerics import replay
    from app.task.losses import name_of

    failed = replay.FailedStep(fault, 1, (fault.step - 1) * batch_size, policy,
                               name_of(loss_fn), start_weights_max, rows=rows,
                               float32_layers=tuple(task.float32_layers))
    diag = replay.diagnose(model, loss_fn, entries, batch, failed)
    report["numerics"] = diag.to_json()
    after = (f"after {fault.step} training step(s) under {policy}: " if fault.step > 1 else "")
    return Finding(BLOCKER, "nonfinite", diag.where.name if diag.where.kind == "layer" else None,
                   f"{after}{fault.headline}; where it began: {diag.where.text()}"
                   + ("" if diag.float32_finite is None else
                      "; finite in float32 (a precision problem)" if diag.float32_finite else
                      "; not finite in float32 either (not a precision problem)"),
                   diag.fix)


def _kernels_finding(refusal: PrecisionUnsupported) -> Finding:
    """The policy cannot run one of the model's layers here (``app.machine.kernels``): the
    model is fine, the policy cannot train it on this machine."""
    return Finding(BLOCKER, "kernels", None, refusal.what,
                   f"use {refusal.allowed}" if refusal.allowed else None)


def _clash_finding(exc, policy, task) -> Finding:
    from app.precision import dtype_clash

    layer = dtype_clash.failing_layer(exc)
    line = dtype_clash.describe(exc, policy, "" if task.model.builtin else task.model.spec,
                                float32_flag=lambda name: float32_layers.flag([name]))
    what, _, fix = line.partition("; fix: ")
    return Finding(BLOCKER, "dtype_clash", getattr(layer, "name", None), what,
                   fix or dtype_clash.FIX)


def _finish(report: dict, findings) -> dict:
    findings = sort_findings(findings)
    report["findings"] = [f.to_dict() for f in findings]
    report["counts"] = counts(findings)
    report["verdict"] = verdict(findings)
    return report
