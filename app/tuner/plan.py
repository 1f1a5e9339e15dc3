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
from app.tuner.search import (SPEED_TIE, STEP, Trial, best_batch, choose, judge,
                               step_down_order)

MAX_PLAN_TRIALS = 3   # candidates measured with accumulation, per precision


def check_global_batch(value) -> Optional[int]:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < STEP or value % STEP:
        near = max(STEP, value // STEP * STEP) if isinstance(value, int) else 1024
        raise UsageError(f"global_batch must be a multiple of {STEP} (the tune's batch sizes "
                         f"are). Received: global_batch={value!r}",
                         f"a multiple of {STEP}, e.g. {near}")
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
    return best_batch(measured, tie, largest=True)


def entry(global_batch: int, measured: List[Trial]) -> dict:
    """tune.json's plan of one precision."""
    chosen = best(measured)
    return {"micro_batch": chosen.batch_size if chosen else None,
            "accumulate": global_batch // chosen.batch_size if chosen else None,
            "samples_per_second": chosen.samples_per_second if chosen else None,
            "trials": [dict(t.to_dict(), accumulate=global_batch // t.batch_size)
                       for t in measured]}


def measure(results, runner, bar, limit: int, global_batch: int, plans: dict, notes: list):
    """Each precision's candidates measured with accumulation (``runner``: the tune's trial
    runner, phase "plan"); fills ``plans`` (``entry`` by policy).  Returns (the fastest
    precision, each precision's plans as (micro-batch, N, samples/s): its best first, then
    the smaller ones that fitted: the verification's step-downs)."""
    measured_by = {}
    for policy, r in results.items():
        measured = []
        for micro in candidates(r.trials, global_batch):
            bar.start(policy, micro, phase="plan")
            t = judge(micro, runner(policy, micro, any_fit=True, phase="plan",
                                    accumulate=global_batch // micro), limit)
            t.phase = "plan"
            bar.finish(policy, t)
            measured.append(t)
        plans[policy] = entry(global_batch, measured)
        measured_by[policy] = measured
    picked = choose({p: best(m) for p, m in measured_by.items()})
    if picked is None:
        raise UsageError(f"no micro-batch that divides the global batch {global_batch} fits "
                         "under any precision", "a --global-batch that a fitting size divides "
                         "(a multiple of 8), or a larger --memory-budget")
    policy, top = picked
    notes.append(f"global batch {global_batch}: {policy} at micro-batch {top.batch_size} x "
                 f"{global_batch // top.batch_size} measured fastest")

    def plans_of(p: str) -> list:
        first = best(measured_by[p])
        return [] if first is None else [
            (t.batch_size, global_batch // t.batch_size, t.samples_per_second)
            for t in step_down_order(measured_by[p], first)]
    return policy, {p: plans_of(p) for p in measured_by}
