"""Output faults (issue 11): a full disk or a failed write mid-run is one line, exit status 5,
metrics.json says failed, no half-written checkpoint is left, and --resume finishes the job;
a damaged run folder falls back to the newest checkpoint that restores.

The writer is made to fail here (monkeypatched, as the disk would: TensorFlow's own error
text); tests/image/test_faults.py fills a real tmpfs in a container."""
import errno
import json
import os

import pytest

from tests.unit.helpers import error_lines

ARGS = ["train", "--dataset", "synthetic", "--max-train-samples", "256", "--max-val-samples",
        "64", "--batch-size", "32", "--precision", "float32", "--progress", "lines",
        "--offline", "--no-save-model", "--epochs", "3"]


def _main(capsys, *args):
    from app.cli import main

    code = main(list(args))
    return code, capsys.readouterr().err


def _full_on_save(monkeypatch, fail_at: int):
    """The fail_at-th checkpoint save dies like SaveV2 on a full disk, leaving its temp folder."""
    import tensorflow as tf

    from app.run_folder import checkpoints as checkpointing

    real = checkpointing.Checkpointer.save
    calls = []

    def save(self, completed_epochs, global_step):
        calls.append(completed_epochs)
        if len(calls) == fail_at:
            temp = os.path.join(self.read_dir, f"ckpt-{fail_at}_temp")
            os.makedirs(temp, exist_ok=True)
            with open(os.path.join(temp, "part-00000-of-00001.data-00000-of-00001"), "wb") as fh:
                fh.write(b"\0" * 1000)
            raise tf.errors.ResourceExhaustedError(
                None, None, f"{temp}/part-00000-of-00001.data-00000-of-00001.tempstate1; "
                            "No space left on device [Op:SaveV2]")
        return real(self, completed_epochs, global_step)
    monkeypatch.setattr(checkpointing.Checkpointer, "save", save)


def test_disk_full_during_a_checkpoint_save_then_resume_finishes(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    _full_on_save(monkeypatch, fail_at=2)
    code, err = _main(capsys, *ARGS, "--output", str(out))
    assert code == 5, err
    errors = error_lines(err)
    assert len(errors) == 1 and "Traceback" not in err, err
    assert "no space left on the device" in errors[0]
    assert f"cannot write {out / 'checkpoints'}:" in errors[0]
    assert "--resume to continue from ckpt-1" in errors[0]
    ckpts = sorted(os.listdir(out / "checkpoints"))
    assert not [c for c in ckpts if "_temp" in c], ckpts          # no half-written save
    assert "ckpt-1.index" in ckpts                                # the last good one intact
    m = json.loads((out / "metrics.json").read_text())
    assert m["status"] == "failed" and "no space left" in m["diagnosis"]

    monkeypatch.undo()                                            # space freed
    code, err = _main(capsys, *ARGS, "--output", str(out), "--resume")
    assert code == 0, err
    m = json.loads((out / "metrics.json").read_text())
    assert m["status"] == "completed" and [e["epoch"] for e in m["epochs"]] == [1, 2, 3]


def test_disk_full_before_the_first_checkpoint_says_what_works_and_it_does(tmp_path, capsys,
                                                                         monkeypatch):
    """No checkpoint to resume: the line names what does work (it once said "run the same
    command again", which the failed run in the folder then refused)."""
    import shutil

    out = tmp_path / "run"
    _full_on_save(monkeypatch, fail_at=1)
    code, err = _main(capsys, *ARGS, "--output", str(out))
    assert code == 5, err
    [line] = error_lines(err)
    assert line.endswith(f"then run the command again with a new --output, or after removing "
                         f"that folder (rm -r {out}): no checkpoint was completed, so there "
                         "is nothing to resume"), line
    monkeypatch.undo()
    for args in ([*ARGS, "--output", str(tmp_path / "new")], [*ARGS, "--output", str(out)]):
        if args[-1] == str(out):
            shutil.rmtree(out)
        code, err = _main(capsys, *args, "--epochs", "1")
        assert code == 0, err


def test_disk_full_saving_the_model_leaves_no_partial_model_and_says_failed(tmp_path, capsys,
                                                                          monkeypatch):
    """The partial model held the space metrics.json's "failed" needed: the run folder kept
    `.model.tmp/` and a metrics.json that said "running" (found by a QA pass)."""
    from app.run_folder import checkpoints as checkpointing

    def full(model, output):
        partial = os.path.join(output, ".model.tmp", "variables")
        os.makedirs(partial)
        with open(os.path.join(partial, "variables.data-00000-of-00001"), "wb") as fh:
            fh.write(b"\0" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device", partial)
    monkeypatch.setattr(checkpointing, "save_final_model", full)
    out = tmp_path / "run"
    args = [a for a in ARGS if a != "--no-save-model"]
    code, err = _main(capsys, *args, "--epochs", "1", "--output", str(out))
    assert code == 5, err
    assert not (out / ".model.tmp").exists() and not (out / "model").exists()
    assert json.loads((out / "metrics.json").read_text())["status"] == "failed"
    assert "--resume to continue from ckpt-1" in error_lines(err)[0]


def test_metrics_write_failing_is_the_same_one_line(tmp_path, capsys, monkeypatch):
    from app.core import files as reporting

    out = tmp_path / "run"
    real = reporting.write_atomic
    calls = []

    def write_atomic(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real(path, data)
    monkeypatch.setattr(reporting, "write_atomic", write_atomic)
    code, err = _main(capsys, *ARGS, "--output", str(out))
    assert code == 5, err
    [line] = error_lines(err)
    assert "the file system is read-only" in line and "metrics.json" in line


def test_classify_knows_the_os_and_tensorflow_forms():
    import tensorflow as tf

    from app.run_folder.write_faults import classify

    assert classify(OSError(errno.ENOSPC, "x")) == errno.ENOSPC
    assert classify(OSError(errno.EDQUOT, "x")) == errno.EDQUOT
    assert classify(tf.errors.PermissionDeniedError(None, None, "/o/x; Permission denied")) \
        == errno.EACCES
    assert classify(tf.errors.UnknownError(None, None, "/o; Read-only file system")) \
        == errno.EROFS
    assert classify(ValueError("No space left on device")) is None   # not a write error
    assert classify(OSError(errno.ENOENT, "x")) is None


def _three_epochs(tmp_path, capsys):
    out = tmp_path / "run"
    code, err = _main(capsys, *ARGS, "--output", str(out))
    assert code == 0, err
    return out


def test_truncated_latest_checkpoint_falls_back_to_the_one_before(tmp_path, capsys):
    out = _three_epochs(tmp_path, capsys)
    ck = out / "checkpoints"
    [data] = [p for p in ck.iterdir() if p.name.startswith("ckpt-3.data")]
    with open(data, "r+b") as fh:
        fh.truncate(data.stat().st_size // 3)
    code, err = _main(capsys, *ARGS, "--output", str(out), "--resume", "--epochs", "4")
    assert code == 0, err
    assert "warning: checkpoint ckpt-3" in err and "resuming from ckpt-2 (epoch 2)" in err
    m = json.loads((out / "metrics.json").read_text())
    assert m["status"] == "completed" and [e["epoch"] for e in m["epochs"]] == [1, 2, 3, 4]


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_garbled_state_file_is_rebuilt(tmp_path, capsys, monkeypatch, relative):
    out = _three_epochs(tmp_path, capsys)
    (out / "checkpoints" / "checkpoint").write_text("garbage {{{")
    if relative:   # --output runs/x: the rebuilt state file must hold paths that resolve
        monkeypatch.chdir(tmp_path)
    given = "run" if relative else str(out)
    code, err = _main(capsys, *ARGS, "--output", given, "--resume", "--epochs", "4")
    assert code == 0, err
    assert "is damaged; rebuilt" in err and "at epoch 4" in err
    code, err = _main(capsys, *ARGS, "--output", given, "--resume", "--epochs", "5")
    assert code == 0 and "is damaged" not in err and "at epoch 5" in err, err


def test_every_checkpoint_damaged_is_one_line_not_a_restart(tmp_path, capsys):
    out = _three_epochs(tmp_path, capsys)
    for p in (out / "checkpoints").iterdir():
        if ".data-" in p.name:
            p.write_bytes(b"x")
    before = (out / "metrics.json").read_text()
    code, err = _main(capsys, *ARGS, "--output", str(out), "--resume", "--epochs", "4")
    assert code == 2, err
    [line] = error_lines(err)
    assert "can be restored" in line and "ckpt-3" in line
    assert (out / "metrics.json").read_text() == before


@pytest.mark.parametrize("content, words", [
    ("{not json", "cannot be read (JSONDecodeError)"),
    ("", "cannot be read (JSONDecodeError)"),
    ("[1, 2]", "is not the metrics of a run (the file is list, not a mapping)"),
    ('{"config": "edited", "epochs": []}',
     "is not the metrics of a run (its 'config' is str, not a mapping)"),
    ('{"config": {}, "data": [1]}', "is not the metrics of a run (its 'data' is list, not a "
                                    "mapping)"),
])
def test_corrupt_metrics_json_is_one_line(tmp_path, capsys, content, words):
    out = _three_epochs(tmp_path, capsys)
    (out / "metrics.json").write_text(content)
    code, err = _main(capsys, *ARGS, "--output", str(out), "--resume", "--epochs", "4")
    assert code == 2, err
    [line] = error_lines(err)
    assert "metrics.json" in line and words in line and "cannot be resumed safely" in line, line
    assert "allowed: restore it from a copy, or start a new --output" in line
    assert (out / "metrics.json").read_text() == content   # left as it was


def test_metrics_json_deleted_beside_the_checkpoints_is_one_line(tmp_path, capsys):
    """It resumed, and the new metrics.json held only the epochs after the checkpoint."""
    out = _three_epochs(tmp_path, capsys)
    os.remove(out / "metrics.json")
    listing = sorted(p.name for p in (out / "checkpoints").iterdir())
    code, err = _main(capsys, *ARGS, "--output", str(out), "--resume", "--epochs", "4")
    assert code == 2, err
    assert error_lines(err) == [
        f"error: --resume: {str(out / 'metrics.json')!r} is missing beside the run's "
        "checkpoints: the model and dataset it trained and its epochs so far are not known, "
        "so the run cannot be resumed safely; allowed: restore it from a copy, or start a new "
        "--output"]
    assert not (out / "metrics.json").exists()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == listing


def test_checkpoint_of_another_model_is_one_line(tmp_path, capsys):
    out = _three_epochs(tmp_path, capsys)
    # metrics.json edited to name cnn: the spec check passes, and the checkpoint itself says no
    doc = json.loads((out / "metrics.json").read_text())
    doc["task"]["model"] = doc["config"]["model"] = "cnn"
    (out / "metrics.json").write_text(json.dumps(doc))
    code, err = _main(capsys, *ARGS, "--output", str(out), "--resume", "--model", "cnn")
    assert code == 2, err
    [line] = error_lines(err)
    assert "does not match this model" in line


def test_disk_full_under_app_train_says_resume_true(tmp_path, monkeypatch):
    """The same fault from app.train (a notebook): the hint is the keyword, not the flag."""
    import app
    from app.run_folder.write_faults import OutputFault

    _full_on_save(monkeypatch, fail_at=2)
    with pytest.raises(OutputFault) as err:
        app.train(model="mlp", data="synthetic", max_train_samples=256, max_val_samples=64,
                  batch_size=32, precision="float32", progress="lines", offline=True,
                  save_model=False, epochs=3, output=str(tmp_path / "run"))
    line = err.value.line()
    assert "run the same app.train call with resume=True to continue from ckpt-1" in line, line
    assert "--resume" not in line
