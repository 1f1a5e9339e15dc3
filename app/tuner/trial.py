"""One trial, in its own process: build the model under a policy and train a few real steps
at one batch size; write what happened as JSON.

    python -m app.tuner.trial \
        --request '{"model": "resnet", "dataset": "synthetic", "policy": "float32", ...}' \
        --result /tmp/.../trial.json

A process per trial because TensorFlow keeps the memory it allocated until the process
exits: a size measured after a larger one would otherwise see the larger one's peak, and a
trial that ran out of memory would leave the allocator in a state no real run starts from.

The steps are training's own step (``app.training.step.train_step``, what ``--loop custom``
runs: the same loss, regularization, loss scaling and apply), fed by the task's own input
pipeline, so the peak counts what a real run holds: runtime, data, weights, optimizer
slots, activations and gradients.  Warm-up steps (tracing, first allocations) are left out
of the speed, not of the peak.

Result ``status``: ``ok``; ``oom`` (TensorFlow's ResourceExhaustedError or a MemoryError:
the size does not fit); ``data`` (the training set is smaller than the batch);
``unsupported`` (this TensorFlow cannot run the model's layer types under the policy here,
``app.machine.kernels``: the tune leaves the policy out, exit 2); ``usage`` (bad input,
exit 2); ``error`` (anything else; the traceback is in the log, exit 1).  A
child killed outright (the kernel's OOM killer, the tuner's memory watchdog) writes nothing;
the parent reads its death instead.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from app.machine.memory import cpu_peak_bytes, peak_memory

def _is_oom(exc: BaseException) -> bool:
    import tensorflow as tf

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (MemoryError, tf.errors.ResourceExhaustedError)):
            return True
        if "out of memory" in str(exc).lower() or "bad_alloc" in str(exc):
            return True
        exc = getattr(exc, "original", None) or exc.__cause__ or exc.__context__
    return False


def _limit_gpu_memory(budget_bytes: int) -> None:
    """An explicit budget below the GPU's memory: a logical device of that size, so
    TensorFlow's allocator reports out of memory at the budget, as a smaller GPU would."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus and budget_bytes:
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=budget_bytes // 2**20)])


def _first_tensor(x):
    import tensorflow as tf

    return tf.nest.flatten(x)[0]


def run(req: dict) -> dict:
    """Build, warm up, time; the measurements as a dict (status ok/data)."""
    import tensorflow as tf

    from app.precision import loss_scale
    from app.precision import policy as precision
    from app.training import step
    from app.task.data import SYNTHETIC_TRAIN
    from app.task.task import Task, parse_input_shape

    started = time.perf_counter()
    batch = int(req["batch_size"])
    on_gpu = bool(tf.config.list_physical_devices("GPU"))
    if on_gpu and req.get("limit_gpu_bytes"):
        _limit_gpu_memory(int(req["limit_gpu_bytes"]))
    tf.keras.utils.set_random_seed(int(req.get("seed") or 0))
    precision.apply_policy(req["policy"])
    task = Task.from_specs(req["model"], req["dataset"], req.get("loss"), req.get("metrics"),
                           parse_input_shape(req.get("input_shape")), req.get("num_classes"),
                           int(req.get("image_size") or 32), req.get("float32_layers"))
    # A layer name the model lacks is refused as the user gave it (TFMP_FLOAT32_LAYERS).
    task.float32_said = (req.get("said") or {}).get("float32_layers", task.float32_said)
    max_train = req.get("max_train_samples")
    generated = req["dataset"] == "synthetic" and not max_train
    if generated:
        # Generated data has no size of its own: enough for two full batches at this size,
        # and no size reported to the search, whose cap (--max-batch) is then the only limit
        # (a real run's --max-train-samples decides how much it generates).
        max_train = max(SYNTHETIC_TRAIN, 2 * batch)
    bundle = task.load_data(batch, req.get("data_dir"), image_dir=req.get("image_dir"),
                            max_train_samples=max_train, max_val_samples=8,
                            seed=int(req.get("seed") or 0), offline=bool(req.get("offline")),
                            data_dir_explicit=bool(req.get("data_dir_explicit")))
    result = {"status": "ok", "batch_size": batch, "policy": req["policy"],
              "train_samples": None if generated else bundle.train_samples,
              "memory_kind": "gpu" if on_gpu else "cpu_rss"}
    if result["train_samples"] is not None and result["train_samples"] < batch:
        result.update(status="data", reason=f"the training set has only {bundle.train_samples} "
                                            "samples, fewer than one batch")
        return result
    built = task.build(bundle, bundle.sample_batch)
    model = built.model
    opt = built.optimizer or tf.keras.optimizers.Adam(
        learning_rate=float(req.get("learning_rate") or 1e-3))
    if not loss_scale.is_loss_scaled(opt):
        opt = loss_scale.wrap_optimizer(opt, req["policy"])
    loss_scale.build_optimizer(opt, model.trainable_variables)
    loss_fn = built.loss

    # The step training runs, the numerics sentinel's guard and batch stash included (unless
    # the run being tuned turns it off): the trial's memory and speed are the run's.
    sentinel = None
    if req.get("sentinel", True):
        from app.training.sentinel import SentinelState
        from app.training.step_stats import StepStats

        sentinel = SentinelState(StepStats(), bundle.train.element_spec, 1, batch)

    n = int(req.get("accumulate") or 1)
    acc = None
    if n > 1:   # --accumulate: the micro-batch step, its sums included, timed by the group
        from app.training.accumulate import Accumulator

        acc = Accumulator(model.trainable_variables, n, 2 ** 62, tf.distribute.get_strategy())

    @tf.function(jit_compile=bool(req.get("jit")) or None)
    def train_step(x, y, sample_weight=None):   # a batch as the data gives it
        if acc is not None:
            return step.accumulated_train_step(model, loss_fn, opt, x, y, acc, sentinel,
                                               sample_weight=sample_weight).loss
        return step.train_step(model, loss_fn, opt, x, y, sentinel, sample_weight)[0].loss

    # Only full batches: a short last batch would be a second shape (another trace) and
    # a smaller step in the timing.
    data = (bundle.train.filter(lambda x, *_: tf.shape(_first_tensor(x))[0] == batch)
            .repeat())
    done, timed, step_times = _timed_steps(train_step, iter(data), req, n)
    # The median step, not the mean: on a shared machine a step that lost the CPU to
    # another process for a moment says nothing about this batch size.
    median = sorted(step_times)[len(step_times) // 2]
    peak = peak_memory()["bytes"]
    result.update(steps=done, timed_seconds=round(timed, 4), accumulate=n,
                  median_step_seconds=round(median, 5),
                  mean_samples_per_second=round(done * batch / max(timed, 1e-9), 2),
                  samples_per_second=round(n * batch / max(median, 1e-9), 2),
                  peak_memory_bytes=peak, cpu_peak_rss_bytes=cpu_peak_bytes(),
                  seconds=round(time.perf_counter() - started, 3))
    return result


def _timed_steps(train_step, batches, req: dict, n: int = 1):
    """Warm-up, then timed calls of ``train_step``, each timing one group of ``n`` steps
    (one update: with ``--accumulate n`` the update's cost is in every timing).  Returns
    (steps timed, seconds timed, the groups' seconds)."""
    for _ in range(max(int(req.get("warmup_steps", 2)), n)):
        float(train_step(*next(batches)))
    steps, min_seconds = int(req.get("steps", 4)), float(req.get("min_seconds", 1.5))
    max_steps = int(req.get("max_steps", max(steps, 200)))
    done, timed, step_times = 0, 0.0, []
    while done < steps or (timed < min_seconds and done < max_steps):
        group = [next(batches) for _ in range(n)]   # fetched outside the clock
        t0 = time.perf_counter()
        for batch in group:
            float(train_step(*batch))     # a Python float: waits for the step to finish
        step_times.append(time.perf_counter() - t0)
        timed += step_times[-1]
        done += n
    return done, timed, step_times


def _peak_so_far():
    """The peak up to a failure (None when even that cannot be read)."""
    try:
        return peak_memory()["bytes"]
    except Exception:  # pragma: no cover - GPU only
        return None


def _write(path: str, doc: dict) -> None:
    from app.core.files import write_json_atomic

    write_json_atomic(path, doc)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="app.tuner.trial")
    parser.add_argument("--request", required=True, help="the trial as JSON")
    parser.add_argument("--result", required=True, help="where to write the result JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    req = json.loads(args.request)
    from app.core.errors import PrecisionUnsupported, UsageError, UserCodeError
    from app.core.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE

    try:
        doc = run(req)
    except PrecisionUnsupported as exc:
        _write(args.result, {"status": "unsupported", "reason": exc.line(),
                             "policy": exc.policy})
        sys.stderr.write(exc.line() + "\n")
        return EXIT_USAGE
    except UsageError as exc:
        _write(args.result, {"status": "usage", "reason": exc.line()})
        sys.stderr.write(exc.line() + "\n")
        return EXIT_USAGE
    except BaseException as exc:  # noqa: B902 - classified, then reported
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        if _is_oom(exc):
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            _write(args.result, {"status": "oom", "reason": f"out of memory "
                                 f"({type(getattr(exc, 'original', exc)).__name__}: {first})",
                                 "peak_memory_bytes": _peak_so_far()})
            return EXIT_OK
        original = getattr(exc, "original", exc) if isinstance(exc, UserCodeError) else exc
        traceback.print_exception(type(original), original, original.__traceback__)
        line = exc.line() if hasattr(exc, "line") else f"{type(exc).__name__}: {exc}"
        _write(args.result, {"status": "error", "reason": str(line).splitlines()[0][:300]})
        return EXIT_FAILED
    _write(args.result, doc)
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
