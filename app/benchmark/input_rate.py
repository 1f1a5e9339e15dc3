"""How fast does the input pipeline alone deliver batches?  Run in a child process.

    python -m app.benchmark.input_rate --model SPEC --dataset SPEC [train flags] \
        --epochs N --warmup-epochs W --output DIR

Loads the data exactly as ``tfmp train`` does (``app.training.job.prepare``: the same
task, batch size, sample limits, seed, shuffling and prefetching), then iterates the
training batches for ``--epochs`` epochs (and at least ``MIN_TIMED_EPOCHS`` after the
warm-up) with no model, inside one ``tf.function`` per epoch (``Dataset.reduce``, so no
Python runs per batch), and prints one JSON object on stdout: samples per second of every
epoch, and the fastest of those after the warm-up.

For a user's model it also builds the model once (float32, no training) and reports its
hidden layer widths (Dense/RNN units, Conv filters, Embedding sizes), so the benchmark can
check them for multiples of 8 as it does with the built-in models' table.

Exit status 2 with one ``error:`` line for bad input (the same checks as ``train``), 1 when
the user's own code raised.  The benchmark's parent process never imports TensorFlow; this
one does.  Nothing is written: ``--output`` is only checked, as ``train`` would check it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

# Two timed epochs at least, and the fastest of them: the pipeline is timed at another moment
# than the training runs it is compared with, and a busy machine only ever slows an epoch,
# so the fastest one is the pipeline's own rate (one slowed epoch read as its rate made a
# job that was plainly input-bound look "too short to time").
MIN_TIMED_EPOCHS = 2


def pipeline_rate(rows: Sequence[Dict[str, Any]], warmup_epochs: int) -> Optional[float]:
    """The fastest epoch's samples/s after the warm-up (None when no epoch is left)."""
    timed = [r["samples_per_second"] for r in rows[warmup_epochs:]]
    return max(timed) if timed else None


def build_parser() -> argparse.ArgumentParser:
    from app.core import settings

    p = argparse.ArgumentParser(prog="input_rate (a child process of tfmp benchmark)",
                                description=__doc__.splitlines()[0])
    # The settings the benchmark passes to its runs (those that change the data matter
    # here; the rest are accepted and ignored).
    for s in settings.PASSED:
        if s.switch:
            p.add_argument(s.flag, dest=s.name, action="store_true", default=None)
        else:
            p.add_argument(s.flag, dest=s.name, type=s.parse, default=None)
    p.add_argument("--warmup-epochs", type=int, default=1)
    p.add_argument("--output", required=True)
    return p


def hidden_widths(model, num_classes: Optional[int]) -> List[int]:
    """Dense/RNN units, Conv filters and Embedding sizes, in layer order, the output layer
    (the last width, when it is the class count) left out: its width is the task's."""
    try:
        layers = list(model._flatten_layers(include_self=False, recursive=True))
    except (AttributeError, TypeError):
        layers = list(getattr(model, "layers", []))
    widths = []
    for layer in layers:
        for attr in ("units", "filters", "output_dim"):
            w = getattr(layer, attr, None)
            if isinstance(w, int) and not isinstance(w, bool):
                widths.append(w)
                break
    if widths and num_classes is not None and widths[-1] in (num_classes, 1):
        widths = widths[:-1]
    return widths


def _epoch_counter(dataset):
    import tensorflow as tf

    def add(n, batch):
        first = tf.nest.flatten(batch)[0]
        return n + tf.cast(tf.shape(first)[0], tf.int64)

    @tf.function
    def one_epoch():
        # A new iterator per call: reshuffled like every training epoch.
        return dataset.reduce(tf.constant(0, tf.int64), add)
    return one_epoch


def measure(args) -> Dict[str, Any]:
    from app.precision import policy as prec
    from app.training.config import resolve_config
    from app.training.job import prepare

    flags = {k: v for k, v in vars(args).items() if k not in ("warmup_epochs",)}
    flags["precision"] = "float32"
    cfg = resolve_config(flags, use_tuned=False)   # the benchmark gives every value itself
    run = prepare(cfg)
    task, bundle, dist = run.task, run.bundle, run.dist
    one_epoch = _epoch_counter(bundle.train)
    rows = []
    for epoch in range(max(cfg.epochs, args.warmup_epochs + MIN_TIMED_EPOCHS)):
        t0 = time.perf_counter()
        samples = int(one_epoch())
        seconds = time.perf_counter() - t0
        rows.append({"epoch": epoch + 1, "samples": samples, "seconds": round(seconds, 4),
                     "samples_per_second": round(samples / max(seconds, 1e-9), 2)})
    result: Dict[str, Any] = {
        "samples_per_second": pipeline_rate(rows, args.warmup_epochs),
        "epochs": rows, "epochs_excluded": args.warmup_epochs,
        "global_batch": dist.global_batch, "train_samples": bundle.train_samples,
        "how": "the training batches of `tfmp train` with the same settings, "
               "iterated in a tf.function with no model (Dataset.reduce), one process",
        "layer_widths": None, "layer_widths_note": None,
    }
    if not task.model.builtin:
        # Cheap next to the runs: one build under float32, no step.
        try:
            prec.apply_policy("float32")
            built = task.build(bundle, bundle.sample_batch)
            result["layer_widths"] = hidden_widths(built.model, bundle.num_classes)
        except Exception as exc:  # reported, not fatal: the training runs will show the bug
            result["layer_widths_note"] = (f"the model could not be built for the check "
                                           f"({type(exc).__name__}: {str(exc)[:200]})")
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from app.core.errors import UsageError, UserCodeError, report
    from app.core.exit_codes import EXIT_OK

    args = build_parser().parse_args(argv)
    try:
        result = measure(args)
    except (UsageError, UserCodeError) as exc:
        return report(exc)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
