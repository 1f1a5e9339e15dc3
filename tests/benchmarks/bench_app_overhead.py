"""What does the tool cost?  ``python -m app train`` against a minimal hand-written Keras fit,
and the plug-in path against the built-in one.

Three sides: ``app`` (``python -m app train --model mlp``), ``baseline`` (hand-written
Keras fit) and ``spec`` (``python -m app train --model <file>.py:build`` with a user-style
copy of the same MLP, written into --output).  All train the same model (seed 2's 784-512-256-10 MLP with a float32 softmax) on the
same synthetic data (``app.data.synthetic_arrays``, fixed seed) with the same policy, batch
size and optimizer, each in a fresh Python process.  Runs are interleaved (A B, B A, ...)
so drift on a noisy machine hits both sides alike.  Throughput is training samples per
second of the epochs after the first (the first includes tracing), timed from the start of
an epoch to the start of its validation, on every side.  Targets: the tool costs <= 3%
against the baseline; the spec side is within 2% of the built-in one.  Each repeat runs the
sides back to back in a rotating order; the figures are medians of the per-repeat ratios.

    python tests/benchmarks/bench_app_overhead.py --repeats 6 --epochs 4 --samples 60000

Prints a table and writes bench_app_overhead.json into --output (default a temp folder).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BASELINE = r'''
import json, sys, time
import tensorflow as tf
from app.data import synthetic_arrays
policy, epochs, batch, n_train, n_val, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
tf.keras.utils.set_random_seed(0)
tf.keras.mixed_precision.set_global_policy(policy)
(x, y), (xv, yv) = synthetic_arrays((784,), 10, n_train, n_val, seed=0)
inputs = tf.keras.Input((784,))
h = tf.keras.layers.Dense(512, activation="relu")(inputs)
h = tf.keras.layers.Dense(256, activation="relu")(h)
h = tf.keras.layers.Dense(10)(h)
outputs = tf.keras.layers.Activation("softmax", dtype="float32")(h)
model = tf.keras.Model(inputs, outputs)
opt = tf.keras.optimizers.Adam(1e-3)
if policy == "mixed_float16":
    opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)
model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
class Timer(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__(); self.rows = []
    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = time.perf_counter(); self.t = None
    def on_test_begin(self, logs=None):
        if self.t is None: self.t = time.perf_counter() - self.t0
    def on_epoch_end(self, epoch, logs=None):
        self.rows.append({"epoch": epoch + 1, "samples_per_second": n_train / self.t,
                          "val_accuracy": float(logs["val_accuracy"])})
timer = Timer()
model.fit(x, y, batch_size=batch, epochs=epochs, validation_data=(xv, yv), verbose=0, callbacks=[timer])
json.dump({"epochs": timer.rows}, open(out, "w"))
'''


SPEC_MODEL = r'''
"""A user's own model file: the same 784-512-256-10 MLP as the built-in ``mlp``."""
import tensorflow as tf


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Dense(512, activation="relu")(inputs)
    x = tf.keras.layers.Dense(256, activation="relu")(x)
    x = tf.keras.layers.Dense(num_classes)(x)
    outputs = tf.keras.layers.Activation("softmax", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs)
'''


def _env(root=ROOT):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_app(args, work, i, model="mlp", tag="app", root=ROOT):
    out = os.path.join(work, f"{tag}-{i}")
    extra = [] if model == "mlp" else ["--input-shape", "784"]
    cmd = [sys.executable, "-m", "app", "train", "--model", model, "--dataset", "synthetic",
           *extra,
           "--precision", args.policy, "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
           "--max-train-samples", str(args.samples), "--max-val-samples", str(args.val_samples),
           "--output", out, "--no-save-model", "--progress", "lines", "--offline"]
    subprocess.run(cmd, check=True, env=_env(root), cwd=root, capture_output=True, text=True)
    with open(os.path.join(out, "metrics.json")) as fh:
        return json.load(fh)["epochs"]


def run_spec(args, work, i):
    path = os.path.join(work, "my_mlp.py")
    if not os.path.exists(path):
        with open(path, "w") as fh:
            fh.write(SPEC_MODEL)
    return run_app(args, work, i, model=path + ":build", tag="spec")


def run_other(args, work, i):
    """The built-in mlp trained by another checkout of the package (--other-root)."""
    return run_app(args, work, i, tag="other", root=os.path.abspath(args.other_root))


def run_baseline(args, work, i):
    out = os.path.join(work, f"baseline-{i}.json")
    cmd = [sys.executable, "-c", BASELINE, args.policy, str(args.epochs), str(args.batch_size),
           str(args.samples), str(args.val_samples), out]
    subprocess.run(cmd, check=True, env=_env(), cwd=ROOT, capture_output=True, text=True)
    with open(out) as fh:
        return json.load(fh)["epochs"]


SIDES = ("app", "baseline", "spec", "other")


def steady(rows):
    """Samples/s of every epoch after the first."""
    return [r["samples_per_second"] for r in rows[1:]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="float32",
                   choices=["float32", "mixed_bfloat16", "mixed_float16"])
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--val-samples", type=int, default=2000)
    p.add_argument("--output", default=None)
    p.add_argument("--sides", default="app,baseline,spec",
                   help="comma-separated subset of app,baseline,spec,other (default the first "
                        "three; other: --other-root's app, e.g. an older commit)")
    p.add_argument("--other-root", default=None, metavar="DIR",
                   help="another checkout of the package, for the side 'other'")
    args = p.parse_args(argv)
    sides = [x.strip() for x in args.sides.split(",") if x.strip()]
    if not set(sides) <= set(SIDES) or "app" not in sides or len(sides) < 2:
        p.error("--sides: app and at least one of baseline, spec, other")
    if "other" in sides and not args.other_root:
        p.error("--sides other needs --other-root")
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (the first epoch is warm-up)")
    work = args.output or tempfile.mkdtemp(prefix="bench-app-overhead-")
    os.makedirs(work, exist_ok=True)

    fns = {"app": run_app, "baseline": run_baseline, "spec": run_spec, "other": run_other}
    sps = {name: [] for name in sides}
    ratios = {name: [] for name in sides if name != "app"}   # app/baseline, spec/app
    runs = []
    for i in range(args.repeats):
        pair = {}
        order = sides[i % len(sides):] + sides[:i % len(sides)]   # rotate: A B C, B C A, ...
        if (i // len(sides)) % 2:
            order.reverse()
        for name in order:
            rows = fns[name](args, work, i)
            sps[name].extend(steady(rows))
            pair[name] = statistics.median(steady(rows))
            runs.append({"side": name, "repeat": i, "order": order, "epochs": rows})
            print(f"repeat {i + 1}/{args.repeats} {name:8s}: "
                  f"{pair[name]:9.0f} samples/s "
                  f"(val_accuracy {rows[-1]['val_accuracy']:.3f})", flush=True)
        if "baseline" in pair:
            ratios["baseline"].append(pair["app"] / pair["baseline"])
        if "spec" in pair:
            ratios["spec"].append(pair["spec"] / pair["app"])
        if "other" in pair:
            ratios["other"].append(pair["other"] / pair["baseline"] if "baseline" in pair
                                   else pair["other"] / pair["app"])

    # Two estimates: the ratio of the pooled medians, and the median of the per-repeat
    # ratios (each repeat's runs ran back to back, so slow drift of the machine cancels).
    med = {name: statistics.median(v) for name, v in sps.items()}
    result = {
        "policy": args.policy, "model": "mlp", "batch_size": args.batch_size,
        "train_samples": args.samples, "epochs": args.epochs, "repeats": args.repeats,
        "unit": "samples/s (training part of each epoch after the first)",
        "medians": med, "all": sps, "runs": runs,
    }
    if "baseline" in ratios:
        r = ratios["baseline"]
        result.update({
            "app_median": med["app"], "baseline_median": med["baseline"],
            "overhead_fraction": 1.0 - med["app"] / med["baseline"], "paired_ratios": r,
            "paired_overhead_fraction": 1.0 - statistics.median(r), "target_fraction": 0.03})
    if "spec" in ratios:
        r = ratios["spec"]
        result.update({"spec_paired_ratios": r,
                       "spec_vs_builtin_fraction": statistics.median(r) - 1.0,
                       "spec_target_fraction": 0.02})
    with open(os.path.join(work, "bench_app_overhead.json"), "w") as fh:
        json.dump(result, fh, indent=2)
    labels = {"app": "python -m app train (mlp)", "baseline": "hand-written Keras fit",
              "spec": "app train, my_mlp.py:build", "other": "--other-root's app train"}
    print()
    print("| side                        | median samples/s | n  |")
    print("|-----------------------------|-----------------:|---:|")
    for name in sides:
        print(f"| {labels[name]:27s} | {med[name]:16.0f} | {len(sps[name]):2d} |")
    what = f"[{args.policy}, batch {args.batch_size}, {args.samples} samples, {args.repeats} repeats]"
    if "baseline" in ratios:
        r = ratios["baseline"]
        print(f"\npaired app/baseline ratios: {', '.join(f'{x:.3f}' for x in r)}")
        print(f"overhead of the tool: {result['overhead_fraction'] * 100:+.1f}% (pooled medians), "
              f"{result['paired_overhead_fraction'] * 100:+.1f}% (median of paired ratios); "
              f"target <= 3%  {what}")
    if "spec" in ratios:
        r = ratios["spec"]
        print(f"\npaired spec/app ratios: {', '.join(f'{x:.3f}' for x in r)}")
        print(f"user-spec MLP vs built-in mlp: {result['spec_vs_builtin_fraction'] * 100:+.1f}% "
              f"(median of paired ratios); target within 2%  {what}")
    if "other" in ratios:
        r = ratios["other"]
        result["other_paired_ratios"] = r
        vs = "baseline" if "baseline" in sides else "app"
        print(f"\npaired other/{vs} ratios: {', '.join(f'{x:.3f}' for x in r)}; "
              f"median {statistics.median(r):.3f}  {what}")
    with open(os.path.join(work, "bench_app_overhead.json"), "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"JSON: {os.path.join(work, 'bench_app_overhead.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
