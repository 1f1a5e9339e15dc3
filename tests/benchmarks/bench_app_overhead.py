"""What does the tool cost?  ``python -m app train`` against a minimal hand-written Keras fit.

Both sides train the same model (seed 2's 784-512-256-10 MLP with a float32 softmax) on the
same synthetic data (``app.data.synthetic_arrays``, fixed seed) with the same policy, batch
size and optimizer, each in a fresh Python process.  Runs are interleaved (A B, B A, ...)
so drift on a noisy machine hits both sides alike.  Throughput is training samples per
second of the epochs after the first (the first includes tracing), timed from the start of
an epoch to the start of its validation, on both sides.  Target: the tool costs <= 5%.

    python tests/benchmarks/bench_app_overhead.py --repeats 3 --epochs 4 --samples 20000

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


def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_app(args, work, i):
    out = os.path.join(work, f"app-{i}")
    cmd = [sys.executable, "-m", "app", "train", "--model", "mlp", "--dataset", "synthetic",
           "--precision", args.policy, "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
           "--max-train-samples", str(args.samples), "--max-val-samples", str(args.val_samples),
           "--output", out, "--no-save-model", "--progress", "lines", "--offline"]
    subprocess.run(cmd, check=True, env=_env(), cwd=ROOT, capture_output=True, text=True)
    with open(os.path.join(out, "metrics.json")) as fh:
        return json.load(fh)["epochs"]


def run_baseline(args, work, i):
    out = os.path.join(work, f"baseline-{i}.json")
    cmd = [sys.executable, "-c", BASELINE, args.policy, str(args.epochs), str(args.batch_size),
           str(args.samples), str(args.val_samples), out]
    subprocess.run(cmd, check=True, env=_env(), cwd=ROOT, capture_output=True, text=True)
    with open(out) as fh:
        return json.load(fh)["epochs"]


def steady(rows):
    """Samples/s of every epoch after the first."""
    return [r["samples_per_second"] for r in rows[1:]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="float32",
                   choices=["float32", "mixed_bfloat16", "mixed_float16"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--val-samples", type=int, default=2000)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (the first epoch is warm-up)")
    work = args.output or tempfile.mkdtemp(prefix="bench-app-overhead-")
    os.makedirs(work, exist_ok=True)

    app_sps, base_sps, runs, ratios = [], [], [], []
    for i in range(args.repeats):
        pair = {}
        order = [("app", run_app), ("baseline", run_baseline)]
        if i % 2:
            order.reverse()           # A B, B A, A B ...
        for name, fn in order:
            rows = fn(args, work, i)
            (app_sps if name == "app" else base_sps).extend(steady(rows))
            pair[name] = statistics.median(steady(rows))
            runs.append({"side": name, "repeat": i, "epochs": rows})
            print(f"repeat {i + 1}/{args.repeats} {name:8s}: "
                  f"{statistics.median(steady(rows)):9.0f} samples/s "
                  f"(val_accuracy {rows[-1]['val_accuracy']:.3f})", flush=True)

        ratios.append(pair["app"] / pair["baseline"])

    # Two estimates: the ratio of the pooled medians, and the median of the per-repeat
    # ratios (each pair ran back to back, so slow drift of the machine cancels).
    app_med, base_med = statistics.median(app_sps), statistics.median(base_sps)
    overhead = 1.0 - app_med / base_med
    paired_overhead = 1.0 - statistics.median(ratios)
    result = {
        "policy": args.policy, "model": "mlp", "batch_size": args.batch_size,
        "train_samples": args.samples, "epochs": args.epochs, "repeats": args.repeats,
        "unit": "samples/s (training part of each epoch after the first)",
        "app_median": app_med, "baseline_median": base_med,
        "app_all": app_sps, "baseline_all": base_sps,
        "overhead_fraction": overhead, "paired_ratios": ratios,
        "paired_overhead_fraction": paired_overhead, "target_fraction": 0.05, "runs": runs,
    }
    with open(os.path.join(work, "bench_app_overhead.json"), "w") as fh:
        json.dump(result, fh, indent=2)
    print()
    print("| side                      | median samples/s | n  |")
    print("|---------------------------|-----------------:|---:|")
    print(f"| python -m app train       | {app_med:16.0f} | {len(app_sps):2d} |")
    print(f"| hand-written Keras fit    | {base_med:16.0f} | {len(base_sps):2d} |")
    print(f"\npaired app/baseline ratios: {', '.join(f'{r:.3f}' for r in ratios)}")
    print(f"overhead of the tool: {overhead * 100:+.1f}% (pooled medians), "
          f"{paired_overhead * 100:+.1f}% (median of paired ratios); target <= 5%  "
          f"[{args.policy}, batch {args.batch_size}, {args.samples} samples]")
    print(f"JSON: {os.path.join(work, 'bench_app_overhead.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
