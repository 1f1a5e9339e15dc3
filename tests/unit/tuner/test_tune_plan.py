"""``tune --global-batch``: the plan (app/tuner/plan.py) and the tune around it on fake
trials (no TensorFlow, no child processes); tests/unit/tuner/test_tune_real.py plans a real
one and trains it with ``train --tuned``."""
from __future__ import annotations

import os

import pytest

from app.core.errors import UsageError
from app.training import tuned
from app.tuner import plan
from app.tuner import tuning as api
from app.tuner.search import Outcome, Trial

MIB = 2**20


def _trial(b, sps, fits=True):
    return Trial(b, fits, 100 * MIB + b * MIB, sps if fits else None, "" if fits else "budget")


def test_candidates_divide_the_global_batch_and_fit():
    trials = [_trial(16, 1000), _trial(32, 1500), _trial(48, 1400), _trial(64, 0, fits=False)]
    # 48 fits but does not divide 96? it does: 96 = 48 x 2; 40 (untried) is not a divisor
    assert plan.candidates(trials, 96) == [48, 32, 16]
    # 128: the largest divisor up to the largest fit (48) is 32; 48 does not divide 128
    assert plan.candidates(trials, 128) == [32, 16]
    assert plan.largest_divisor(120, 48) == 40          # untried sizes are candidates too
    assert plan.candidates([_trial(8, 0, fits=False)], 64) == []


def test_the_fastest_measured_plan_wins_ties_go_to_the_larger_micro_batch():
    assert plan.best([_trial(16, 1000), _trial(32, 1010)]).batch_size == 32   # within 3 %
    assert plan.best([_trial(16, 1200), _trial(32, 1000)]).batch_size == 16   # measured
    entry = plan.entry(64, [_trial(16, 1200), _trial(32, 1000)])
    assert (entry["micro_batch"], entry["accumulate"]) == (16, 4)
    assert [t["accumulate"] for t in entry["trials"]] == [4, 2]


@pytest.mark.parametrize("value", [0, 12, 100, "64", True])
def test_a_global_batch_that_is_not_a_multiple_of_8_is_one_line(value):
    with pytest.raises(UsageError) as info:
        plan.check_global_batch(value)
    assert "global_batch must be a multiple of 8" in info.value.line()


class PlanRunner:
    """Fake trials: 8..32 fit; plain speed grows with the batch, but measured with
    accumulation the micro-batch of 16 is the fastest (so the plan must measure)."""
    calls: list = []

    def __init__(self, base_request, workdir, *, kill_above, timeout=None):
        self.workdir = workdir

    def _log(self, name):
        with open(os.path.join(self.workdir, name + ".log"), "w", encoding="utf-8") as fh:
            fh.write("fake\n")

    def __call__(self, policy, batch_size, any_fit, phase="search", **overrides):
        PlanRunner.calls.append((phase, batch_size, overrides.get("accumulate", 1)))
        self._log(f"{len(PlanRunner.calls):02d}-{batch_size}")
        if batch_size > 32:
            return Outcome(False, None, None, "resident memory passed the budget", 0.1)
        speed = 100.0 * batch_size
        if phase == "plan":
            speed = {32: 2500.0, 16: 3000.0, 8: 700.0}[batch_size]
        return Outcome(True, 100 * MIB + batch_size * MIB, speed, "", 0.1)

    def verify(self, policy, batch_size, steps, accumulate=1):
        PlanRunner.calls.append(("verify", batch_size, accumulate))
        return Outcome(True, 100 * MIB + batch_size * MIB, 2900.0, "", 0.1)


def test_tune_plans_a_global_batch_larger_than_fits(tmp_path, monkeypatch):
    PlanRunner.calls = []
    monkeypatch.setattr(api, "TrialRunner", PlanRunner)
    monkeypatch.setattr(api, "collect_environment", lambda: {
        "hardware": {"gpus": []}, "auto_precision": {"policy": "float32"}})
    monkeypatch.delenv("TFMP_BATCH_SIZE", raising=False)
    doc = api.tune("mlp", "synthetic", precision="float32", memory_budget="1GiB", max_batch=64,
                   progress=False, output=str(tmp_path / "t"), global_batch=128)
    assert doc["precisions"]["float32"]["max_batch"] == 32
    plans = doc["global_batch"]["plans"]["float32"]
    assert (plans["micro_batch"], plans["accumulate"]) == (16, 8)      # measured, not assumed
    # the search fitted 16 and 32 (8 was not needed): both divide 128, both measured
    assert [c for c in PlanRunner.calls if c[0] == "plan"] == [("plan", 32, 4), ("plan", 16, 8)]
    assert ("verify", 16, 8) in PlanRunner.calls
    assert doc["choice"]["accumulate"] == 8 and doc["choice"]["global_batch"] == 128
    t = tuned.read_tuned(str(tmp_path / "t" / "tune.json"), "mlp", "synthetic")
    assert (t.batch_size, t.accumulate) == (16, 8)
    applied = tuned.apply(str(tmp_path / "t"), model="mlp", dataset="synthetic", precision=None,
                          batch_size=None, learning_rate=1e-3, scale_lr="linear",
                          default_batch=128)
    # the learning rate follows the batch an update sees (16 x 8 = 128: unchanged)
    assert (applied.batch_size, applied.accumulate, applied.learning_rate) == (16, 8, 1e-3)
    mine = tuned.apply(str(tmp_path / "t"), model="mlp", dataset="synthetic", precision=None,
                       batch_size=24, learning_rate=1e-3, scale_lr="none", default_batch=128)
    assert mine.accumulate is None and any("not used" in n for n in mine.record["notes"])
