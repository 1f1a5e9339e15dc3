"""What does the sentinel's float32 guard cost on its own, in microseconds?

``bench_sentinel.py`` times whole training steps, whose noise on a small shared CPU is
about the size of the guard itself (its A/A control moves 2-3%).  This times the part the
sentinel adds where there is no loss scaling, apart from the forward and backward pass:
on the gradients of a built-in model's variables (fresh each call, as a backward pass
leaves them), the optimizer's apply alone, and beside it

* ``check``: ``finite.sum_finite`` (one sum of every gradient: these gradients are not a
  matmul's output, so no kernel's is proved from its factors), then the apply;
* ``cond``: the apply under a ``tf.cond`` whose predicate needs no gradient;
* ``check+cond``: the apply under a ``tf.cond`` on that sum (what a LossScaleOptimizer does
  every step, and the least any exact skip of an update can cost);
* ``guard``: ``SentinelState.guard`` itself, as ``tfmp train`` runs it (the loss and the
  latch join the sum; the fault's branch holds the stash);
* ``keras-lso``: no sentinel, Keras' own LossScaleOptimizer instead (its own test and
  skip, as a mixed_float16 step makes them): the price Keras itself pays for an exact skip.

``--jit`` compiles every variant with XLA, as ``tfmp train --jit`` compiles the step.  There
the skip is dearer than the test: XLA turns the cond around the update into selects and
copies each of Adam's slots first so the old values outlive the update in place
(2026-12-05, TF 2.9 on a 2-core CPU: 4 copies in the plain step's optimized HLO, 13 with the
guard or Keras' LossScaleOptimizer).

Every variant is a ``tf.function`` in this one process, called ``--calls`` times a round in
a shuffled order, ``--rounds`` rounds; printed: the median microseconds a call over the
plain apply, and that as a share of ``--step-ms`` (the model's training step, from
``bench_sentinel.py``'s 'off' column) when given.

    python3 tests/benchmarks/bench_guard.py --models mlp,cnn
    python3 tests/benchmarks/bench_guard.py --models mlp --jit --step-ms mlp=4.7
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: paths.py
from paths import root_on_path  # noqa: E402

root_on_path()

# The built-in models' samples (app.task: synthetic data takes the dataset's shape).
INPUT = {"mlp": ((784,), 10), "cnn": ((28, 28, 1), 10), "resnet": ((32, 32, 3), 10)}


def variants(model_name: str, batch_size: int, jit: bool = False) -> dict:
    import tensorflow as tf

    from app.precision import finite, loss_scale
    from app.task.models import build_model
    from app.training.sentinel import SentinelState
    from app.training.step_stats import StepStats

    shape, classes = INPUT[model_name]
    model = build_model(model_name, shape, classes)
    model(tf.zeros((1,) + shape))
    variables = model.trainable_variables
    # What a backward pass would leave: one gradient per variable, made anew each call.
    sources = [tf.Variable(tf.random.normal(v.shape, stddev=1e-3)) for v in variables]
    opt = tf.keras.optimizers.Adam(learning_rate=1e-7)
    loss_scale.build_optimizer(opt, variables)
    lso = loss_scale.wrap_optimizer(tf.keras.optimizers.Adam(learning_rate=1e-7),
                                    "mixed_float16")
    loss_scale.build_optimizer(lso, variables)
    x = tf.random.normal((batch_size,) + shape)
    y = tf.zeros((batch_size,), tf.int32)
    stats = StepStats()
    sentinel = SentinelState(stats, (tf.TensorSpec(x.shape, x.dtype), tf.TensorSpec(y.shape, y.dtype)),
                             batch_size=batch_size)

    def grads():
        return [s * 1.0001 for s in sources]

    def apply(g):
        opt.apply_gradients(zip(g, variables))

    def plain():
        apply(grads())

    def check():
        g = grads()
        ok = finite.sum_finite(g)
        with tf.control_dependencies([ok]):   # the apply waits for it, as behind the guard
            apply([tf.identity(t) for t in g])

    def cond():
        g = grads()

        def yes():
            apply(g)
            return tf.constant(True)
        tf.cond(tf.reduce_sum(x[:1]) < 1e30, yes, lambda: tf.constant(False))

    def guard():
        g = grads()
        loss = tf.reduce_mean(x)
        sentinel.guard(opt, g, loss, (x, y), apply)

    def checkcond():
        g = grads()

        def yes():
            apply(g)
            return tf.constant(True)
        tf.cond(finite.sum_finite(g), yes, lambda: tf.constant(False))

    def keras_lso():   # taken as a scaled loss's gradients: unscaled, tested, applied
        loss_scale.scale_loss(lso, tf.reduce_mean(x))   # as a step scales its loss
        loss_scale.unscale_and_apply(lso, grads(), variables)
    return {name: tf.function(fn, jit_compile=jit) for name, fn in
            (("plain", plain), ("check", check), ("cond", cond), ("check+cond", checkcond),
             ("guard", guard), ("keras-lso", keras_lso))}


def timed(fns: dict, rounds: int, calls: int) -> dict:
    for fn in fns.values():   # traced and warm
        for _ in range(10):
            fn()
    times = {name: [] for name in fns}
    names = list(fns)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(names)
        for name in names:
            fn = fns[name]
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--calls", type=int, default=30, help="calls of one variant in a row")
    p.add_argument("--jit", action="store_true", help="every variant compiled with XLA")
    p.add_argument("--step-ms", default="", help="MODEL=MS,...: each model's training step")
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    step_ms = dict((k, float(v)) for k, v in (kv.split("=") for kv in args.step_ms.split(",") if kv))
    for model in filter(None, args.models.split(",")):
        med = timed(variants(model, args.batch_size, args.jit), args.rounds, args.calls)
        base = med.pop("plain")
        parts = []
        for name, us in med.items():
            share = (f" ({100 * (us - base) / (1e3 * step_ms[model]):.1f}% of a "
                     f"{step_ms[model]:g} ms step)" if model in step_ms else "")
            parts.append(f"{name} {us - base:+.0f} us{share}")
        jit = " (XLA)" if args.jit else ""
        print(f"{model:6s} apply{jit} {base:.0f} us a call; over it: " + "; ".join(parts),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
