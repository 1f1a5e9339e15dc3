"""A run's folder whose metrics.json is gone (deleted, lost in a copy) still holds that run's
checkpoints and model.  A QA pass copied a finished run, deleted the copy's metrics.json and
ran the same command into it without --resume: with the run's `.tfmp-run.lock` still there
it trained, exit 0, and replaced the checkpoints and the model (without the lock file it was
refused).  The lock file only says a run began there: the folder is refused either way, in
one line, exit 2, every byte kept; only a run's aborted start (the lock file and
`tensorboard/`, before any epoch was recorded) may be reused."""
from __future__ import annotations

import hashlib
import os
import shutil

import pytest

import app
from app.core.errors import UsageError
from app.run_folder.lock import LOCK_NAME
from app.training.resuming import check_holds_no_run

from tests.unit.helpers import error_lines

TINY = ["--model", "mlp", "--dataset", "synthetic", "--max-train-samples", "256",
        "--max-val-samples", "64", "--precision", "float32", "--batch-size", "32",
        "--offline", "--progress", "lines"]


def _contents(folder):
    """Every file under ``folder`` with its bytes' digest: byte-identical or not."""
    return {os.path.relpath(os.path.join(root, name), folder):
            hashlib.sha256(open(os.path.join(root, name), "rb").read()).hexdigest()
            for root, _, files in os.walk(folder) for name in files}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A real two-epoch run with its checkpoints and model, trained once for the module."""
    from app.cli import main

    out = tmp_path_factory.mktemp("acc") / "acc1"
    assert main(["train", *TINY, "--epochs", "2", "--output", str(out)]) == 0
    assert (out / LOCK_NAME).exists() and (out / "checkpoints").is_dir()
    return out


@pytest.fixture(params=["lock file kept", "lock file deleted"])
def copy_without_metrics(request, finished_run, tmp_path):
    out = tmp_path / "cor2"
    shutil.copytree(finished_run, out)
    os.remove(out / "metrics.json")
    if request.param == "lock file deleted":
        os.remove(out / LOCK_NAME)
    return out


def _refusal(out, taken: str, allowed_output: str) -> str:
    return (f"error: output directory {str(out)!r} already holds {taken} and no run "
            "(no metrics.json): a run writes its model, checkpoints and TensorBoard logs under "
            f"those names and would replace them; allowed: a new {allowed_output} (a run's own "
            "folder, e.g. runs/NAME), or a folder without model, model.keras, "
            "model.weights.h5, checkpoints, tensorboard, best, backup")


def _taken(out) -> str:
    # What the run saved: Keras 2's model/ folder, or Keras 3's model.keras.
    saved = "model" if (out / "model").exists() else "model.keras"
    names = [saved, "checkpoints"]
    if (out / LOCK_NAME).exists():
        return ", ".join(names)       # tensorboard/ is a run's own start beside its lock file
    return ", ".join(names + ["tensorboard"])


def test_tfmp_train_refuses_it_and_keeps_every_byte(copy_without_metrics, capsys):
    from app.cli import main

    out = copy_without_metrics
    before = _contents(out)
    capsys.readouterr()
    code = main(["train", *TINY, "--epochs", "1", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert error_lines(err) == [_refusal(out, _taken(out), "--output")], err
    assert _contents(out) == before


def test_app_train_refuses_it_and_keeps_every_byte(copy_without_metrics):
    out = copy_without_metrics
    before = _contents(out)
    with pytest.raises(UsageError) as caught:
        app.train("mlp", "synthetic", precision="float32", epochs=1, batch_size=32,
                  max_train_samples=256, max_val_samples=64, offline=True, output=str(out))
    assert caught.value.line() == _refusal(out, _taken(out), "output=...")
    assert _contents(out) == before


def test_a_runs_aborted_start_may_be_reused_but_not_beside_a_checkpoint(tmp_path):
    """A second Ctrl-C before the first epoch's record leaves the lock file and tensorboard/:
    the rerun starts over there.  A checkpoint (or a model, best/) beside them is a run's
    work, kept."""
    out = tmp_path / "run"
    (out / "tensorboard").mkdir(parents=True)
    (out / "tensorboard" / "events.out.tfevents.1").write_bytes(b"x")
    (out / LOCK_NAME).write_text("")
    check_holds_no_run(str(out))
    for name in ("checkpoints", "best", "model"):
        (out / name).mkdir()
        with pytest.raises(UsageError, match=f"already holds {name} and no run"):
            check_holds_no_run(str(out))
        (out / name).rmdir()
