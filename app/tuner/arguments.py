"""``tune()``'s arguments, checked before any trial starts and before TensorFlow is
imported: each bad one is one line (``UsageError``), as it is for ``tfmp train``; and the
trial settings ``tfmp tune`` and ``benchmark --best-batch`` pass on."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from app.core import catalog as registry
from app.core import settings as settings_table
from app.core.errors import UsageError
from app.precision.policy import parse_names
from app.training import config
from app.tuner import search

PRECISION_CHOICES = registry.PRECISIONS


def parse_precisions(value: Union[None, str, Sequence[str]]) -> Optional[List[str]]:
    return parse_names(value, "precision", PRECISION_CHOICES)


def check_margin(margin) -> float:
    try:
        m = float(margin)
    except (TypeError, ValueError):
        m = float("nan")
    if not 0.0 <= m < 0.9:
        raise UsageError(f"margin must be in [0, 0.9). Received: margin={margin!r}",
                         "a fraction of the budget kept free, e.g. 0.1")
    return m


def check_max_batch(value) -> int:
    if value is None:
        return search.DEFAULT_CAP
    if not isinstance(value, int) or isinstance(value, bool) or value < search.STEP:
        raise UsageError(f"max_batch must be an integer of at least {search.STEP}. "
                         f"Received: max_batch={value!r}", f"an integer >= {search.STEP}")
    return value


def check_time_budget(value) -> Optional[float]:
    if value is None:
        return None
    try:
        t = float(value)
    except (TypeError, ValueError):
        t = float("nan")
    if not t > 0:
        raise UsageError(f"time_budget must be a positive number of seconds. "
                         f"Received: time_budget={value!r}", "seconds > 0, e.g. 600")
    return t


def spec_of(obj, what: str) -> str:
    """A spec a child process can import: built-in name, MODULE:FUNCTION or file.py:FUNCTION.
    A function defined in a notebook or a script's ``__main__`` cannot cross into a trial."""
    if isinstance(obj, str):
        return obj
    from app.task.entries import object_spec

    spec = object_spec(obj)
    module, _, name = spec.partition(":")
    if callable(obj) and module not in ("__main__", "python") and "<" not in name:
        return spec
    raise UsageError(f"{what} {obj!r} cannot be imported by a trial process (each trial is a "
                     "fresh process)", "a built-in name, 'MODULE:FUNCTION' or "
                     "'path/to/file.py:FUNCTION' (put a notebook's function in a .py file)")


# What a trial trains besides the model and the dataset: the other task settings and these
# training settings (``app.core.settings`` names), as ``tfmp tune`` and ``benchmark --best-batch``
# pass them to ``tune()``.
TRAIN_SETTINGS = ("image_size", "image_dir", "data_dir", "max_train_samples", "offline", "seed",
                  "learning_rate", "jit")
TRIAL_SETTINGS = tuple(s.name for s in settings_table.SETTINGS
                       if s.task and s.name not in ("model", "dataset")) + TRAIN_SETTINGS


def trial_settings(values: Mapping[str, Any]) -> Dict[str, Any]:
    """``tune()``'s keyword arguments for the trial settings in ``values`` (flags or a
    benchmark's settings), None for one not given: ``tune()`` resolves it as train would
    (``resolve_trial_settings``).  A default filled in here hid its TFMP_ variable."""
    return {name: values.get(name) for name in TRIAL_SETTINGS}


def resolve_trial_settings(model: str, dataset: str, given: Mapping[str, Any],
                           workspace: Optional[str] = None,
                           environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """What every trial trains besides the model and the dataset, resolved and checked as
    ``tfmp train`` resolves it (``config.resolve_config``: a flag or keyword of ``given``,
    else its TFMP_ variable, else the default), so that ``train --tuned`` in the same
    environment trains the job that was tuned: TFMP_MAX_TRAIN_SAMPLES=200 under tune and
    train alike.  A bad value is train's one line, a variable's naming the variable.
    Returns the trial settings, ``workspace`` (resolved the same way), ``data_dir`` None when
    neither gave one (the workspace's, made by a download), and ``said``: {setting: its
    TFMP_ variable} for those a variable gave, for a line a trial says about them."""
    environ = os.environ if environ is None else environ
    flags = {name: value for name, value in given.items() if value is not None}
    flags.update(model=model, dataset=dataset, workspace=workspace)
    cfg = config.resolve_config(flags, environ, use_tuned=False)   # tune.json is what tune writes
    resolved = {name: getattr(cfg, name) for name in TRIAL_SETTINGS}
    if "data_dir" not in cfg.given:
        resolved["data_dir"] = None
    resolved["workspace"] = cfg.workspace
    resolved["said"] = {name: settings_table.BY_NAME[name].env for name in TRIAL_SETTINGS
                        if flags.get(name) is None and name in cfg.given}
    return resolved


def check_reference_batch(value) -> int:
    """The batch the learning rate was set for: ``reference_batch_size``, else the train
    batch size setting (TFMP_BATCH_SIZE), else train's default."""
    if value is None:
        value = config.env_value("batch_size")
    if value is None:
        return config.TrainConfig().batch_size
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"reference_batch_size must be a positive integer. "
                         f"Received: reference_batch_size={value!r}",
                         "the batch size the learning rate was set for, e.g. 128")
    return value
