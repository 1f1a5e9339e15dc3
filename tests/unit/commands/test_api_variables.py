"""``app.train`` reads a setting not given from its ``TFMP_`` variable, as ``tfmp train``
does: ``TFMP_EPOCHS=1 TFMP_LOOP=custom`` trained 5 epochs with fit (a QA pass), the
signature's defaults (``epochs=5``, ``loop="fit"``) counting as given.  Checked on the
resolved config handed to the training job, without training."""
import inspect

import pytest

import app
from app.core import settings
from app.training.config import TrainConfig

# A value other than the default for each setting app.train's signature names.
OTHER_THAN_THE_DEFAULT = {"model": "cnn", "dataset": "synthetic", "precision": "float32",
                          "loop": "custom", "epochs": "1", "output": "elsewhere"}
# The keyword of a setting whose name on the command line is another (--dataset).
KEYWORD_OF = {"dataset": "data"}


@pytest.fixture
def captured(monkeypatch):
    """What ``app.train`` hands the training job, without training."""
    from app.training import job

    seen = {}

    def fake_train(cfg, on_step=None, task=None, said=None):
        seen.update(cfg=cfg, said=said)
        return {"status": "completed"}
    monkeypatch.setattr(job, "train", fake_train)
    return seen


def _signature_settings() -> dict:
    """{setting: app.train's keyword for it} for its keywords that are settings of tfmp
    train."""
    params = inspect.signature(app.train).parameters
    names = {KEYWORD_OF.get(s, s): s for s in settings.BY_NAME}
    return {names[k]: k for k in params if k in names}


def test_every_setting_in_the_signature_defaults_to_none():
    """A value there would be taken as given and hide the setting's variable."""
    params = inspect.signature(app.train).parameters
    keywords = _signature_settings()
    assert {k: params[k].default for k in keywords.values()} == dict.fromkeys(
        keywords.values())
    assert set(keywords) == set(OTHER_THAN_THE_DEFAULT)   # each one tried below


@pytest.mark.parametrize("name", sorted(OTHER_THAN_THE_DEFAULT))
def test_a_signature_setting_not_given_comes_from_its_variable(name, captured, monkeypatch,
                                                               tmp_path):
    s = settings.BY_NAME[name]
    value = OTHER_THAN_THE_DEFAULT[name]
    if name == "output":
        value = str(tmp_path / value)
    assert s.read_env(value) != getattr(TrainConfig, name)   # a value the default is not
    monkeypatch.setenv(s.env, value)
    given = {"model": "mlp", "data": "synthetic"}
    given.pop(KEYWORD_OF.get(name, name), None)
    app.train(workspace=str(tmp_path), **given)
    assert getattr(captured["cfg"], name) == s.read_env(value)
    assert captured["said"][name] == s.env   # named by the variable in a later refusal


def test_the_keyword_wins_over_the_variable_and_the_default_is_the_last(captured, monkeypatch,
                                                                        tmp_path):
    monkeypatch.setenv("TFMP_EPOCHS", "1")
    monkeypatch.setenv("TFMP_LOOP", "custom")
    app.train("mlp", "synthetic", epochs=2, loop="fit", workspace=str(tmp_path))
    assert (captured["cfg"].epochs, captured["cfg"].loop) == (2, "fit")
    monkeypatch.delenv("TFMP_EPOCHS")
    monkeypatch.delenv("TFMP_LOOP")
    app.train("mlp", "synthetic", workspace=str(tmp_path))
    assert (captured["cfg"].epochs, captured["cfg"].loop) == (5, "fit")
    assert "epochs" not in captured["cfg"].given and "loop" not in captured["cfg"].given
