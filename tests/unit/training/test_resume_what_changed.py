"""--resume inside an epoch with another accumulation or batch size: the note that the epoch
starts over names what changed.  A QA pass resumed --accumulate 5 at 4, the same
--batch-size, and read "at this run's batch size that epoch starts over", which blamed the
batch size."""
from __future__ import annotations

import types

import pytest

from app.training.job import train
from app.training.resuming import _resized
from tests.unit.training.test_resume_resized import NOTE, _interrupted, _stop_at


def _note(err: str):
    [(steps, then, now)] = NOTE.findall(err)
    assert "batch size the run had then" not in err, err
    return int(steps), then, now


@pytest.mark.parametrize("changed, then, now", [
    # the QA pass: only the accumulation changed
    ({"accumulate": 4}, "5 micro-batches per update", "4 micro-batches per update"),
    ({"accumulate": 4, "batch_size": 64},
     "batch size 32 and 5 micro-batches per update",
     "batch size 64 and 4 micro-batches per update"),
    ({"accumulate": None}, "5 micro-batches per update", "1 batch per update (no accumulation)"),
])
def test_the_note_names_what_changed(tiny_config, capsys, changed, then, now):
    # 512 samples in micro-batches of 32: 16 an epoch, 4 updates of 5 (the last of 1)
    _interrupted(train(tiny_config(epochs=1, loop="custom", log_every=1, accumulate=5),
                       on_step=_stop_at(1)))
    capsys.readouterr()
    again = train(tiny_config(epochs=1, loop="custom", resume=True, **changed))
    steps, said_then, said_now = _note(capsys.readouterr().err)
    assert (said_then, said_now) == (then, now)
    assert steps >= 1 and again["status"] == "completed"


def _run(previous, batch_size, micro_batch, accumulate):
    return types.SimpleNamespace(previous=previous,
                                 config=types.SimpleNamespace(batch_size=batch_size,
                                                              accumulate=accumulate),
                                 dist=types.SimpleNamespace(global_batch=micro_batch))


def test_other_replicas_and_an_older_metrics_json():
    then = {"config": {"batch_size": 32},
            "accumulation": {"micro_batch": 32, "accumulate": 2}}
    assert _resized(_run(then, 32, 32, 2)) is None
    # the same batch size on two replicas: the batch per step changed
    assert _resized(_run(then, 32, 64, 2)) == (
        "a batch of 32 per step (batch size x replicas)",
        "a batch of 64 per step (batch size x replicas)")
    # no accumulation block (older): the batch size alone, or unknown
    assert _resized(_run({"config": {"batch_size": 32}}, 64, 64, None)) == (
        "batch size 32", "batch size 64")
    assert _resized(_run({"config": {"batch_size": 32}}, 32, 32, None)) is None
    assert _resized(_run({}, 32, 32, None)) is True
