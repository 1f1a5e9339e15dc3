"""``app.train(..., dataset=...)``: the command line's name for ``data`` (it was taken as a
setting and overwritten by ``data``'s default, "mnist", without a word)."""
import numpy as np
import pytest

import app
from app.core.errors import UsageError


@pytest.fixture
def captured(monkeypatch):
    """What ``app.train`` hands the training job, without training."""
    from app.training import job

    seen = {}

    def fake_train(cfg, on_step=None, task=None, said=None):
        seen.update(cfg=cfg, task=task, said=said)
        return {"status": "completed"}
    monkeypatch.setattr(job, "train", fake_train)
    return seen


def _arrays():
    x = np.zeros((32, 4), "float32")
    y = np.arange(32) % 2
    return (x, y), (x[:8], y[:8])


def test_dataset_is_the_data(captured):
    app.train("mlp", dataset="synthetic", epochs=1)
    assert captured["cfg"].dataset == "synthetic" and captured["task"].dataset.spec == "synthetic"
    app.train("mlp", dataset=_arrays(), epochs=1)
    assert captured["task"].dataset.spec == "python:arrays"


def test_data_alone_and_the_default_are_as_before(captured):
    app.train("mlp", "synthetic", epochs=1)
    assert captured["cfg"].dataset == "synthetic"
    app.train("mlp", epochs=1)
    assert captured["cfg"].dataset == "mnist"


@pytest.mark.parametrize("call", [app.train, app.check])
def test_data_and_dataset_together_is_one_line(call, captured):
    with pytest.raises(UsageError) as info:
        call("mlp", "synthetic", dataset="cifar10")
    assert info.value.line() == (
        "error: data and dataset name the same thing (the training data); both were given; "
        "allowed: one of them: data=... (or dataset=..., the name tfmp train --dataset uses)")
    assert captured == {}


def test_check_takes_dataset_too(monkeypatch):
    from app.doctor import check as doctor

    seen = {}
    monkeypatch.setattr(doctor, "check", lambda **kw: seen.update(kw) or {})
    app.check("mlp", dataset="synthetic", steps=2)
    assert seen == {"model": "mlp", "data": "synthetic", "steps": 2}


@pytest.mark.parametrize("settings, line", [
    # a number or a yes/no of the wrong type failed deep inside with TypeError
    ({"learning_rate": "fast"}, "learning_rate='fast' is not valid; allowed: a number"),
    ({"max_train_samples": 100.5}, "max_train_samples must be an integer. Received: "
                                   "max_train_samples=100.5 (float)"),
    ({"initial_loss_scale": [128]}, "initial_loss_scale must be a number"),
    ({"epochs": True}, "epochs must be an integer. Received: epochs=True (bool)"),
    ({"workspace": 5, "output": None}, "workspace must be a path. Received: workspace=5 (int)"),
    # a true string turned XLA on: "false" is read as the variable TFMP_JIT=false is
    ({"jit": "maybe"}, "jit='maybe' is not valid; allowed: 1/0, true/false, yes/no or on/off"),
    ({"jit": 1}, "jit must be True or False. Received: jit=1 (int)"),
    ({"on_step": 5}, "on_step is not a function. Received: on_step=5 (int)"),
    # the list named an internal field and left out data and on_step
    ({"tuning": {}}, "unknown setting(s) tuning; allowed: model, data, dataset, on_step, "
                     "accumulate,"),
])
def test_a_value_of_the_wrong_type_is_one_line(captured, settings, line):
    with pytest.raises(UsageError) as caught:
        app.train("mlp", "synthetic", **{"epochs": 1, **settings})
    assert line in str(caught.value), str(caught.value)
    assert captured == {}


def test_text_and_paths_are_read_as_the_command_line_reads_them(captured, tmp_path):
    import pathlib

    app.train("mlp", pathlib.Path("synthetic"),
              epochs="3", jit="false", learning_rate="0.01", max_train_samples=np.int64(64),
              output=tmp_path / "run")
    cfg = captured["cfg"]
    assert (cfg.epochs, cfg.jit, cfg.learning_rate, cfg.max_train_samples) == (3, False, 0.01, 64)
    assert type(cfg.max_train_samples) is int and cfg.output == str(tmp_path / "run")
    assert cfg.dataset == "synthetic"


@pytest.mark.parametrize("text, on", [("false", False), ("0", False), ("off", False),
                                      ("true", True), ("1", True), ("yes", True)])
def test_a_yes_no_keyword_given_as_text_keeps_the_keywords_sense(captured, tmp_path, text, on):
    """sentinel="false" left the sentinel on and sentinel="true" turned it off (and so for
    save_model): the text was read as the variable that says the opposite word
    (TFMP_NO_SENTINEL, --no-save-model)."""
    app.train("mlp", "synthetic", epochs=1, sentinel=text, save_model=text, jit=text,
              output=tmp_path / "run")
    cfg = captured["cfg"]
    assert (cfg.sentinel, cfg.save_model, cfg.jit) == (on, on, on)


@pytest.mark.parametrize("call", ["check", "tune"])
def test_check_and_tune_name_an_unknown_keyword_in_one_line(call):
    with pytest.raises(UsageError) as caught:
        getattr(app, call)("mlp", "synthetic", epochs=3)
    assert str(caught.value).startswith(f"error: unknown setting(s) of app.{call}: epochs; "
                                        "allowed: model, data, precision,"), str(caught.value)


def test_tune_takes_paths_too(monkeypatch, tmp_path):
    import pathlib

    from app import api

    seen = {}
    monkeypatch.setattr(api, "_tune", lambda *a, **kw: seen.update(args=a, kw=kw) or {})
    app.tune("mlp", pathlib.Path("data.npz"), output=tmp_path / "tune")
    assert seen == {"args": ("mlp", "data.npz"), "kw": {"output": str(tmp_path / "tune")}}
