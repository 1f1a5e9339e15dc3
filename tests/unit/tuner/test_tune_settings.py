"""What the tune's trials train besides the model and the data is resolved as ``tfmp train``
resolves it (flag or keyword, then its TFMP_ variable, then the default), one mechanism for
every trial setting: ``TFMP_FLOAT32_LAYERS`` and ``TFMP_MAX_TRAIN_SAMPLES`` were ignored by
the tune (tune.json's task.float32_layers null, the trials on all 600 samples) while a later
``train --tuned`` in the same environment trained with them; a bad value of one is train's
line, naming the variable.  On fake trials (no TensorFlow, no child processes)."""
from __future__ import annotations

import json

import pytest

from app import cli
from app.core.errors import UsageError
from app.training import config
from app.tuner import arguments
# fake: the trials that do not run, one fixture for every tune test file
from tests.unit.tuner.test_tune_output import fake, run_tune  # noqa: F401

# A value train takes for each trial setting, none of them its default.
VALUES = {"loss": "mse", "metrics": "mae", "input_shape": "28,28,1", "num_classes": "7",
          "float32_layers": "logits", "image_size": "48", "image_dir": "pics",
          "data_dir": "DATA", "max_train_samples": "200", "offline": "1", "seed": "5",
          "learning_rate": "0.002", "jit": "1"}


def _set(monkeypatch, tmp_path, names):
    (tmp_path / "DATA").mkdir(exist_ok=True)
    env = {}
    for name in names:
        value = VALUES[name]
        env[config.env_name(name)] = str(tmp_path / value) if name == "data_dir" else value
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def test_every_trial_setting_is_resolved_from_its_variable_as_train_resolves_it(
        tmp_path, monkeypatch):
    assert set(VALUES) == set(arguments.TRIAL_SETTINGS)
    env = _set(monkeypatch, tmp_path, VALUES)
    got = arguments.resolve_trial_settings("mlp", "synthetic", arguments.trial_settings({}),
                                           environ=env)
    train = config.resolve_config({"model": "mlp", "dataset": "synthetic"}, env, use_tuned=False)
    for name in arguments.TRIAL_SETTINGS:
        assert got[name] == getattr(train, name), name
    assert got["said"] == {name: config.env_name(name) for name in arguments.TRIAL_SETTINGS}


def test_a_flag_wins_over_its_variable_and_nothing_given_is_trains_default(tmp_path,
                                                                          monkeypatch):
    env = _set(monkeypatch, tmp_path, ["max_train_samples", "float32_layers"])
    got = arguments.resolve_trial_settings("mlp", "synthetic", {"max_train_samples": 300},
                                           environ=env)
    assert got["max_train_samples"] == 300 and got["float32_layers"] == "logits"
    assert got["said"] == {"float32_layers": "TFMP_FLOAT32_LAYERS"}
    bare = arguments.resolve_trial_settings("mlp", "synthetic", {}, environ={})
    defaults = config.TrainConfig()
    assert {n: bare[n] for n in arguments.TRIAL_SETTINGS if n != "data_dir"} == \
        {n: getattr(defaults, n) for n in arguments.TRIAL_SETTINGS if n != "data_dir"}
    assert bare["data_dir"] is None and bare["said"] == {} and bare["workspace"] == "workspace"


def test_the_command_line_leaves_a_setting_not_given_to_its_variable():
    """tfmp tune's flags default to None: a default filled in before tune() hid the
    variable (TFMP_MAX_TRAIN_SAMPLES=200 trained 600 samples)."""
    args = cli.build_parser().parse_args(["tune", "--model", "mlp", "--dataset", "synthetic"])
    assert arguments.trial_settings(vars(args)) == {n: None for n in arguments.TRIAL_SETTINGS}


def test_the_tune_trains_and_records_what_the_variables_say(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("TFMP_FLOAT32_LAYERS", "logits")
    monkeypatch.setenv("TFMP_MAX_TRAIN_SAMPLES", "200")
    monkeypatch.setenv("TFMP_SEED", "5")
    run_tune(tmp_path / "t")
    doc = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert doc["task"]["float32_layers"] == "logits"
    base = fake.instances[0].base
    assert (base["float32_layers"], base["max_train_samples"], base["seed"]) == ("logits", 200, 5)
    # a layer name the model lacks is refused in the trial as the user gave it
    assert base["said"]["float32_layers"] == "TFMP_FLOAT32_LAYERS"


@pytest.mark.parametrize("name, value", [("TFMP_MAX_TRAIN_SAMPLES", "0"),
                                         ("TFMP_FLOAT32_LAYERS", "a,,b"),
                                         ("TFMP_LEARNING_RATE", "0")])
def test_a_bad_variable_is_refused_naming_it_before_any_trial(tmp_path, fake, monkeypatch,
                                                             name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=name):
        run_tune(tmp_path / "t")
    assert fake.instances == [] and not (tmp_path / "t").exists()
