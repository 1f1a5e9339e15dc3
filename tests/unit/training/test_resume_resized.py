"""--resume inside an epoch at another --batch-size or --accumulate: the checkpoint's step
counts updates of the size the run had then, so that epoch starts over from its first batch,
and a note says so (docs/training.md, "Stopping and resuming").  A QA pass stopped a run after
489 batches of 128 and resumed it at 64: it said "after 489 batch(es) of epoch 1" and skipped
489 batches of 64; from --accumulate 2 to 4, it skipped twice the micro-batches trained, and
the epoch was recorded complete.  The count only fitted this run's epochs when the step was
small enough, and the sizes were compared only when it did not."""
from __future__ import annotations

import os
import re
import signal

import pytest

from app.training.job import train
from app.training.resuming import EPOCH_STARTED_OVER

# The note names what changed: the batch size, the accumulation, or both (it blamed the batch
# size when only --accumulate had changed).
NOTE = re.compile(r"note: the checkpoint was saved (\d+) step\(s\) into epoch 1 with (.+?), and "
                  r"this run has (.+?): that epoch starts over from its first batch \(the "
                  r"weights keep what those steps taught them\)")


def _stop_at(step: int):
    """An on_step that sends SIGTERM at ``step``: the run saves a checkpoint after the step
    under way and stops, inside epoch 1 (the custom loop's: a step record reaches it at
    once; the resumed run is driven by either loop)."""
    def on_step(row):
        if row["step"] == step:
            os.kill(os.getpid(), signal.SIGTERM)
    return on_step


def _interrupted(metrics) -> None:
    assert metrics["status"] == "interrupted" and metrics["epochs"] == [], metrics["epochs"]


def _started_over(err: str, then: str, now: str) -> int:
    """The note's step count (the checkpoint's updates into epoch 1), which says what changed
    (``then`` and ``now``); no "after N batch(es)"."""
    [(steps, said_then, said_now)] = NOTE.findall(err)
    assert (said_then, said_now) == (then, now), err
    assert "batch(es) of epoch 1" not in err and "at epoch 1" in err, err
    return int(steps)


@pytest.mark.parametrize("loop", ["custom", "fit"], ids=["resumed-custom", "resumed-fit"])
def test_another_batch_size_starts_the_epoch_over(tiny_config, capsys, loop):
    # 512 samples: 16 batches of 32 an epoch, 8 of 64.
    _interrupted(train(tiny_config(epochs=1, loop="custom", log_every=1), on_step=_stop_at(5)))
    capsys.readouterr()
    again = train(tiny_config(epochs=1, loop=loop, batch_size=64, resume=True))
    said = capsys.readouterr()
    before = _started_over(said.err, "batch size 32", "batch size 64")
    assert 5 <= before < 16
    [epoch] = again["epochs"]
    assert "resumed" not in epoch and "resumed after" not in said.out, epoch
    assert epoch["steps"] == before + 8            # all 8 batches of 64: the 512 samples
    assert again[EPOCH_STARTED_OVER] == {"epoch": 1, "at_step": before}


@pytest.mark.parametrize("loop", ["custom", "fit"], ids=["resumed-custom", "resumed-fit"])
def test_another_accumulate_starts_the_epoch_over(tiny_config, capsys, loop):
    # 512 samples in micro-batches of 32: 16 an epoch, 8 updates of 2, 4 updates of 4.
    _interrupted(train(tiny_config(epochs=1, loop="custom", log_every=1, accumulate=2),
                       on_step=_stop_at(1)))
    capsys.readouterr()
    again = train(tiny_config(epochs=1, loop=loop, accumulate=4, resume=True))
    said = capsys.readouterr()
    # the batch size is the same: the note names the accumulation alone
    before = _started_over(said.err, "2 micro-batches per update", "4 micro-batches per update")
    assert 1 <= before < 4      # fewer updates than an epoch of 4 has: it fitted and was skipped
    [epoch] = again["epochs"]
    assert "resumed" not in epoch and "resumed after" not in said.out, epoch
    assert epoch["steps"] == before + 4            # all 4 updates of 4 micro-batches
    assert again["accumulation"]["accumulate"] == 4


def _stop_at_the_third_row():
    """An on_step that sends SIGTERM at the third step record this process makes."""
    seen = []

    def on_step(row):
        seen.append(row["step"])
        if len(seen) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
    return on_step


def test_a_restarted_epoch_resumed_again_counts_from_its_new_start(tiny_config, capsys):
    """Stopped again inside the epoch it started over, and resumed at the same (new) size:
    its batches are counted from where it started over, not from the epoch's first step,
    which was of the other size."""
    _interrupted(train(tiny_config(epochs=1, loop="custom", log_every=1), on_step=_stop_at(5)))
    second = train(tiny_config(epochs=1, loop="custom", batch_size=64, resume=True,
                               log_every=1), on_step=_stop_at_the_third_row())
    _interrupted(second)
    began = second[EPOCH_STARTED_OVER]["at_step"]
    capsys.readouterr()
    third = train(tiny_config(epochs=1, loop="custom", batch_size=64, resume=True))
    said = capsys.readouterr()
    [after] = [int(n) for n in re.findall(r"after (\d+) batch\(es\) of epoch 1", said.err)]
    assert 3 <= after < 8 and "starts over" not in said.err, said.err
    [epoch] = third["epochs"]
    assert epoch["resumed"] == {"after_batches": after, "batches": 8,
                                "train_samples": 512 - 64 * after}
    assert epoch["steps"] == began + 8             # the 8 batches of 64 since it started over
    assert third[EPOCH_STARTED_OVER] == {"epoch": 1, "at_step": began}
