"""How well does ``tfmp tune`` do its job on this machine?  One whole tune, measured.

Tunes the residual CNN (``resnet`` on ``synthetic`` 32x32x3 data, cifar10's shape) under a
2 GiB budget with float32 and mixed_bfloat16, exactly as
``python -m app tune --model resnet --dataset synthetic --memory-budget 2GiB`` would, and
checks the issue's targets (issue 16):

* mixed_bfloat16's ``max_batch`` at least 1.15x float32's (bfloat16 activations take half
  the space; the fixed part, runtime and weights, does not shrink);
* trials per precision at most log2(cap / 8) + 4 (doubling, then a bracket narrowed by
  the memory curve);
* the whole tune under 10 minutes on this 2-core machine.

Prints the tune's table and a verdict line per target with the load average before and
after (other work on the machine slows every trial); exits 1 when a target is missed.

    python tests/benchmarks/bench_tune.py [--budget 2GiB] [--max-batch 4096] [--output DIR]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: paths.py
from paths import root_on_path  # noqa: E402  the repository root (tests/paths.py)
root_on_path()  # this checkout's app

from app.tuner.tuning import tune  # noqa: E402

RATIO_TARGET = 1.15
TIME_TARGET = 600.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", default="2GiB")
    p.add_argument("--max-batch", type=int, default=4096)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    output = args.output or os.path.join(tempfile.mkdtemp(prefix="bench-tune-"), "tune")
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    doc = tune("resnet", "synthetic", precision="float32,mixed_bfloat16",
               memory_budget=args.budget, max_batch=args.max_batch, output=output)
    total = time.monotonic() - t0
    load_after = os.getloadavg()[0]
    f32, bf16 = doc["precisions"]["float32"], doc["precisions"]["mixed_bfloat16"]
    allowed = int(math.log2(args.max_batch / 8)) + 4
    checks = []
    ratio = (bf16["max_batch"] / f32["max_batch"]) if f32["max_batch"] and bf16["max_batch"] \
        else None
    checks.append(("max_batch mixed_bfloat16 / float32",
                   f"{bf16['max_batch']} / {f32['max_batch']} = "
                   + (f"{ratio:.2f}x" if ratio else "n/a"), f">= {RATIO_TARGET}x",
                   ratio is not None and ratio >= RATIO_TARGET))
    for policy, entry in (("float32", f32), ("mixed_bfloat16", bf16)):
        n = len([t for t in entry["trials"] if t.get("phase") == "search"])
        checks.append((f"search trials, {policy}", str(n), f"<= {allowed}", n <= allowed))
    checks.append(("whole tune (2 precisions + verification)", f"{total:.0f} s",
                   f"< {TIME_TARGET:.0f} s", total < TIME_TARGET))
    print()
    print(f"load average (1 min) before {load_before:.2f}, after {load_after:.2f} on "
          f"{os.cpu_count()} CPUs; tune written to {output}")
    for name, value, target, ok in checks:
        print(f"{'PASS' if ok else 'MISS'}  {name}: {value} (target {target})")
    return 0 if all(ok for *_, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
