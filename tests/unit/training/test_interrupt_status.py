"""What a run interrupted by Ctrl-C leaves in metrics.json when a second Ctrl-C follows the
first at once (``kill -INT $P; sleep 0.05; kill -INT $P``): the first is answered with a
checkpoint and the line announcing it; the second ends the process then and there.  A QA
pass found metrics.json still at ``"status": "running"`` beside the checkpoint announced:
the status was written after the line.  Real training in a subprocess, as
tests/unit/training/test_interrupts.py signals its runs."""
from __future__ import annotations

import json
import signal
import time

from tests.unit.training_process import TrainingProcess

TRAIN = ["train", "--dataset", "synthetic", "--max-train-samples", "20000",
         "--max-val-samples", "256", "--batch-size", "32", "--precision", "float32",
         "--epochs", "3", "--offline", "--no-save-model", "--progress", "lines",
         "--log-every", "50"]
ANNOUNCED = "interrupted: checkpoint "


def _announced(run: TrainingProcess, timeout: float = 120) -> None:
    """Block until the run's stderr holds the line announcing the saved checkpoint."""
    deadline = time.monotonic() + timeout
    while not any(line.startswith(ANNOUNCED) for line in list(run.stderr)):
        assert run.proc.poll() is None or any(
            line.startswith(ANNOUNCED) for line in list(run.stderr)), \
            "the run ended before it announced a checkpoint:\n" + run._output()
        assert time.monotonic() < deadline, "no checkpoint announced:\n" + run._output()
        time.sleep(0.0005)


def test_a_second_ctrl_c_right_after_the_announced_checkpoint_leaves_interrupted(tmp_path):
    """The second SIGINT is sent the moment the line is read: the process ends with 130 at
    once, and metrics.json already says ``interrupted`` (with the signal), never
    ``running``, beside the checkpoint the line named."""
    out = tmp_path / "run"
    with TrainingProcess([*TRAIN, "--output", str(out)]) as run:
        run.wait_inside_epoch(1)
        run.send(signal.SIGINT)
        _announced(run)
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGINT)
        code, _, err = run.finish()
    assert code in (0, 130), err[-3000:]
    [line] = [ln for ln in err.splitlines() if ln.startswith(ANNOUNCED)]
    path = line[len(ANNOUNCED):].split(" saved", 1)[0]
    assert (out / "checkpoints").is_dir() and path.startswith(str(out / "checkpoints")), line
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "interrupted", (metrics["status"], err[-3000:])
    assert metrics["signal"] == signal.SIGINT and metrics.get("finished_utc"), metrics


def test_ctrl_c_twice_50_ms_apart_never_leaves_running_beside_an_announced_checkpoint(tmp_path):
    """The QA pass's own sequence: ``kill -INT $P; sleep 0.05; kill -INT $P``.  Whichever
    way it falls (the second signal during the save: no checkpoint announced; after it),
    a checkpoint announced means metrics.json says ``interrupted``."""
    out = tmp_path / "run"
    with TrainingProcess([*TRAIN, "--output", str(out)]) as run:
        run.wait_inside_epoch(1)
        run.send(signal.SIGINT)
        time.sleep(0.05)
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGINT)
        code, _, err = run.finish()
    assert code in (0, 130), err[-3000:]
    if any(ln.startswith(ANNOUNCED) for ln in err.splitlines()):
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["status"] == "interrupted", (metrics["status"], err[-3000:])
