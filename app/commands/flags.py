"""The flags the commands share: task and training settings from ``app.core.settings``,
the user-code help text, and marking a flag required.  Not a command: commands import
this, never each other."""
from __future__ import annotations

import argparse
import re

from app.core import settings
from app.training.config import DATASETS, LOOPS, MODELS, PRECISIONS, STRATEGIES, TrainConfig


SPEC_HELP = """\
your own model and data (docs/your-model.md):
  --model nets.small:build        a function in a module importable from the current
                                  directory or PYTHONPATH
  --model ./nets/small.py:build   a function in a .py file
  The model function is called as build(input_shape, num_classes) (declare only the
  parameters you need) after the precision policy is set; it returns a keras.Model,
  compiled or not.  The dataset function returns ((x_train, y_train), (x_val, y_val))
  arrays or (train, val) unbatched tf.data datasets; it may declare data_dir and seed.
  --dataset ./data.npz            arrays saved with np.savez: x_train, y_train, x_val,
                                  y_val (or x_test, y_test, as Keras' own files)
"""


HELP_CONTEXT = {"models": ", ".join(MODELS), "datasets": ", ".join(DATASETS),
                "precisions": ", ".join(PRECISIONS), "loops": ", ".join(LOOPS),
                "strategies": ", ".join(STRATEGIES)}
TASK_FLAGS = tuple(s.name for s in settings.SETTINGS if s.task)


def add_setting_flags(p, names, show_env: bool = True, group=None) -> dict:
    """argparse flags for training settings (``app.core.settings``), defaults None: resolved
    later, flag > TFMP_ variable > default."""
    return settings.add_flags(p, names, TrainConfig(), HELP_CONTEXT, show_env, group)


def add_task_flags(p, show_env: bool = True):
    """--model/--dataset/--loss/--metrics and their shapes; shared by train, benchmark, check
    (check reads no TFMP_ variables: ``show_env`` False)."""
    return add_setting_flags(p, TASK_FLAGS, show_env)["what"]


def require(group, *dests: str) -> None:
    """Make the flags ``dests`` of ``group`` required; their help then says so instead of
    naming train's default and its TFMP_ variable (a required flag reads none)."""
    for action in group._group_actions:
        if action.dest in dests:
            action.required = True
            action.help = re.sub(r"\s*\(default [^)]*\)(\s*\[TFMP_\w+\])?$", "",
                                 action.help) + " (required)"


def command_parser(subparsers, name: str, summary: str, description: str, epilog: str):
    """A subcommand's parser: its one-line ``summary`` in ``tfmp --help``, the ``description``
    and ``epilog`` (examples, the user-code forms) kept as written."""
    return subparsers.add_parser(name, help=summary, description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
