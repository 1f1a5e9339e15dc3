"""The search for the largest batch that fits, and the choice of the fastest: pure logic.

Nothing here starts a process or imports TensorFlow: ``find_max_batch`` drives a trial
function (``batch_size -> Outcome``) that the caller provides (a child process in
``app.tuner.runner``; a fake in the unit tests), so the boundary logic is tested exactly.

Rules (issue 16, and what other tuners' users complained about):

* sizes are multiples of 8 (Tensor Core tiles, and a grid fine enough for memory);
* doubling from ``start`` (16; halving towards 8 when it does not fit) until a size does not
  fit or the cap is reached, then the bracket [last fit, first misfit] is narrowed until the
  two are 8 apart;
* "fits" means the trial ran *and* its peak stayed within ``budget x (1 - margin)``;
* every size reported was run: ``max_batch`` is always a trial that fitted;
* a time budget ends the search with the best size found so far;
* the training set bounds the batch to a tenth of it (``updates_limit``), so that an epoch
  is at least ``MIN_UPDATES_PER_EPOCH`` updates.

Narrowing the bracket: peak memory grows almost linearly with the batch (the activations),
so the next size is where the memory line crosses the limit (rounded down to a multiple of
8): the line through the bracket's two peaks, or, when the size above was killed before it
finished (its peak is only a lower bound), the line through the two largest fits.  With
near-linear memory that is the boundary, and the next trial 8 above it confirms it.  When a peak is unknown (a child killed before it
could report), or two steps in a row did not halve the bracket (memory that is not linear),
the next size is the midpoint, so the search never does much worse than plain bisection.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional

from app.core.catalog import MIN_UPDATES_PER_EPOCH

STEP = 8                 # every batch size is a multiple of this
# 16, not 8: a trial costs a process start; 8 is tried only when 16 does not fit.
DEFAULT_START = 16
DEFAULT_CAP = 4096
# Sizes whose speed is within this fraction of the fastest count as equally fast; the
# smallest of them is the best batch (less memory, the optimisation closer to what the model
# was tuned for, and a 2-3 % difference is below one trial's measurement noise).
SPEED_TIE = 0.03


@dataclass
class Outcome:
    """What one trial measured.  ``completed``: the steps ran to the end (whether or not the
    peak is within the limit is the search's decision).  ``peak_memory_bytes`` may be known
    even when not completed (the highest resident memory seen before the child was killed)."""
    completed: bool
    peak_memory_bytes: Optional[int] = None
    samples_per_second: Optional[float] = None
    reason: str = ""                 # why it did not complete ("" when it did)
    seconds: Optional[float] = None  # wall time of the trial, process start included
    data_limit: Optional[int] = None  # the training set's size, when it bounds the batch
    # a verification run's: what it trained (samples, micro_batches, updates), from its
    # metrics.json; None for a trial, or when the run did not say
    ran: Optional[dict] = None


@dataclass
class Trial:
    """One row of tune.json's ``trials``."""
    batch_size: int
    fits: bool
    peak_memory_bytes: Optional[int]
    samples_per_second: Optional[float]
    reason: str
    seconds: Optional[float] = None
    phase: str = "search"            # search | verify
    # The steps ran to the end.  A trial stopped early (killed past the budget) has at most
    # a lower bound of its peak, which must not be read as the peak of that size.
    completed: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SearchResult:
    trials: List[Trial] = field(default_factory=list)
    max_batch: Optional[int] = None
    stopped: str = "boundary"        # boundary | cap | data | time
    cap: int = DEFAULT_CAP
    train_samples: Optional[int] = None   # the training set's size, once a trial loaded it

    @property
    def fitting(self) -> List[Trial]:
        return [t for t in self.trials if t.fits]

    def smallest_tried(self) -> Optional[Trial]:
        return min(self.trials, key=lambda t: t.batch_size) if self.trials else None

    def best(self) -> Optional[Trial]:
        """``best_batch`` of the sizes within the cap (a first trial may have run above the
        limit the training set then set)."""
        return best_batch([t for t in self.trials if t.batch_size <= self.cap])


def round_down(n: float) -> int:
    """The largest multiple of STEP not above ``n`` (at least 0)."""
    return max(0, int(math.floor(n / STEP)) * STEP)


def updates_limit(train_samples: int) -> int:
    """The largest batch (a multiple of STEP, at least STEP) that leaves an epoch of
    ``train_samples`` at least MIN_UPDATES_PER_EPOCH updates."""
    return max(STEP, round_down(train_samples / MIN_UPDATES_PER_EPOCH))


def memory_limit(budget_bytes: int, margin: float) -> int:
    """The most a trial may peak at: the budget less the margin."""
    return int(budget_bytes * (1.0 - margin))


def judge(batch_size: int, outcome: Outcome, limit: int) -> Trial:
    """An outcome as a trial row: fits only when it completed within ``limit``."""
    peak = outcome.peak_memory_bytes
    if not outcome.completed:
        fits, reason = False, outcome.reason or "did not complete"
    elif peak is None:
        fits, reason = False, "no peak memory reported"
    elif peak > limit:
        fits, reason = False, (f"peak {_mib(peak)} is above the budget less the margin "
                               f"({_mib(limit)})")
    else:
        fits, reason = True, "fits"
    return Trial(batch_size, fits, peak, outcome.samples_per_second if outcome.completed else None,
                 reason, outcome.seconds, completed=outcome.completed)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def next_size(lo: Trial, hi: Trial, limit: int, misses: int = 0,
              below: Optional[Trial] = None) -> int:
    """A multiple of STEP strictly between ``lo`` (fits) and ``hi`` (does not).

    Where the memory line meets ``limit``: the line through the two peaks of the bracket
    when ``hi`` ran to the end, else the line through ``lo`` and ``below`` (the fit before
    it), extended.  The midpoint when neither line exists, or after two steps in a row that
    did not halve the bracket (``misses``: memory that is not linear in the batch)."""
    low, high = lo.batch_size + STEP, hi.batch_size - STEP
    mid = min(max(round_down((lo.batch_size + hi.batch_size) / 2), low), high)
    if misses >= 2 or lo.peak_memory_bytes is None:
        return mid
    if hi.completed and hi.peak_memory_bytes is not None and hi.peak_memory_bytes > lo.peak_memory_bytes:
        other = hi
    elif (below is not None and below.peak_memory_bytes is not None
          and below.peak_memory_bytes < lo.peak_memory_bytes):
        other = below
    else:
        return mid
    per_sample = ((other.peak_memory_bytes - lo.peak_memory_bytes)
                  / (other.batch_size - lo.batch_size))
    guess = round_down(lo.batch_size + (limit - lo.peak_memory_bytes) / per_sample)
    return min(max(guess, low), high)


def find_max_batch(run_trial: Callable[[int], Outcome], *, budget_bytes: int, margin: float,
                   cap: int = DEFAULT_CAP, start: int = DEFAULT_START,
                   deadline: Optional[float] = None,
                   clock: Callable[[], float] = time.monotonic,
                   on_trial: Callable[[Trial], None] = lambda t: None) -> SearchResult:
    """Doubling from ``start``, then narrowing the bracket; see the module docstring.

    ``deadline`` is a ``clock()`` value: no trial starts after it.  ``on_trial`` sees each
    trial as it is judged (the progress bar)."""
    limit = memory_limit(budget_bytes, margin)
    result = SearchResult(cap=round_down(cap))
    if result.cap < STEP:
        raise ValueError(f"cap {cap} is below {STEP}")

    def out_of_time() -> bool:
        if deadline is not None and clock() >= deadline:
            result.stopped = "time"
            return True
        return False

    def probe(batch: int) -> Trial:
        outcome = run_trial(batch)
        if outcome.data_limit is not None:
            result.train_samples = outcome.data_limit
            result.cap = min(result.cap, updates_limit(outcome.data_limit))
        trial = judge(batch, outcome, limit)
        result.trials.append(trial)
        on_trial(trial)
        return trial

    lo: Optional[Trial] = None
    hi: Optional[Trial] = None
    batch = min(round_down(start) or STEP, result.cap)
    while not out_of_time():
        trial = probe(batch)
        if batch > result.cap:
            # The training set, not memory, rules this size out (its size was unknown
            # until a trial loaded it): go on at the data's own limit.
            batch = result.cap
            continue
        if trial.fits:
            lo = trial
            if hi is not None:          # came down from a start that did not fit
                break
            if batch >= result.cap:
                result.stopped = "data" if result.cap < round_down(cap) else "cap"
                break
            batch = min(batch * 2, result.cap)
        else:
            hi = trial
            if lo is not None or batch <= STEP:
                break
            batch = max(STEP, round_down(batch / 2))   # the start did not fit: halve
    misses = 0
    while lo is not None and hi is not None and hi.batch_size - lo.batch_size > STEP:
        if out_of_time():
            break
        width = hi.batch_size - lo.batch_size
        below = max((t for t in result.trials if t.fits and t.batch_size < lo.batch_size),
                    key=lambda t: t.batch_size, default=None)
        trial = probe(next_size(lo, hi, limit, misses, below))
        if trial.fits:
            lo = trial
        else:
            hi = trial
        misses = misses + 1 if (hi.batch_size - lo.batch_size) > width / 2 else 0
    result.max_batch = lo.batch_size if lo is not None else None
    return result


def step_down_order(trials: List[Trial], top: Trial) -> List[Trial]:
    """The verification's order within one precision: ``top``'s size first, then the smaller
    sizes that fitted, largest first; one trial a size, the first run of it."""
    first: Dict[int, Trial] = {}
    for t in trials:
        if t.fits and t.batch_size <= top.batch_size:
            first.setdefault(t.batch_size, t)
    return [first[b] for b in sorted(first, reverse=True)]


def best_batch(trials: List[Trial], tie: float = SPEED_TIE,
               largest: bool = False) -> Optional[Trial]:
    """The fastest fitting trial; among those within ``tie`` of it, the smallest batch (the
    ``largest`` with ``largest``: a plan's micro-batch, fewer and larger steps)."""
    fitting = [t for t in trials if t.fits and t.samples_per_second]
    if not fitting:
        return None
    top = max(t.samples_per_second for t in fitting)
    pick = max if largest else min
    return pick((t for t in fitting if t.samples_per_second >= top * (1.0 - tie)),
                key=lambda t: t.batch_size)


def choose(best: Dict[str, Optional[Trial]]) -> Optional[tuple]:
    """(policy, trial): the fastest precision at its own best batch; the first listed
    wins an exact tie.  None when no precision has a fitting trial."""
    candidates = [(p, t) for p, t in best.items() if t is not None]
    if not candidates:
        return None
    return max(candidates, key=lambda pt: pt[1].samples_per_second)


# Peaks closer than this tell no slope: on a CPU the same size's peak resident memory varies
# by a few tens of MiB from run to run (docs/tune.md).
PEAK_NOISE_BYTES = 32 * 2**20


def memory_per_sample(trials: List[Trial]) -> Optional[float]:
    """Bytes of peak memory each extra sample costs: the least-squares slope of peak against
    batch over the trials that fitted (the fixed part, runtime and weights, drops out).
    None when the line grows less than PEAK_NOISE_BYTES over the sizes tried: a small model's
    samples cost less than the noise (a tune measured -5.9 KiB a sample)."""
    points = [(t.batch_size, t.peak_memory_bytes) for t in trials
              if t.fits and t.peak_memory_bytes is not None]
    if len({b for b, _ in points}) < 2:
        return None
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mp = sum(p for _, p in points) / n
    var = sum((b - mb) ** 2 for b, _ in points)
    slope = sum((b - mb) * (p - mp) for b, p in points) / var
    span = max(b for b, _ in points) - min(b for b, _ in points)
    return slope if slope * span >= PEAK_NOISE_BYTES else None


def max_trials(cap: int, start: int = DEFAULT_START) -> int:
    """The trial count the issue allows per precision: log2(cap / 8) + 4."""
    return int(math.log2(max(cap, STEP) / STEP)) + 4
