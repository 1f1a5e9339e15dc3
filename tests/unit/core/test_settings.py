"""The settings table (app/core/settings.py): every training setting has one flag and one TFMP_
variable, argparse and the environment resolver read it, and the benchmark passes on
exactly its ``passed`` column.  No TensorFlow."""
import argparse
import dataclasses

import pytest

from app.core import settings
from app.training.config import TrainConfig, resolve_config


def _train_parser():
    from app.commands import train

    root = argparse.ArgumentParser()
    return train.add_parser(root.add_subparsers())


def test_every_config_field_is_one_setting_with_a_flag_and_a_variable():
    fields = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in ("tuning", "given")]
    assert sorted(fields) == sorted(s.name for s in settings.SETTINGS)
    flags = [s.flag for s in settings.SETTINGS]
    envs = [s.env for s in settings.SETTINGS]
    assert len(set(flags)) == len(flags) and len(set(envs)) == len(envs)
    assert all(e.startswith("TFMP_") for e in envs)


def test_train_help_names_each_flags_variable():
    text = _train_parser().format_help()
    for s in settings.SETTINGS:
        assert s.flag in text and f"[{s.env}]" in text, s.name


@pytest.mark.parametrize("name,raw,expected", [
    ("resume", "1", True), ("max_skipped_steps", "7", 7), ("initial_loss_scale", "1024", 1024.0),
    ("save_model", "1", False), ("image_size", "48", 48), ("progress", "lines", "lines"),
])
def test_the_flags_that_had_no_variable_now_have_one(name, raw, expected, tmp_path):
    env = {settings.BY_NAME[name].env: raw, "TFMP_WORKSPACE": str(tmp_path)}
    if name == "resume":
        env["TFMP_OUTPUT"] = str(tmp_path / "run")
    assert getattr(resolve_config({}, environ=env), name) == expected


def test_a_flag_wins_over_its_variable():
    args = _train_parser().parse_args(["--no-save-model", "--max-skipped-steps", "3"])
    cfg = resolve_config(vars(args), environ={"TFMP_NO_SAVE_MODEL": "0",
                                              "TFMP_MAX_SKIPPED_STEPS": "9"})
    assert cfg.save_model is False and cfg.max_skipped_steps == 3


def test_the_benchmark_passes_on_the_passed_column_and_the_input_rate_child_reads_it():
    from app.benchmark import input_rate, runner

    passed = {s.name for s in settings.PASSED}
    assert {k for k, _ in runner.PASS_THROUGH + runner.BOOL_PASS_THROUGH} == passed
    values = {"model": "cnn", "dataset": "synthetic", "batch_size": 16, "jit": True,
              "offline": False, "resume": True}
    cmd = runner.train_command(values, "float32", "/tmp/run")
    assert cmd[cmd.index("--model") + 1] == "cnn" and "--jit" in cmd
    assert "--offline" not in cmd and "--resume" not in cmd
    flags = settings.passed_flags(values)
    parsed = vars(input_rate.build_parser().parse_args(flags + ["--output", "x"]))
    assert parsed["batch_size"] == 16 and parsed["jit"] is True
