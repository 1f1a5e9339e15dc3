"""The tuner's search and choice on fake trial functions: exact boundaries in multiples of 8,
only sizes that ran are reported, cap, margin, nothing fits, time budget (issue 16)."""
from __future__ import annotations

import itertools

import pytest

from app.tuner import search
from app.tuner.search import Outcome, Trial

MIB = 2**20


def linear(base_mib: float, per_sample_mib: float, kill_above=None, sps=None):
    """A fake trial: peak = base + per_sample x batch; with ``kill_above``, sizes whose peak
    passes it die without completing (the watchdog or the OOM killer)."""
    calls = []

    def trial(batch):
        calls.append(batch)
        peak = int((base_mib + per_sample_mib * batch) * MIB)
        if kill_above is not None and peak > kill_above:
            return Outcome(False, None, None, "killed by SIGKILL", 1.0)
        return Outcome(True, peak, sps(batch) if sps else 1000.0 + batch, "", 1.0)
    trial.calls = calls
    return trial


def expected_max(base_mib, per_sample_mib, limit_bytes, cap):
    """Brute force: the largest multiple of 8 up to the cap whose peak is within the limit."""
    fits = [b for b in range(8, cap + 1, 8)
            if int((base_mib + per_sample_mib * b) * MIB) <= limit_bytes]
    return max(fits) if fits else None


@pytest.mark.parametrize("base,per,budget_mib,margin", [
    (600, 2.1, 2048, 0.1), (600, 1.6, 2048, 0.1), (100, 0.37, 1000, 0.0),
    (50, 7.3, 300, 0.25), (400, 0.01, 2048, 0.1), (10, 0.9, 33, 0.0),
])
def test_boundary_is_exact_in_multiples_of_8(base, per, budget_mib, margin):
    trial = linear(base, per)
    r = search.find_max_batch(trial, budget_bytes=budget_mib * MIB, margin=margin, cap=4096)
    limit = search.memory_limit(budget_mib * MIB, margin)
    assert r.max_batch == expected_max(base, per, limit, 4096)
    assert all(b % 8 == 0 for b in trial.calls)
    if r.max_batch is not None and r.max_batch < 4096:
        # the size 8 above the boundary was run and did not fit
        above = [t for t in r.trials if t.batch_size == r.max_batch + 8]
        assert above and not above[0].fits


@pytest.mark.parametrize("base,per", list(itertools.product([200, 650], [0.3, 1.1, 2.1, 5.0])))
def test_trials_per_precision_within_log2_cap_over_8_plus_4(base, per):
    trial = linear(base, per)
    r = search.find_max_batch(trial, budget_bytes=2048 * MIB, margin=0.1, cap=4096)
    assert len(r.trials) <= search.max_trials(4096)


def test_every_reported_size_was_run_and_max_batch_fitted():
    trial = linear(300, 1.7)
    r = search.find_max_batch(trial, budget_bytes=1500 * MIB, margin=0.1)
    assert [t.batch_size for t in r.trials] == trial.calls
    assert len(set(trial.calls)) == len(trial.calls)          # nothing run twice
    best = [t for t in r.trials if t.batch_size == r.max_batch]
    assert best and best[0].fits
    assert search.best_batch(r.trials).batch_size in trial.calls


def test_doubling_then_bracketing_from_16():
    trial = linear(0, 1.0)           # 1 MiB a sample; limit 100 MiB -> boundary 96
    r = search.find_max_batch(trial, budget_bytes=100 * MIB, margin=0.0)
    assert trial.calls[:4] == [16, 32, 64, 128]
    assert r.max_batch == 96 and 104 in trial.calls


@pytest.mark.parametrize("per,expected,calls", [(7.0, 8, [16, 8]), (5.0, 16, [16, 32, 24])])
def test_a_start_that_does_not_fit_halves_to_8(per, expected, calls):
    trial = linear(0, per)           # limit 100 MiB: 8 fits at 7 MiB a sample, 16 does not
    r = search.find_max_batch(trial, budget_bytes=100 * MIB, margin=0.0)
    assert r.max_batch == expected and trial.calls == calls


def test_killed_trials_without_a_peak_still_give_the_exact_boundary():
    budget = 1000 * MIB
    # Sizes past the limit die before reporting a peak: the bracket's top has none.
    trial = linear(100, 3.3, kill_above=search.memory_limit(budget, 0.1))
    r = search.find_max_batch(trial, budget_bytes=budget, margin=0.1)
    assert r.max_batch == expected_max(100, 3.3, search.memory_limit(budget, 0.1), 4096)
    dead = [t for t in r.trials if "SIGKILL" in t.reason]
    assert dead and not any(t.fits for t in dead)


def test_a_non_linear_memory_curve_falls_back_to_bisection_and_stays_exact():
    calls = []

    def step_curve(batch):        # flat, then a cliff at 200: interpolation is useless
        calls.append(batch)
        return Outcome(True, (100 if batch <= 200 else 5000) * MIB, 1.0, "", 1.0)
    r = search.find_max_batch(step_curve, budget_bytes=1000 * MIB, margin=0.0)
    assert r.max_batch == 200
    assert len(calls) <= 2 * search.max_trials(4096)


def test_cap_is_honoured_and_says_so():
    trial = linear(10, 0.001)
    r = search.find_max_batch(trial, budget_bytes=2048 * MIB, margin=0.1, cap=1000)
    assert r.max_batch == 1000 and r.stopped == "cap"
    assert max(trial.calls) == 1000 and trial.calls[-2] == 512
    r = search.find_max_batch(linear(10, 0.001), budget_bytes=2048 * MIB, margin=0.1, cap=8)
    assert r.max_batch == 8 and [t.batch_size for t in r.trials] == [8]


def test_margin_is_honoured():
    # peak at batch b: 100 + b MiB; budget 1000 MiB: margin 0 -> 896, margin 0.2 -> 696
    for margin, expected in ((0.0, 896), (0.2, 696)):
        r = search.find_max_batch(linear(100, 1.0), budget_bytes=1000 * MIB, margin=margin)
        assert r.max_batch == expected
        over = [t for t in r.trials if not t.fits]
        assert all("above the budget less the margin" in t.reason for t in over)
        assert all(t.peak_memory_bytes <= search.memory_limit(1000 * MIB, margin)
                   for t in r.trials if t.fits)


def test_nothing_fits():
    trial = linear(900, 1.0)
    r = search.find_max_batch(trial, budget_bytes=900 * MIB, margin=0.1)
    assert r.max_batch is None and trial.calls == [16, 8]
    assert r.smallest_tried().batch_size == 8 and r.smallest_tried().peak_memory_bytes


def test_time_budget_ends_the_search_with_the_best_so_far():
    now = [0.0]

    def slow(batch):
        now[0] += 10.0
        return Outcome(True, int((100 + batch) * MIB), 1.0, "", 10.0)
    r = search.find_max_batch(slow, budget_bytes=100_000 * MIB, margin=0.1, deadline=35.0,
                              clock=lambda: now[0])
    assert r.stopped == "time"
    assert [t.batch_size for t in r.trials] == [16, 32, 64, 128]
    assert r.max_batch == 128


def test_time_budget_during_bracketing_keeps_the_last_fit():
    now = [0.0]
    inner = linear(0, 1.0)

    def timed(batch):
        now[0] += 1.0
        return inner(batch)
    r = search.find_max_batch(timed, budget_bytes=300 * MIB, margin=0.0, deadline=7.0,
                              clock=lambda: now[0])
    assert r.stopped == "time" and r.max_batch is not None
    assert r.max_batch in [t.batch_size for t in r.trials if t.fits]
    assert r.max_batch <= 296


def _small_data(samples):
    """Every size fits, faster the larger it is; the trial reports the set's size."""
    def trial(batch):
        if batch > samples:
            return Outcome(False, None, None, f"the training set has only {samples} samples",
                           1.0, samples)
        return Outcome(True, int((100 + batch) * MIB), 10.0 * batch, "", 1.0, samples)
    return trial


def test_the_training_set_caps_the_batch_at_a_tenth_of_it():
    """An epoch of at least MIN_UPDATES_PER_EPOCH updates: 1,000 samples cap the search at
    96, though every larger size fits and is faster."""
    r = search.find_max_batch(_small_data(1000), budget_bytes=10_000 * MIB, margin=0.1)
    assert search.MIN_UPDATES_PER_EPOCH == 10
    assert (r.max_batch, r.stopped, r.cap, r.train_samples) == (96, "data", 96, 1000)
    assert [t.batch_size for t in r.trials] == [16, 32, 64, 96]
    assert r.best().batch_size == 96


def test_a_first_trial_above_the_training_sets_limit_is_not_chosen():
    """100 samples: the first trial (16) ran before the set's size was known; the search goes
    on at 8, and 8 is the best batch though 16 measured faster."""
    r = search.find_max_batch(_small_data(100), budget_bytes=10_000 * MIB, margin=0.1)
    assert [t.batch_size for t in r.trials] == [16, 8]
    assert (r.max_batch, r.stopped, r.best().batch_size) == (8, "data", 8)
    assert search.best_batch(r.trials).batch_size == 16   # what the cap keeps out


def test_updates_limit_rounds_down_to_the_tile_and_keeps_one():
    assert [search.updates_limit(n) for n in (0, 79, 80, 1200, 60000)] == [8, 8, 8, 120, 6000]


def test_best_batch_is_the_fastest_and_ties_go_to_the_smaller():
    t = [Trial(8, True, 1, 100.0, "fits"), Trial(16, True, 1, 300.0, "fits"),
         Trial(32, True, 1, 295.0, "fits"), Trial(64, True, 1, 200.0, "fits"),
         Trial(128, False, None, None, "killed")]
    assert search.best_batch(t).batch_size == 16           # 295 is within 3 % of 300
    t[2] = Trial(32, True, 1, 400.0, "fits")
    assert search.best_batch(t).batch_size == 32
    assert search.best_batch([Trial(8, False, None, None, "x")]) is None


def test_choice_is_the_fastest_precision_at_its_own_best_batch():
    best = {"float32": Trial(128, True, 1, 450.0, "fits"),
            "mixed_bfloat16": Trial(256, True, 1, 610.0, "fits")}
    assert search.choose(best)[0] == "mixed_bfloat16"
    best["float32"] = Trial(128, True, 1, 700.0, "fits")
    assert search.choose(best) == ("float32", best["float32"])
    assert search.choose({"float32": None}) is None


def test_memory_per_sample_is_the_slope_without_the_fixed_part():
    trials = [Trial(b, True, int((650 + 2.1 * b) * MIB), 1.0, "fits") for b in (8, 16, 32, 64)]
    assert search.memory_per_sample(trials) == pytest.approx(2.1 * MIB)


def test_memory_per_sample_within_the_noise_is_unknown_not_negative():
    """A small model: its peaks differ by run-to-run noise, whose slope was -5.9 KiB."""
    peaks = {16: 340, 32: 339, 64: 341, 128: 339, 120: 338}
    trials = [Trial(b, True, int(p * MIB), 1.0, "fits") for b, p in peaks.items()]
    assert search.memory_per_sample(trials) is None
    trials = [Trial(b, True, int((300 + 0.5 * b) * MIB), 1.0, "fits") for b in (16, 128)]
    assert search.memory_per_sample(trials) == pytest.approx(0.5 * MIB)   # 56 MiB of growth


def test_a_killed_size_above_is_not_read_as_its_peak():
    """The child past the budget is stopped early: its highest resident memory is a lower
    bound, not the size's peak.  The next size comes from the line through the fits."""
    calls = []

    def trial(batch):
        calls.append(batch)
        peak = int((650 + 1.6 * batch) * MIB)
        if peak > 2048 * MIB:     # the watchdog stops it just past the budget
            return Outcome(False, 2049 * MIB, None, "resident memory passed the budget", 1.0)
        return Outcome(True, peak, 100.0, "", 1.0)
    r = search.find_max_batch(trial, budget_bytes=2048 * MIB, margin=0.1)
    assert r.max_batch == expected_max(650, 1.6, search.memory_limit(2048 * MIB, 0.1), 4096)
    assert len(calls) <= 9, calls         # 16..1024 doubling, then the boundary and +8
    assert [t.completed for t in r.trials if t.batch_size == 1024] == [False]


def test_the_note_of_a_search_the_training_set_stopped_counts_the_updates():
    """8 samples at batch 8 is one update an epoch, not "at least 10"."""
    from app.tuner.tuning import data_note

    assert data_note("float32", 1000, 96) == ("float32: the training set (1,000 samples) "
                                              "limits the batch to 96, so that an epoch is at "
                                              "least 10 updates")
    assert data_note("float32", 8, 8) == ("float32: the training set (8 samples) limits the "
                                          "batch to 8, the smallest size tried, so an epoch is "
                                          "1 update(s) where 10 are wanted: more training "
                                          "samples give the search room")
