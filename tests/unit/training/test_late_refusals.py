"""A setting's value refused only once the model is built or the data are loaded (a layer
the model does not have, a metric the run does not record, a class the labels lack) is
named as the user gave it: its flag, its TFMP_ variable, app.train's keyword.  The QA pass
met "error: --float32-layers 'zzz': ..." from TFMP_FLOAT32_LAYERS=zzz, a flag never typed
(docs/training.md: "A bad variable value names the variable")."""
from __future__ import annotations

import pytest

import app
from app.core.errors import UsageError
from tests.unit.user_models.datasets import tiny_bits
from tests.unit.user_models.models_misc import hidden_logits


def _refusal(tmp_path, **settings) -> str:
    with pytest.raises(UsageError) as info:
        app.train(hidden_logits, tiny_bits(), precision="float32", epochs=1, progress="lines",
                  output=str(tmp_path / "run"), **settings)
    assert not (tmp_path / "run").exists()
    return str(info.value)


def test_each_setting_is_named_as_it_was_given():
    from app.core.settings import given_as

    environ = {"TFMP_FLOAT32_LAYERS": "zzz", "TFMP_EARLY_STOP_ON": "val_x", "TFMP_EPOCHS": ""}
    flags = {"float32_layers": None, "early_stop_on": "val_y", "epochs": None}
    assert given_as(flags, environ) == {"float32_layers": "TFMP_FLOAT32_LAYERS",
                                        "early_stop_on": "--early-stop-on"}   # a flag wins
    assert given_as({"float32_layers": ["zzz"]}, {}, keyword=True) == {
        "float32_layers": "float32_layers"}


@pytest.mark.parametrize("variable,value,settings,named", [
    ("TFMP_FLOAT32_LAYERS", "zzz", {}, "TFMP_FLOAT32_LAYERS 'zzz': model "),
    (None, None, {"float32_layers": ["zzz"]}, "float32_layers 'zzz': model "),
    ("TFMP_EARLY_STOP_ON", "val_zzz", {"early_stop": 1},
     "TFMP_EARLY_STOP_ON 'val_zzz' is not a number this run records"),
    (None, None, {"early_stop": 1, "early_stop_on": "val_zzz"},
     "early_stop_on 'val_zzz' is not a number this run records"),
    ("TFMP_CLASS_WEIGHT", "9=3", {},
     "TFMP_CLASS_WEIGHT weighs class 9, and the labels are the class ids 0..1"),
])
def test_a_value_refused_once_the_model_is_built_names_where_it_came_from(
        tmp_path, monkeypatch, variable, value, settings, named):
    if variable:
        monkeypatch.setenv(variable, value)
    line = _refusal(tmp_path, **settings)
    assert named in line, line
    assert "--float32-layers" not in line.split(";")[0] and "--early-stop-on" not in line


def test_a_malformed_variable_is_named_as_the_variable():
    """Refused before any model is built (an empty name in the list): the same rule."""
    from app.training.config import resolve_config

    with pytest.raises(UsageError) as info:
        resolve_config({}, {"TFMP_FLOAT32_LAYERS": "a,,b"})
    assert str(info.value).startswith("error: TFMP_FLOAT32_LAYERS has an empty layer name. "
                                      "Received: TFMP_FLOAT32_LAYERS='a,,b'"), str(info.value)
