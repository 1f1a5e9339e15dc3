"""Does the tuned configuration train at least as fast as the default?  (issue 16's target:
"the chosen configuration trains at least as fast as the default (float32, batch 128),
median of paired runs").

Reads a tune.json (``--tuned``) or runs a small tune first (``tfmp tune``'s own code,
float32 and what ``auto`` picks here), then alternates, for ``--pairs`` pairs,

    tfmp train --tuned TUNE.json ...                      (the tune's precision and batch)
    tfmp train --precision float32 --batch-size 128 ...   (the default)

each a fresh process on the same data, the order swapped every pair so drift hits both
alike.  A run's speed is its median training samples/s over the epochs after the first
(warm-up: tracing, autotuning).  Prints every pair, the medians and the median of the
paired ratios, with the load average before and after; exits 1 when the tuned median is
below the default's.

    python tests/benchmarks/bench_tuned_vs_default.py [--tuned DIR/tune.json]
        [--model resnet] [--pairs 3] [--epochs 3] [--train-samples 4096]
        [--budget 2GiB] [--max-batch 1024] [--output DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: paths.py
from paths import ROOT, root_on_path  # noqa: E402  the repository root (tests/paths.py)
root_on_path()  # this checkout's app

from app.benchmark.stats import measure_run  # noqa: E402
from app.core.launch import module_command  # noqa: E402

DEFAULT = ("float32", 128)
WARMUP_EPOCHS = 1


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFMP_")}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _train(args, out: str, extra: list) -> dict:
    """One ``tfmp train`` run; its metrics.json, with the measured speed."""
    cmd = module_command("app", "train", "--model", args.model, "--dataset", "synthetic",
                         "--epochs", str(args.epochs), "--max-train-samples",
                         str(args.train_samples), "--max-val-samples", "256",
                         "--no-save-model", "--progress", "lines", "--output", out, *extra)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(extra)} failed (exit {proc.returncode}): "
                         f"{proc.stderr.strip().splitlines()[-1:]}")
    with open(os.path.join(out, "metrics.json"), encoding="utf-8") as fh:
        metrics = json.load(fh)
    metrics["_measured"] = measure_run(metrics, WARMUP_EPOCHS)
    return metrics


def _tune(args, work: str) -> str:
    from app.tuner.tuning import tune

    out = os.path.join(work, "tune")
    tune(args.model, "synthetic", precision="float32,auto", memory_budget=args.budget,
         max_batch=args.max_batch, output=out)
    return os.path.join(out, "tune.json")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tuned", help="a tune.json of --model on synthetic data (default: tune)")
    p.add_argument("--model", default="resnet")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--train-samples", type=int, default=4096)
    p.add_argument("--budget", default="2GiB")
    p.add_argument("--max-batch", type=int, default=1024)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    if args.epochs <= WARMUP_EPOCHS or args.pairs < 1:
        p.error(f"--epochs must exceed {WARMUP_EPOCHS} and --pairs be at least 1")
    work = args.output or tempfile.mkdtemp(prefix="bench-tuned-")
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    tune_json = args.tuned or _tune(args, work)
    tuned_sps, default_sps, ratios = [], [], []
    for i in range(args.pairs):
        runs = {}
        order = ("tuned", "default") if i % 2 == 0 else ("default", "tuned")
        for kind in order:
            extra = (["--tuned", tune_json] if kind == "tuned" else
                     ["--precision", DEFAULT[0], "--batch-size", str(DEFAULT[1])])
            runs[kind] = _train(args, os.path.join(work, f"pair{i + 1}-{kind}"), extra)
        t, d = (runs[k]["_measured"]["samples_per_second"] for k in ("tuned", "default"))
        tuned_sps.append(t)
        default_sps.append(d)
        ratios.append(t / d)
        cfg = runs["tuned"]["config"]
        print(f"pair {i + 1} ({order[0]} first): tuned {cfg['precision']} batch "
              f"{cfg['batch_size']}: {t:,.0f} samples/s; default float32 batch 128: "
              f"{d:,.0f} samples/s; ratio {t / d:.2f}x", flush=True)
    med_t, med_d = statistics.median(tuned_sps), statistics.median(default_sps)
    ok = med_t >= med_d
    print(f"load average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} CPUs; {time.monotonic() - t0:.0f} s in all; files in {work}")
    print(f"{'PASS' if ok else 'MISS'}  tuned median {med_t:,.0f} samples/s vs default median "
          f"{med_d:,.0f} samples/s ({med_t / med_d:.2f}x; median of paired ratios "
          f"{statistics.median(ratios):.2f}x; target >= 1.00x)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
