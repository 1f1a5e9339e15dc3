"""What Grappler's MatMul + BiasAdd fusion costs a mixed_float16 run on a CPU.

``app.precision.policy.apply_policy`` turns the remapper off under mixed_float16 when no
GPU is visible, because the fused float16 op it makes (oneDNN's) is far slower than the
ops it replaces in newer TensorFlow.  This measures it on the product's own path: the same
``app.train`` run (a built-in model, synthetic data, the fit loop) in processes of its own,
one side as shipped ('unfused') and one with that function made a no-op ('fused', as
TensorFlow would run it), taking turns for ``--rounds`` rounds; printed: each side's
median samples/s (metrics.json's, warm-up excluded as the run reports it) and the ratio.

    python3 tests/benchmarks/bench_cpu_float16_fusion.py --models mlp,cnn
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: paths.py
from paths import ROOT  # noqa: E402

CHILD = """
import json, sys
import app
import app.precision.policy as policy
if sys.argv[1] == "fused":
    policy._fit_cpu_float16_fusions = lambda tf, name: None
m = app.train(sys.argv[2], "synthetic", precision=sys.argv[3], loop="fit", epochs=1,
              batch_size=int(sys.argv[4]), max_train_samples=int(sys.argv[5]),
              max_val_samples=16, progress="none", save_model=False, output=sys.argv[6])
print(json.dumps(m["epochs"][-1]["samples_per_second"]))
"""


def one_run(side, model, precision, batch, samples, workdir) -> float:
    out = tempfile.mkdtemp(dir=workdir)
    proc = subprocess.run([sys.executable, "-c", CHILD, side, model, precision, str(batch),
                           str(samples), out], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        sys.exit(f"the {side} run failed:\n{proc.stderr[-2000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--precision", default="mixed_float16")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    print(f"{args.precision}, batch {args.batch}, {args.steps} steps a run, {args.rounds} "
          f"rounds; median samples/s")
    print(f"{'model':6} {'fused':>9} {'unfused':>9} {'unfused/fused':>14}")
    with tempfile.TemporaryDirectory() as workdir:
        for model in args.models.split(","):
            rates = {"fused": [], "unfused": []}
            for _ in range(args.rounds):
                for side in rates:
                    rates[side].append(one_run(side, model, args.precision, args.batch,
                                               args.batch * args.steps, workdir))
            fused, unfused = (statistics.median(rates[s]) for s in ("fused", "unfused"))
            print(f"{model:6} {fused:9.1f} {unfused:9.1f} {unfused / fused:13.1f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
