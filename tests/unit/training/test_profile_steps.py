"""``tfmp train --profile-steps A-B``: a trace of those steps where TensorBoard's Profile tab
finds it (``<run>/tensorboard/plugins/profile/<time>/*.xplane.pb``), in both loops; a bad
range is one line, exit 2, nothing written."""
from __future__ import annotations

import pytest

from app.core.settings import parse_step_range
from tests.unit.helpers import ONCE_IN_THE_IMAGE, error_lines, run_app

TINY = ("--model", "mlp", "--dataset", "synthetic", "--epochs", "1", "--batch-size", "32",
        "--max-train-samples", "256", "--max-val-samples", "32", "--precision", "float32",
        "--no-save-model", "--progress", "lines")


@ONCE_IN_THE_IMAGE
@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_profile_of_a_few_cpu_steps_is_written_for_tensorboard(tmp_path, loop):
    out = tmp_path / "run"
    proc = run_app("train", *TINY, "--loop", loop, "--profile-steps", "2-4",
                   "--output", str(out), "--workspace", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    traces = list((out / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert traces and traces[0].stat().st_size > 1000, proc.stderr[-2000:]
    # The Profile tab's step markers (Keras' own per-step trace in fit, ours in the custom
    # loop): the profile spans whole steps.
    assert b"step_num" in traces[0].read_bytes()
    assert "profiling steps 2-4 into" in proc.stderr


@pytest.mark.parametrize("value", ["5-2", "0-3", "a-b", "3-"])
def test_a_bad_range_is_one_line_exit_2_nothing_written(tmp_path, value):
    out = tmp_path / "run"
    proc = run_app("train", *TINY, "--profile-steps", value, "--output", str(out))
    assert proc.returncode == 2
    (line,) = error_lines(proc.stderr)
    assert "--profile-steps must be a range of steps" in line and "allowed: A-B" in line
    assert not out.exists()


def test_a_range_past_the_runs_last_step_is_said_at_the_start(tmp_path):
    """It ran, wrote no profile and said nothing (a QA pass): 256 samples in batches of 32,
    one epoch, are 8 steps."""
    proc = run_app("train", *TINY, "--profile-steps", "500-600", "--output",
                   str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("note: --profile-steps 500-600 begins after this run's last step, 8 (1 epoch(s) "
            "of 8): nothing will be profiled; a range within 1-8 profiles this run"
            ) in proc.stderr, proc.stderr[-2000:]


def test_step_ranges():
    assert parse_step_range("10-15") == (10, 15) and parse_step_range(" 7 ") == (7, 7)
    for bad in ("", "1-2-3", "-1-2", "2-1"):
        with pytest.raises(ValueError):
            parse_step_range(bad)
