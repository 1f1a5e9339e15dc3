"""What one run per output folder (app/run_folder/lock.py) adds to a run's start.

A run pays for the lock twice: ``check_free`` in ``prepare`` (open the lock file if there is
one, try the lock, let go) and ``acquire`` before its first write (create the folder and the
file, lock, write who holds it).  Both are timed here in one process, in alternating pairs
against the same steps without the lock (creating the folder, which the run's first write
does anyway), on fresh folders under --dir (put it on the volume you care about: a bind
mount, a named volume, NFS).  The extra time is then set against a real run's start, from
process start to the first epoch line of a tiny `tfmp train`, measured in this run too.

Target: the lock costs under 1% of a run's start.  Exit status 1 when missed.

    python tests/benchmarks/bench_run_lock.py --pairs 200 [--dir /workspace/tmp]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: paths.py
from paths import ROOT, root_on_path  # noqa: E402  the repository root (tests/paths.py)
root_on_path()  # this checkout's app

from app.run_folder.lock import RunLock  # noqa: E402

TARGET_SHARE = 0.01


def with_lock(folder: str) -> float:
    t0 = time.perf_counter()
    lock = RunLock(folder, command="bench")
    lock.check_free()
    lock.acquire()
    elapsed = time.perf_counter() - t0
    lock.release()
    return elapsed


def without_lock(folder: str) -> float:
    t0 = time.perf_counter()
    os.makedirs(folder, exist_ok=True)
    return time.perf_counter() - t0


def run_start_seconds(workdir: str) -> float:
    """Process start to the first epoch line of a one-epoch run on 256 synthetic samples."""
    cmd = [sys.executable, "-m", "app", "train", "--dataset", "synthetic", "--model", "mlp",
           "--precision", "float32", "--max-train-samples", "256", "--max-val-samples", "64",
           "--epochs", "1", "--offline", "--no-save-model", "--progress", "lines",
           "--output", os.path.join(workdir, "run")]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    for line in proc.stdout:
        if line.startswith("epoch 1/"):
            elapsed = time.perf_counter() - t0
            break
    else:
        raise SystemExit("the reference run printed no epoch line")
    proc.wait(timeout=300)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--dir", default=None, help="where the folders are made (default: a temp dir)")
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="bench-run-lock-", dir=args.dir)
    try:
        locked, plain = [], []
        for i in range(args.pairs):
            # Alternate which side goes first, so drift hits both alike.
            sides = [(locked, with_lock), (plain, without_lock)]
            for into, fn in (sides if i % 2 == 0 else sides[::-1]):
                into.append(fn(os.path.join(base, f"{fn.__name__}-{i}")))
        start = run_start_seconds(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    extra = statistics.median(locked) - statistics.median(plain)
    share = extra / start
    print(f"pairs: {args.pairs}  folder: {args.dir or tempfile.gettempdir()}")
    print(f"with the lock (check_free + acquire): median {statistics.median(locked) * 1e3:.3f} ms, "
          f"p90 {sorted(locked)[int(0.9 * len(locked))] * 1e3:.3f} ms")
    print(f"without (the folder only):             median {statistics.median(plain) * 1e3:.3f} ms")
    print(f"a run's start (process to first epoch line): {start:.2f} s")
    print(f"the lock's share of the start: {share * 100:.4f}% (target < {TARGET_SHARE * 100:g}%)")
    return 0 if share < TARGET_SHARE else 1


if __name__ == "__main__":
    raise SystemExit(main())
