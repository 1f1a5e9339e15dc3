"""The Python API: the same machinery as ``tfmp``, for notebooks and scripts.

    import app
    metrics = app.train(model=build, data=load, precision="auto", epochs=3)
    report = app.check(model=build, data=load)

``model`` is a built-in name, a ``MODULE:FUNCTION`` spec, a function
``(input_shape, num_classes) -> keras.Model`` (called after the policy is set: what mixed
precision needs), or a keras.Model already built (trained in place, in the policy it was
built under; a warning says when that is not the run's); ``data`` a built-in name, a spec, a function,
or directly what a dataset function returns: ``((x_train, y_train), (x_val, y_val))``
arrays (either part may be ``(x, y, sample_weight)``), a ``(train, val)`` pair of
unbatched ``tf.data`` datasets or of Keras ``Sequence`` s (``dataset=`` is the same, by the
command line's name).  Every other
``tfmp train`` setting is a keyword (``batch_size=64``, ``loop="custom"``,
``strategy="mirrored"``, ``resume=True``, ``float32_layers=["predictions"]``,
``class_weight={3: 10.0}`` or ``"balanced"``, ``accumulate=8`` or ``global_batch=1024`` (gradient accumulation), ...).  Bad input raises ``app.core.errors.UsageError``
before anything is written.
"""
from __future__ import annotations

import functools
import inspect
import numbers
import os
from typing import Any, Callable, Optional

from app.core.errors import UsageError
from app.tuner.tuning import tune as _tune

# The keywords app.train takes besides the settings of tfmp train.
_TRAIN_KEYWORDS = ("model", "data", "dataset", "on_step")
# Settings that name a file or folder: text, or a pathlib.Path.
_PATHS = ("workspace", "output", "data_dir", "image_dir", "tuned")


def _warn_of_misspelled_variables() -> None:
    """A TFMP_ variable set in the kernel's environment that is a misspelling of one train
    reads (TFMP_EPOCHS) is one warning line, once per process, as on the command line."""
    from app.core import variables

    variables.warn_of_misspellings()


def _no_namesakes() -> None:
    """A notebook's folder comes first on its kernel's import path, as the current one does
    for ``python -m app``: a glob.py there, imported by TensorFlow in its module's place,
    would end the run at its first checkpoint (``app.core.shadowing``)."""
    from app.core import shadowing

    shadowing.refuse_namesakes(shadowing.user_folder())


def _data_of(data, settings: dict, default):
    """``data``, or ``dataset=`` (the command line's name for it, which a ``tfmp train
    --dataset`` user writes): taken out of ``settings``, where it used to be overwritten by
    ``data``'s default without a word.  Both given is one line."""
    if "dataset" not in settings:
        return default if data is None else data
    dataset = settings.pop("dataset")
    if data is not None:
        raise UsageError("data and dataset name the same thing (the training data); both "
                         "were given", "one of them: data=... (or dataset=..., the name "
                         "tfmp train --dataset uses)")
    return dataset


def _or_variable(name: str, value):
    """``value``, or for None (not given) the setting's ``TFMP_`` variable, else its default:
    the model and the data are app.train's objects, which resolve_config only sees as
    specs once the task is made of them."""
    if value is not None:
        return value
    from app.training.config import TrainConfig, env_value

    from_variable = env_value(name)
    return getattr(TrainConfig, name) if from_variable is None else from_variable


def _path_or_value(value):
    """A ``pathlib.Path`` (or any os.PathLike) as the text a path setting or spec takes."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _setting_value(name: str, value, field_type: str):
    """An API keyword's value as the setting takes it: text read as its TFMP_ variable is
    (``epochs="3"``, ``jit="false"``), a path as text; a number or a yes/no of the wrong
    type is one line, where it failed deep inside with TypeError, or (``jit="false"``, a
    true string) turned XLA on."""
    from app.core import settings

    kinds = {k.strip() for k in field_type.split("|")}
    value = _path_or_value(value)
    if name in _PATHS and value is not None and not isinstance(value, str):
        raise UsageError(f"{name} must be a path. Received: {name}={value!r} "
                         f"({type(value).__name__})", "a str or a pathlib.Path")
    if value is None or not kinds & {"int", "float", "bool"}:
        return value
    setting = settings.BY_NAME.get(name)
    if isinstance(value, str) and setting is not None:
        try:
            if "bool" in kinds:
                # In the keyword's own sense: sentinel="false" is off, though its variable
                # (TFMP_NO_SENTINEL) and flag (--no-sentinel) say the opposite word.
                return settings.parse_bool(value)
            return setting.read_env(value)
        except ValueError:
            raise UsageError(f"{name}={value!r} is not valid", setting.allowed) from None
    if "bool" in kinds:
        ok, wanted = isinstance(value, bool), "True or False"
    elif "int" in kinds:
        ok, wanted = isinstance(value, numbers.Integral) and not isinstance(value, bool), \
            "an integer"
    else:
        ok, wanted = isinstance(value, numbers.Real) and not isinstance(value, bool), "a number"
    if not ok:
        raise UsageError(f"{name} must be {wanted}. Received: {name}={value!r} "
                         f"({type(value).__name__})", wanted)
    if "bool" in kinds:
        return value
    return int(value) if "int" in kinds else float(value)   # numpy's own numbers: JSON's


def _config(model, data, settings: dict, said: dict):
    """(The TrainConfig, the Task) of app.train's arguments; ``said``: how each setting was
    given (``app.core.settings.given_as``: a keyword, or its TFMP_ variable)."""
    from app.training.config import NOT_SETTINGS, TrainConfig, resolve_config
    from app.task.task import Task

    fields = {n: f for n, f in TrainConfig.__dataclass_fields__.items() if n not in NOT_SETTINGS}
    unknown = sorted(set(settings) - set(fields))
    if unknown:
        raise UsageError(f"unknown setting(s) {', '.join(unknown)}",
                         ", ".join(_TRAIN_KEYWORDS + tuple(sorted(set(fields) - set(
                             _TRAIN_KEYWORDS)))))
    settings = {k: _setting_value(k, v, str(fields[k].type)) for k, v in settings.items()}
    model, data = _path_or_value(model), _path_or_value(data)
    task = Task.from_objects(model, data, settings.get("loss"), settings.get("metrics"),
                             settings.get("input_shape"), settings.get("num_classes"),
                             settings.get("image_size") or 32, settings.get("float32_layers"))
    flags = dict(settings, model=task.model.spec, dataset=task.dataset.spec)
    if isinstance(flags.get("metrics"), (list, tuple)):
        flags["metrics"] = ",".join(str(m) for m in flags["metrics"])
    if isinstance(flags.get("input_shape"), (list, tuple)):
        flags["input_shape"] = ",".join(str(d) for d in flags["input_shape"])
    cfg = resolve_config(flags, said=said)
    # TFMP_FLOAT32_LAYERS applies when the keyword is not given, as on the command line.
    return cfg, task.with_float32_layers(cfg.float32_layers, said.get("float32_layers"))


def train(model: Any = None, data: Any = None, *, precision: Optional[str] = None,
          loop: Optional[str] = None, epochs: Optional[int] = None,
          output: Optional[str] = None, on_step: Optional[Callable[[dict], None]] = None,
          **settings) -> dict:
    """Train; return the metrics dict (also written to ``<output>/metrics.json``).

    ``metrics["status"]`` is ``completed``, ``interrupted`` or ``diverged``.  A setting not
    given here (or given None) comes from its ``TFMP_*`` variable, then the default, as on
    the command line (in the image, ``TFMP_WORKSPACE=/workspace`` puts runs where
    TensorBoard looks): ``loop`` None is ``TFMP_LOOP``, else ``"fit"``; ``epochs`` None
    ``TFMP_EPOCHS``, else 5.  A keyword's default here is None for that reason: one
    written into the signature counted as given, and hid its variable.  ``precision`` None:
    ``TFMP_PRECISION``, else the ``tuned=`` tune's choice, else ``auto``.  ``model`` None:
    ``TFMP_MODEL``, else ``"mlp"``.  ``data`` None: ``dataset=`` if given (the command
    line's name), else ``TFMP_DATASET``, else ``"mnist"``.
    """
    _no_namesakes()
    _warn_of_misspelled_variables()
    if on_step is not None and not callable(on_step):
        raise UsageError(f"on_step is not a function. Received: on_step={on_step!r} "
                         f"({type(on_step).__name__})",
                         "a function taking one dict (each logged step's record), or None")
    from app.core.settings import given_as

    data = _data_of(data, settings, None)
    settings = dict(settings, precision=precision, loop=loop, epochs=epochs, output=output)
    said = given_as(dict(settings, model=model, dataset=data), os.environ, keyword=True)
    model, data = _or_variable("model", model), _or_variable("dataset", data)
    try:
        # The first call imports TensorFlow and the trainer: seconds in a new kernel, whose
        # Interrupt then is one line, as during the rest of the preparation (job.train).
        from app.training.job import train as run_training

        cfg, task = _config(model, data, settings, said)
    except KeyboardInterrupt:
        from app.training.interrupts import stopped_before_start

        return stopped_before_start(None, command_line=False)
    return run_training(cfg, on_step=on_step, task=task, said=said)


def check(model: Any, data: Any = None, **settings) -> dict:
    """The mixed-precision doctor (``tfmp check``): the report as a dict."""
    from app.doctor.check import check as run_check

    _no_namesakes()
    _warn_of_misspelled_variables()
    data = _data_of(data, settings, None)
    _known_keywords(run_check, dict(settings, model=model, data=data), "check")
    return run_check(model=_path_or_value(model), data=_path_or_value(data), **settings)


@functools.wraps(_tune)
def tune(*args, **kwargs) -> dict:
    _warn_of_misspelled_variables()
    _known_keywords(_tune, kwargs, "tune")
    return _tune(*map(_path_or_value, args),
                 **{k: _path_or_value(v) for k, v in kwargs.items()})


def _known_keywords(fn, given: dict, what: str) -> None:
    """A keyword ``fn`` does not take is one line naming the ones it does (as app.train's
    are), not Python's TypeError."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(given) - set(named))
    if unknown:
        raise UsageError(f"unknown setting(s) of app.{what}: {', '.join(unknown)}",
                         ", ".join(named))
