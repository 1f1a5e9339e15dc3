"""How long does ``python -m app train`` take to stop on SIGTERM (what ``docker stop`` sends)?

A real run (synthetic data, the MLP, float32) is started in a fresh process; once its own log
shows a step of epoch 2 (a ``step N:`` line after the ``epoch 1/E:`` line), it gets SIGTERM,
and the seconds until it has exited (checkpoint and metrics.json written, status 143) are the
figure.  Target: every stop within 10 s, well inside Docker's default 10 s grace plus the
time a scheduler gives; the exit status is 1 when it is missed (or a run does not stop with
143), so a run of this script can be used as a check.  tests/unit/commands/test_cli.py checks the
behaviour (143, checkpoint, resume) without a clock.

    python tests/benchmarks/bench_stop_latency.py --repeats 3

Prints a table and writes bench_stop_latency.json into --output (default a temp folder).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: paths.py
from paths import ROOT  # noqa: E402  the repository root (tests/paths.py)
TARGET_SECONDS = 10.0


def one_stop(out: str, samples: int, batch_size: int) -> dict:
    args = ["train", "--dataset", "synthetic", "--model", "mlp", "--precision", "float32",
            "--max-train-samples", str(samples), "--max-val-samples", "128",
            "--batch-size", str(batch_size), "--epochs", "3", "--offline", "--no-save-model",
            "--progress", "lines", "--log-every", "50", "--output", out]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "app", *args], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        after_epoch_1 = False
        for line in proc.stdout:   # blocks per line; the run logs every 50 steps
            if line.startswith("epoch 2/"):
                raise RuntimeError("epoch 2 ended before any of its steps was logged")
            after_epoch_1 = after_epoch_1 or line.startswith("epoch 1/")
            if after_epoch_1 and line.startswith("step "):
                break
        else:
            raise RuntimeError(f"the run ended (status {proc.wait()}) before epoch 2")
        sent = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=300)
        seconds = time.perf_counter() - sent
        proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"seconds": seconds, "status": code}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--samples", type=int, default=20000, help="training samples per epoch")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    work = args.output or tempfile.mkdtemp(prefix="bench-stop-")
    os.makedirs(work, exist_ok=True)

    stops = []
    for i in range(args.repeats):
        stop = one_stop(os.path.join(work, f"run{i}"), args.samples, args.batch_size)
        stops.append(stop)
        print(f"stop {i + 1}/{args.repeats}: exit {stop['status']} after {stop['seconds']:.2f} s",
              flush=True)
    seconds = [s["seconds"] for s in stops]
    result = {"model": "mlp", "policy": "float32", "batch_size": args.batch_size,
              "train_samples": args.samples, "stops": stops,
              "median_seconds": statistics.median(seconds), "max_seconds": max(seconds),
              "target_seconds": TARGET_SECONDS}
    missed = [f"stop {i + 1} took {s['seconds']:.2f} s" for i, s in enumerate(stops)
              if s["seconds"] > TARGET_SECONDS]
    missed += [f"stop {i + 1} exited {s['status']}, not 143" for i, s in enumerate(stops)
               if s["status"] != 143]
    result["target_met"] = not missed
    path = os.path.join(work, "bench_stop_latency.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2)
    print()
    print("| SIGTERM inside epoch 2 -> exit | median | max | target |")
    print("|--------------------------------|-------:|----:|-------:|")
    print(f"| python -m app train (mlp, batch {args.batch_size}) | {result['median_seconds']:.2f} s "
          f"| {result['max_seconds']:.2f} s | <= {TARGET_SECONDS:g} s |")
    print(f"JSON: {path}")
    print("target: met" if not missed else "target MISSED: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
