"""Per-run measurements and per-policy medians (pure, no TensorFlow)."""
from __future__ import annotations

import math

import pytest

from app.benchmark import stats


def _metrics(times, sps, acc=0.9, scale=None, skipped=0, loss=0.5, peak=100):
    epochs = [{"loss": loss, "accuracy": acc, "val_loss": loss, "val_accuracy": acc,
               "epoch_seconds": t, "samples_per_second": s, "loss_scale": scale,
               "skipped_steps": skipped} for t, s in zip(times, sps)]
    return {"epochs": epochs, "peak_memory": {"kind": "cpu_rss", "bytes": peak}, "status": "completed"}


def test_spread():
    assert stats.spread([3, 1, 2]) == {"median": 2, "min": 1, "max": 3, "n": 3}
    assert stats.spread([None, float("nan")])["median"] is None


def test_warmup_epoch_is_excluded_from_timing():
    m = stats.measure_run(_metrics([10.0, 1.0, 3.0], [10, 1000, 3000]), warmup_epochs=1)
    assert m["seconds_per_epoch"] == 2.0
    assert m["samples_per_second"] == 2000
    assert m["epochs_timed"] == 2 and m["epochs_total"] == 3


def test_skipped_steps_summed_and_final_scale_taken():
    m = stats.measure_run(_metrics([1, 1], [1, 1], scale=1024.0, skipped=2), 1)
    assert m["skipped_steps"] == 4 and m["loss_scale"] == 1024.0


def test_nonfinite_loss_detected():
    m = stats.measure_run(_metrics([1, 1], [1, 1], loss=float("nan")), 1)
    assert m["nonfinite_loss"] is True


def _run(policy, repeat, sps, acc, peak, ok=True):
    return {"policy": policy, "repeat": repeat, "ok": ok,
            "measured": stats.measure_run(_metrics([9, 1], [1, sps], acc=acc, peak=peak), 1)}


def test_speedup_is_median_of_paired_ratios():
    runs = [_run("float32", 1, 100, 0.90, 1000), _run("mixed_bfloat16", 1, 120, 0.89, 600),
            _run("float32", 2, 200, 0.90, 1000), _run("mixed_bfloat16", 2, 220, 0.88, 600),
            _run("float32", 3, 100, 0.90, 1000), _run("mixed_bfloat16", 3, 150, 0.88, 600)]
    out = stats.summarize(runs, ["float32", "mixed_bfloat16"])
    su = out["mixed_bfloat16"]["speedup_vs_float32"]
    assert su["median"] == pytest.approx(1.2) and su["min"] == pytest.approx(1.1)
    assert su["max"] == pytest.approx(1.5)
    assert out["float32"]["speedup_vs_float32"]["median"] == 1.0
    assert out["mixed_bfloat16"]["memory_ratio_vs_float32"] == pytest.approx(0.6)
    assert out["mixed_bfloat16"]["accuracy_gap_points"] == pytest.approx(-2.0)
    assert out["mixed_bfloat16"]["peak_memory"]["kind"] == "cpu_rss"


def test_failed_runs_counted_not_measured():
    runs = [_run("float32", 1, 100, 0.9, 1), {"policy": "mixed_float16", "repeat": 1, "ok": False}]
    out = stats.summarize(runs, ["float32", "mixed_float16"])
    assert out["mixed_float16"]["runs_ok"] == 0 and out["mixed_float16"]["runs_failed"] == 1
    assert out["mixed_float16"]["speedup_vs_float32"]["median"] is None
    assert not math.isnan(out["float32"]["samples_per_second"]["median"])


@pytest.mark.parametrize("value, text", [
    (72823.4, "72,823"), (100.0, "100"), (99.94, "99.9"), (4.94, "4.94"), (0.5, "0.5"),
    (0.0123, "0.0123"), (None, "nan"), (float("inf"), "nan"),
])
def test_a_rate_for_people_keeps_three_digits_below_100(value, text):
    """A slow pipeline at 0.5 samples/s was printed as "0 samples/s"."""
    assert stats.rate_text(value) == text
