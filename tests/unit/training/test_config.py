"""Configuration order (flag > TFMP_* variable > default) and validation (no TensorFlow)."""
import os
from datetime import datetime, timezone

import pytest

from app.training.config import (TrainConfig, claim_unused, default_base, resolve_config,
                                 unused)
from app.core.errors import UsageError


def test_flag_beats_environment_beats_default():
    env = {"TFMP_EPOCHS": "7", "TFMP_BATCH_SIZE": "64", "TFMP_PRECISION": "float32"}
    cfg = resolve_config({"epochs": 3}, environ=env)
    assert cfg.epochs == 3            # flag
    assert cfg.batch_size == 64       # environment
    assert cfg.precision == "float32"
    assert cfg.loop == "fit"          # default


def test_workspace_and_data_dir_defaults():
    cfg = resolve_config({}, environ={"TFMP_WORKSPACE": "/tmp/wsx"})
    assert cfg.workspace == "/tmp/wsx"
    assert cfg.data_dir == os.path.join("/tmp/wsx", "data")
    out = unused(default_base(cfg, "float32",
                              now=datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)))
    assert out == os.path.join("/tmp/wsx", "runs", "20240102T030405Z-mlp-mnist-float32")


def test_claims_of_one_default_folder_name_each_get_their_own(tmp_path):
    """Two runs started in the same second pick the same default name (``unused`` only
    looks); the claim is the folder's creation, which one wins: the other takes ``-2``."""
    import threading

    base = str(tmp_path / "runs" / "20261207T162250Z-nets-data-float32")
    assert claim_unused(base) == base
    assert claim_unused(base) == base + "-2"
    os.symlink(tmp_path / "gone", base + "-3")   # a name taken by a dangling link too
    assert claim_unused(base) == base + "-4"
    # at once, from threads: every claim a folder of its own
    start, claimed = threading.Barrier(6), []
    threads = [threading.Thread(target=lambda: (start.wait(), claimed.append(claim_unused(base))))
               for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(claimed) == 6 and set(claimed) == {f"{base}-{n}" for n in range(5, 11)}


def test_bad_environment_value_names_the_variable():
    with pytest.raises(UsageError) as info:
        resolve_config({}, environ={"TFMP_EPOCHS": "many"})
    assert "TFMP_EPOCHS" in str(info.value)


@pytest.mark.parametrize("variable, value, needle", [
    ("TFMP_PRECISION", "fp16", "TFMP_PRECISION must be one of float32, mixed_float16"),
    ("TFMP_LOOP", "gradient", "TFMP_LOOP must be one of fit, custom"),
    ("TFMP_MODEL", "vgg", "TFMP_MODEL must be one of mlp, cnn, resnet"),
    ("TFMP_EPOCHS", "0", "TFMP_EPOCHS must be at least 1. Received: TFMP_EPOCHS=0"),
    ("TFMP_LEARNING_RATE", "-1", "TFMP_LEARNING_RATE must be a finite number > 0"),
])
def test_a_bad_value_from_a_variable_names_the_variable(variable, value, needle):
    """A bad value in .env or -e is named as the user set it: the variable, not the
    setting's field (TFMP_PRECISION=fp16 said "precision must be one of ...")."""
    with pytest.raises(UsageError) as info:
        resolve_config({}, environ={variable: value})
    assert needle in str(info.value)
    # The same value given as a flag is named as the setting.
    field = variable[len("TFMP_"):].lower()
    with pytest.raises(UsageError) as info:
        resolve_config({field: type(getattr(TrainConfig(), field))(value)}, environ={})
    assert str(info.value).startswith(f"error: {field} must"), str(info.value)


@pytest.mark.parametrize("flags, needle", [
    ({"precision": "fp8"}, "precision must be one of"),
    ({"model": "vgg"}, "model must be one of mlp, cnn, resnet"),
    ({"dataset": "imagenet"}, "dataset must be one of"),
    ({"loop": "manual"}, "loop must be one of fit, custom"),
    ({"epochs": 0}, "epochs must be at least 1"),
    ({"batch_size": -4}, "batch_size must be at least 1"),
    ({"learning_rate": 0.0}, "learning_rate must be a finite number > 0"),
    ({"model": "mlp", "dataset": "cifar10"}, "expects 28x28x1"),
    ({"dataset": "images"}, "needs --image-dir"),
    # every part a number: a slip is not read as a shorter shape ("8,x" was (8,))
    ({"input_shape": "8,x"}, "input_shape must be positive integers separated by commas. "
                             "Received: input_shape='8,x'"),
    ({"input_shape": "28,,28"}, "Received: input_shape='28,,28'"),
    ({"input_shape": "784,"}, "Received: input_shape='784,'"),
    ({"input_shape": "0"}, "Received: input_shape='0'"),
])
def test_bad_values(flags, needle):
    with pytest.raises(UsageError) as info:
        resolve_config(flags, environ={})
    assert needle in str(info.value)
    assert "; allowed: " in info.value.line()


def test_config_is_a_plain_dataclass():
    """What metrics.json records: every field, JSON-ready, and it gives the same config back."""
    import dataclasses
    import json

    cfg = TrainConfig(model="cnn", epochs=3, jit=True, output="/tmp/x")
    assert dataclasses.is_dataclass(cfg)
    d = cfg.to_dict()
    # every setting; "tuning" (the --tuned record) goes to metrics.json's own "tuned" block
    # and "given" (which settings were given: what --resume keeps of the run's) is not one
    assert list(d) == [f.name for f in dataclasses.fields(TrainConfig)
                       if f.name not in ("tuning", "given")]
    assert json.loads(json.dumps(d)) == d
    assert TrainConfig(**d) == cfg and TrainConfig(**d) != TrainConfig()


def test_accumulation_from_either_flag_and_the_replicas():
    from app.training.config import check_accumulation

    assert check_accumulation(resolve_config({}, environ={})) == 1
    assert check_accumulation(resolve_config({}, environ={"TFMP_ACCUMULATE": "4"})) == 4
    cfg = resolve_config({"global_batch": 256, "batch_size": 32}, environ={})
    assert check_accumulation(cfg) == 8
    assert check_accumulation(cfg, replicas=2) == 4      # micro-batch 64 over two replicas
    with pytest.raises(UsageError) as info:
        check_accumulation(resolve_config({"global_batch": 96, "batch_size": 32}, environ={}),
                           replicas=2)
    assert "not a multiple of the micro-batch 64 (--batch-size 32 x 2 replicas)" in str(info.value)
    assert "--global-batch 64 or 128" in str(info.value)
    # Below one micro-batch there is one multiple to suggest, not "128 or 128" (a QA pass).
    with pytest.raises(UsageError) as info:
        check_accumulation(resolve_config({"global_batch": 100}, environ={}))
    assert str(info.value).endswith(
        "global_batch 100 is not a multiple of the micro-batch 128 (--batch-size 128); "
        "allowed: --global-batch 128, or a --batch-size that divides 100"), str(info.value)
    with pytest.raises(UsageError):
        resolve_config({"global_batch": 0}, environ={})
    # Given as variables, the line names the variables (docs/training.md), not the flags.
    with pytest.raises(UsageError) as info:
        resolve_config({}, environ={"TFMP_GLOBAL_BATCH": "100", "TFMP_BATCH_SIZE": "64"})
    assert str(info.value).endswith(
        "TFMP_GLOBAL_BATCH 100 is not a multiple of the micro-batch 64 (TFMP_BATCH_SIZE 64); "
        "allowed: TFMP_GLOBAL_BATCH 64 or 128, or a TFMP_BATCH_SIZE that divides 100"), \
        str(info.value)


@pytest.mark.parametrize("text, shape", [("28,28,1", (28, 28, 1)), ("28x28x1", (28, 28, 1)),
                                         (" 784 ", (784,)), ("32, 32, 3", (32, 32, 3))])
def test_input_shapes_that_are_read(text, shape):
    from app.task.user_code import parse_input_shape

    assert parse_input_shape(text) == shape
    assert resolve_config({"input_shape": text}, environ={}).input_shape == text


def test_the_fields_resolve_config_sets_are_no_api_keyword(tmp_path):
    """`given` is set by resolve_config: app.train(given=...) was taken for a setting and
    ended in TypeError ("got multiple values for keyword argument 'given'")."""
    import app
    from app.core.errors import UsageError

    for name in ("given", "tuning"):
        with pytest.raises(UsageError) as caught:
            app.train("mlp", "synthetic", epochs=1, output=str(tmp_path / name),
                      **{name: ("learning_rate",)})
        assert caught.value.line().startswith(f"error: unknown setting(s) {name}; allowed: "), \
            caught.value.line()
    assert not list(tmp_path.iterdir())
