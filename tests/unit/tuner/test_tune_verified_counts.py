"""``tune --global-batch``'s verification says what ran: under ``--accumulate 128`` a run of
8,208 samples at batch 32 is 3 updates of 257 micro-batches, not "10 steps" (the steps asked
for, which ``verified.steps`` keeps); tune.json's ``verified`` records ``samples``,
``micro_batches`` and ``updates`` from the run's metrics.json."""
from __future__ import annotations

import os

from app.tuner import report, runner
from app.tuner import tuning as api
from app.tuner.search import Outcome

MIB = 2**20


def _verification_metrics(samples, batch, updates):
    """The parts of a finished ``tfmp train``'s metrics.json the tuner reads."""
    return {"status": "completed", "peak_memory": {"bytes": 300 * MIB},
            "config": {"batch_size": batch}, "data": {"train_samples": samples},
            "accumulation": {"micro_batch": batch, "accumulate": 128,
                             "global_batch": batch * 128},
            "epochs": [{"epoch": 1, "steps": updates, "samples_per_second": 900.0}]}


def _ended(tmp_path, metrics):
    log = tmp_path / "v.log"
    log.write_text("$ tfmp train ...\n")
    return runner.ChildEnd(0, metrics, False, 0, 1.0, str(log), False)


def test_the_verification_outcome_says_what_the_run_trained(tmp_path):
    # 32 x 256 + 16 samples: 256 whole micro-batches and a short one; groups of 128: 3 updates
    out = runner.verification_outcome(_ended(tmp_path, _verification_metrics(8208, 32, 3)),
                                      None)
    assert out.completed
    assert out.ran == {"samples": 8208, "micro_batches": 257, "updates": 3}
    assert runner.verification_batches(10, 128) == 256 and runner.verification_batches(10) == 10
    assert report.ran_words(10, out.ran) == "3 update(s) (257 micro-batches)"
    assert report.ran_words(10, {"samples": 336, "micro_batches": 11, "updates": 11}) == \
        "11 steps"
    assert report.ran_words(10, None) == "10 steps"             # a run that did not say


class CountingRunner:
    """Fake trials: 8..32 fit; the verification's outcome is what ``verification_outcome``
    makes of a real run's metrics.json."""

    def __init__(self, base_request, workdir, *, kill_above, timeout=None):
        self.workdir = workdir

    def __call__(self, policy, batch_size, any_fit, phase="search", **overrides):
        with open(os.path.join(self.workdir, f"{policy}-{batch_size}-{phase}.log"), "w",
                  encoding="utf-8") as fh:
            fh.write("fake\n")
        if batch_size > 32:
            return Outcome(False, None, None, "resident memory passed the budget", 0.1)
        return Outcome(True, 100 * MIB + batch_size * MIB, 100.0 * batch_size, "", 0.1)

    def verify(self, policy, batch_size, steps, accumulate=1):
        whole = max(steps, 2 * accumulate) if accumulate > 1 else steps   # whole groups
        samples = batch_size * whole + batch_size // 2
        micro = -(-samples // batch_size)
        metrics = _verification_metrics(samples, batch_size, -(-micro // accumulate))
        log = os.path.join(self.workdir, "verify.log")
        with open(log, "w", encoding="utf-8") as fh:
            fh.write("fake\n")
        return runner.verification_outcome(runner.ChildEnd(0, metrics, False, 0, 1.0, log,
                                                           False), None)


def test_tune_records_and_says_the_updates_and_micro_batches_verified(tmp_path, monkeypatch):
    monkeypatch.setattr(api, "TrialRunner", CountingRunner)
    monkeypatch.setattr(api, "collect_environment", lambda: {
        "hardware": {"gpus": []}, "auto_precision": {"policy": "float32"}})
    monkeypatch.delenv("TFMP_BATCH_SIZE", raising=False)
    doc = api.tune("mlp", "synthetic", precision="float32", memory_budget="1GiB", max_batch=64,
                   progress=False, output=str(tmp_path / "t"), global_batch=4096)
    v = doc["verified"]
    assert v["fits"] and (v["batch_size"], v["accumulate"]) == (32, 128)
    assert v["steps"] == 10                                     # the steps asked for, as before
    assert (v["samples"], v["micro_batches"], v["updates"]) == (8208, 257, 3)
    line = [ln for ln in report.table(doc).splitlines() if ln.startswith("choice:")][0]
    assert "verified over 3 update(s) (257 micro-batches) at" in line, line
    assert "10 steps" not in line
