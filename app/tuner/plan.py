"""``tfmp tune --global-batch B``: the micro-batch and the accumulation N (B = micro x N)
that reach a global batch B fastest within the budget.  Pure logic, as ``search``: no
process, no TensorFlow; ``app.tuner.tuning`` runs the trials.

The candidates are micro-batches that divide B and fit: the sizes the search found to fit,
and the largest multiple of 8 dividing B up to the largest size that fitted (the search
may not have tried it).  Each candidate is measured again *with* accumulation (a trial
times whole groups, the update included): a larger micro-batch is usually faster per
sample, but not always, and the sums and the update cost something.  The fastest measured
plan wins; within ``SPEED_TIE`` of it, the larger micro-batch (fewer, larger steps).
"""
from __future__ import annotations

from typing import List, Optional

from app.core.errors import UsageError
from app.tuner.search import SPEED_TIE, STEP, Trial

MAX_PLAN_TRIALS = 3   # candidates measured with accumulation, per precision


def check_global_batch(value) -> Optional[int]:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < STEP or value % STEP:
        raise UsageError(f"global_batch must be a multiple of {STEP} (the tune's batch sizes "
                         f"are). Received: global_batch={value!r}",
                         f"a multiple of {STEP}, e.g. {max(STEP, (int(value) // STEP) * STEP) if isinstance(value, int) else 1024}")
    return value


def candidates(trials: List[Trial], global_batch: int) -> List[int]:
    """Micro-batch sizes to measure: fitting, dividing ``global_batch``, at most
    ``MAX_PLAN_TRIALS``; the largest first (usually the fastest), then by plain speed."""
    fitting = [t for t in trials if t.fits and t.samples_per_second]
    if not fitting:
        return []
    largest_fit = max(t.batch_size for t in fitting)
    sizes = {t.batch_size for t in fitting if global_batch % t.batch_size == 0}
    top = largest_divisor(global_batch, largest_fit)
    if top is not None:
        sizes.add(top)
    speed = {t.batch_size: t.samples_per_second for t in fitting}
    ordered = sorted(sizes, key=lambda b: (b != max(sizes), -(speed.get(b) or 0.0), -b))
    return ordered[:MAX_PLAN_TRIALS]


def largest_divisor(global_batch: int, most: int) -> Optional[int]:
    """The largest multiple of STEP that divides ``global_batch`` and is at most ``most``."""
    for b in range(min(most, global_batch) // STEP * STEP, 0, -STEP):
        if global_batch % b == 0:
            return b
    return None


def best(measured: List[Trial], tie: float = SPEED_TIE) -> Optional[Trial]:
    """The fastest fitting plan trial; within ``tie`` of it, the largest micro-batch."""
    fitting = [t for t in measured if t.fits and t.samples_per_second]
    if not fitting:
        return None
    top = max(t.samples_per_second for t in fitting)
    return max((t for t in fitting if t.samples_per_second >= top * (1.0 - tie)),
               key=lambda t: t.batch_size)


def entry(global_batch: int, measured: List[Trial]) -> dict:
    """tune.json's plan of one precision."""
    chosen = best(measured)
    return {"micro_batch": chosen.batch_size if chosen else None,
            "accumulate": global_batch // chosen.batch_size if chosen else None,
            "samples_per_second": chosen.samples_per_second if chosen else None,
            "trials": [dict(t.to_dict(), accumulate=global_batch // t.batch_size)
                       for t in measured]}
