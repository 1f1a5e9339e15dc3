"""What does ``--class-weight balanced`` cost before the first step, on a ``tf.data`` pipeline?

Arrays are counted with numpy; a pipeline has to be read once for its labels, and reading it
runs everything the pipeline does to its inputs (here: decoding and resizing JPEG images, as
an image folder's pipeline does).  In one process, round by round in turn: the counting pass
(``app.task.class_weights.weigh``, through the same ``from_user`` bundle ``train`` makes) and
one epoch of the same training batches read alone (no model).  The figure is the median over
the rounds of (counting / epoch read): 1.0 means the weights cost one more epoch of reading.

    python3 tests/benchmarks/bench_class_weight.py
    python3 tests/benchmarks/bench_class_weight.py --samples 4096 --size 160 --rounds 7

Measured on 2 cores without AVX-512 (2026-12-06), --samples 4096 --size 192 --rounds 7:
counting 1.57 s against 1.50 s for an epoch read alone, median ratio 0.96 (0.55-1.94) on the
host (TF 2.21); in the image (TF 2.9) 1.60 s against 1.51 s, 1.09 (0.99-1.58).  Balanced
weights cost one more epoch of reading, before the first step.

The run's note ends with the ``--class-weight C=W,...`` flag that gives the same weights
without the pass (``train`` prints it).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def jpeg_pipeline(samples: int, size: int, classes: int):
    """(train, val) pipelines of JPEG bytes decoded and resized per sample, skewed classes."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    shots = [tf.io.encode_jpeg(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).numpy()
             for _ in range(16)]
    # Class c holds about twice the samples of class c+1.
    p = np.array([2.0 ** -c for c in range(classes)])
    y = rng.choice(classes, size=samples, p=p / p.sum()).astype("int32")
    files = np.array([shots[i % len(shots)] for i in range(samples)], dtype=object)

    def decode(jpeg, label):
        image = tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), (size // 2, size // 2))
        return image / 255.0, label

    def made(lo, hi):
        return tf.data.Dataset.from_tensor_slices((files[lo:hi], y[lo:hi])).map(decode)
    cut = samples * 7 // 8
    return made(0, cut), made(cut, samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--size", type=int, default=128, help="the JPEG's side in pixels")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)

    from app.task import class_weights
    from app.task.user_data import from_user

    bundle = from_user(jpeg_pipeline(args.samples, args.size, args.classes), "bench:load",
                       args.batch_size)
    balanced = class_weights.parse("balanced")
    class_weights.weigh(bundle, balanced)          # warm-up: tracing, the first reads
    ratios, counting, reading, note = [], [], [], ""
    for _ in range(args.rounds):
        start = time.perf_counter()
        note = class_weights.weigh(bundle, balanced).notes[-1]
        counted = time.perf_counter() - start
        start = time.perf_counter()
        for _batch in bundle.train:
            pass
        read = time.perf_counter() - start
        counting.append(counted)
        reading.append(read)
        ratios.append(counted / read)
    print(f"{bundle.train_samples} training samples, {args.size}px JPEG decoded and resized, "
          f"batch {args.batch_size}, {args.rounds} rounds")
    print(f"counting pass: median {statistics.median(counting):.2f} s; one epoch read alone: "
          f"median {statistics.median(reading):.2f} s; counting / epoch read: median "
          f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")
    print("note:", note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
