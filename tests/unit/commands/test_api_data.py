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

    def fake_train(cfg, on_step=None, task=None):
        seen.update(cfg=cfg, task=task)
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
