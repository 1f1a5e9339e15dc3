"""A Ctrl-C (a notebook's Interrupt) while a run is still being prepared, before its first
step: a QA pass interrupted ``app.train`` 0.1 s in, as it turned 18,000 rows of arrays into
a dataset, and got a 13-frame KeyboardInterrupt traceback through app/training/job.py and
TensorFlow.  Now it is one line, and the result of an interrupted run (``status``
``interrupted``), with nothing written; ``tfmp train`` ends with that line and 130.  The
interrupt is the data function's own KeyboardInterrupt, raised where Python raises the
signal's (during the data's loading): deterministic."""
from __future__ import annotations

import signal

import pytest

import app

INTERRUPTED_DATA = "def load():\n    raise KeyboardInterrupt\n"


@pytest.fixture
def interrupted_data(tmp_path):
    path = tmp_path / "interrupted_data.py"
    path.write_text(INTERRUPTED_DATA)
    return f"{path}:load"


def _one_line(err: str) -> str:
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    [line] = [ln for ln in err.splitlines() if ln.startswith("interrupted")]
    return line


@pytest.mark.parametrize("output_given", [True, False], ids=["output", "default folder"])
def test_app_train_interrupted_while_preparing_is_one_line(tmp_path, capsys, interrupted_data,
                                                           output_given):
    out = tmp_path / "run"
    keywords = dict(output=str(out)) if output_given else {}
    metrics = app.train("mlp", interrupted_data, precision="float32", epochs=1,
                        workspace=str(tmp_path / "ws"), offline=True, **keywords)
    assert metrics["status"] == "interrupted" and metrics["signal"] == signal.SIGINT
    assert metrics["epochs"] == [] and metrics["config"]["epochs"] == 1
    folder = f"{out} is as it was" if output_given else "no run folder was made"
    assert _one_line(capsys.readouterr().err) == (
        "interrupted (signal 2) before training started, while the run was being prepared: "
        f"nothing was written ({folder}); call app.train again to start it")
    assert metrics["diagnosis"].startswith("interrupted (signal 2) before training started")
    assert not out.exists() and not (tmp_path / "ws" / "runs").exists()


def test_tfmp_train_interrupted_while_preparing_is_one_line_and_130(tmp_path, capsys,
                                                                    interrupted_data):
    from app.cli import main

    out = tmp_path / "run"
    code = main(["train", "--dataset", interrupted_data, "--precision", "float32",
                 "--epochs", "1", "--offline", "--output", str(out)])
    assert code == 130
    assert _one_line(capsys.readouterr().err) == (
        "interrupted (signal 2) before training started, while the run was being prepared: "
        f"nothing was written ({out} is as it was); run the same command again to start it")
    assert not out.exists()


def test_app_train_interrupted_before_its_config_is_one_line(capsys, monkeypatch):
    """Earlier still: the first call's imports (TensorFlow, seconds in a new kernel) and the
    settings' resolution, before the run's config exists."""
    from app import api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(api, "_config", interrupted)
    metrics = app.train("mlp", "synthetic", epochs=1)
    assert (metrics["status"], metrics["config"], metrics["epochs"]) == ("interrupted", None, [])
    assert _one_line(capsys.readouterr().err) == (
        "interrupted (signal 2) before training started, while the run was being prepared: "
        "nothing was written; call app.train again to start it")
