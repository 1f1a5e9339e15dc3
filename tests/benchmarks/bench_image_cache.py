"""What an image folder costs in memory: the process' peak resident memory while
``app.task.data.load("images", ...)`` loads a folder of noise PNGs and two epochs of its
training batches are read, less the peak before the load (TensorFlow imported, one op run).

    python3 tests/benchmarks/bench_image_cache.py --images 3000 --size 64
    python3 tests/benchmarks/bench_image_cache.py --src /tmp/old-checkout ...   # another version

Each measurement runs in a process of its own (a peak only grows); ``--repeats`` runs each
``--src`` that often, alternating, and prints every figure and the medians.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CHILD = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
from app.task import data

def hwm():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmHWM:"))

tf.constant(1.0) + 1.0
before = hwm()
bundle = data.load("images", (int(sys.argv[3]),) * 2 + (3,), 32, image_dir=sys.argv[2])
for _ in range(2):
    for x, y in bundle.train:
        pass
print(hwm() - before, bundle.train_samples + bundle.val_samples, "|".join(bundle.notes))
"""


def make_folder(folder: str, images: int) -> None:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    for cls in ("a", "b"):
        os.makedirs(os.path.join(folder, cls), exist_ok=True)
    for i in range(images):
        img = rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)
        tf.io.write_file(os.path.join(folder, "ab"[i % 2], f"{i}.png"), tf.io.encode_png(img))


def measure(src: str, folder: str, size: int) -> tuple:
    out = subprocess.run([sys.executable, "-c", _CHILD, src, folder, str(size)],
                         capture_output=True, text=True, check=True).stdout
    out = out.strip().splitlines()[-1].split(maxsplit=2)   # after Keras' "Found N files" lines
    return int(out[0]), int(out[1]), out[2].strip() if len(out) > 2 else ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--size", type=int, default=64, help="--image-size")
    p.add_argument("--src", action="append", help="package roots to compare (default: this one)")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    sources = args.src or [ROOT]
    with tempfile.TemporaryDirectory() as folder:
        make_folder(folder, args.images)
        seen = {src: [] for src in sources}
        for _ in range(args.repeats):
            for src in sources:
                grew, n, notes = measure(src, folder, args.size)
                seen[src].append(grew)
                print(f"{src}: {n} images at {args.size}x{args.size}: peak +{grew / 2**20:.0f} MiB"
                      + (f" ({notes})" if notes else ""), flush=True)
        per_image = args.size * args.size * 3
        print(f"decoded bytes: {args.images * per_image / 2**20:.0f} MiB as uint8, "
              f"{args.images * per_image * 4 / 2**20:.0f} MiB as float32")
        for src in sources:
            print(f"median {src}: +{statistics.median(seen[src]) / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
