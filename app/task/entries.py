"""The entries a task is made of: a model and a dataset, each a built-in (``app.core.catalog``)
or the user's own (a ``MODULE:FUNCTION`` spec, or for the Python API a function, a built
model or the data itself), so both take one code path.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Callable, Optional

from app.core import catalog as registry
from app.task import array_file
from app.task import user_code as specs
from app.core.errors import UsageError


@dataclass
class ModelEntry:
    spec: str
    builtin: bool
    function: Callable          # (input_shape, num_classes) -> keras.Model
    source: Optional[str] = None
    built_shape: Optional[tuple] = None   # a model passed already built: its input's shape
    built_classes: Optional[int] = None   # ... and its output units (2 or more), the classes

    def preferred_input_shape(self, image_size: int = 32) -> Optional[tuple]:
        """Built-ins have the shape the guide trains them on, a model passed built its own;
        user functions take the data's."""
        return (registry.builtin_input_shape(self.spec, image_size) if self.builtin
                else self.built_shape)


@dataclass
class DatasetEntry:
    spec: str
    builtin: bool
    function: Optional[Callable] = None   # user specs: () -> arrays or tf.data datasets
    source: Optional[str] = None


def _user_function(spec: str, what: str, builtins: tuple, expected: str,
                   files: str = "") -> Callable:
    """The function a MODULE:FUNCTION spec names; UsageError for anything else.  ``files``:
    the file suffix the spec may also take, for the message."""
    if not specs.is_user_spec(spec):
        raise specs.not_a_spec(what, spec, builtins, files=files)
    fn = specs.load_object(spec, what)
    if not callable(fn):
        raise UsageError(f"{what} spec {spec!r} names a {type(fn).__name__}, not a function",
                         expected)
    return fn


def resolve_model(spec: str) -> ModelEntry:
    if spec in registry.MODEL_NAMES:
        from app.task import models

        return ModelEntry(spec, True, models.BUILDERS[spec])
    fn = _user_function(spec, "model", registry.MODEL_NAMES,
                        "a function (input_shape, num_classes) -> keras.Model")
    return ModelEntry(spec, False, fn, specs.source_file(fn))


def resolve_dataset(spec: str) -> DatasetEntry:
    if spec in registry.DATASET_NAMES:
        return DatasetEntry(spec, True)
    if array_file.is_array_file(spec):
        array_file.check_layout(spec)   # a wrong file is one line before anything is written
        return DatasetEntry(spec, False, functools.partial(array_file.load, spec),
                            os.path.abspath(os.path.expanduser(spec)))
    fn = _user_function(spec, "dataset", registry.DATASET_NAMES,
                        "a function returning ((x_train, y_train), (x_val, y_val)) or "
                        "(train, val) unbatched tf.data datasets", array_file.SUFFIX)
    return DatasetEntry(spec, False, fn, specs.source_file(fn))


MODEL_FORMS = ("a built-in name, 'MODULE:FUNCTION', 'file.py:FUNCTION', a function "
               "(input_shape, num_classes) -> keras.Model, or a keras.Model")
DATA_FORMS = ("None (synthetic data), a built-in name, 'MODULE:FUNCTION' or 'file.npz', a "
              "function returning the data, ((x_train, y_train), (x_val, y_val)) arrays, or "
              "(train, val) unbatched tf.data datasets")


def object_spec(obj) -> str:
    """A spec-like name for a Python object (recorded in metrics.json, compared by --resume)."""
    module = getattr(obj, "__module__", None) or "python"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", type(obj).__name__)
    return f"{module}:{name}"


def model_entry(model) -> ModelEntry:
    """The Python API's model: a spec, a function, or an already built keras.Model (built
    under whatever policy was set then: check reports that)."""
    if isinstance(model, str):
        return resolve_model(model)
    import tensorflow as tf

    if isinstance(model, tf.keras.Model):
        return ModelEntry(f"python:keras.Model {model.name!r}", False,
                          lambda: _already_built(model), None, _input_shape(model),
                          _output_units(model))
    if callable(model):
        return ModelEntry(object_spec(model), False, model, specs.source_file(model))
    raise UsageError(f"model is a {type(model).__name__}", MODEL_FORMS)


def _already_built(model):
    """A model passed built: its variables exist, outside the run's strategy, which cannot
    place them on several devices."""
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas > 1:
        raise UsageError(f"the keras.Model {model.name!r} was passed already built: its "
                         f"variables cannot be spread over the strategy's {replicas} replicas",
                         "a function (input_shape, num_classes) -> keras.Model that builds it, "
                         "which the run calls inside the strategy's scope")
    return model


def _input_shape(model) -> Optional[tuple]:
    """A built model's sample shape (without the batch axis), when it has one and it is
    known in full; else None."""
    try:
        shape = model.input_shape
    except (AttributeError, ValueError, RuntimeError):
        return None
    if not isinstance(shape, tuple) or not shape or any(d is None for d in shape[1:]):
        return None
    return tuple(int(d) for d in shape[1:])


def _output_units(model) -> Optional[int]:
    """A built model's output units, when it has one output of a row of 2 or more scores a
    sample (the class count synthetic data takes for it); else None."""
    try:
        shape = model.output_shape
    except (AttributeError, ValueError, RuntimeError):
        return None
    if not isinstance(shape, tuple) or len(shape) != 2 or not isinstance(shape[-1], int):
        return None
    return shape[-1] if shape[-1] >= 2 else None


def dataset_entry(data) -> DatasetEntry:
    """The Python API's data: None (synthetic), a spec, a function, or what a dataset
    function returns (arrays, or a (train, val) tf.data pair)."""
    if data is None:
        return DatasetEntry("synthetic", True)
    if isinstance(data, str):
        return resolve_dataset(data)
    if callable(data):
        return DatasetEntry(object_spec(data), False, data, specs.source_file(data))
    if isinstance(data, (tuple, list)) and len(data) == 2:
        held = data
        kind = "tf.data" if type(data[0]).__module__.startswith("tensorflow") else "arrays"
        return DatasetEntry(f"python:{kind}", False, lambda: held, None)
    raise UsageError(f"data is a {type(data).__name__}", DATA_FORMS)


def parse_metrics(text: Optional[str]) -> Optional[list]:
    """``"accuracy,mae"`` -> list; None stays None (the default / the compiled model's)."""
    if text is None:
        return None
    if isinstance(text, (list, tuple)):
        return list(text)
    names = [t.strip() for t in text.split(",") if t.strip()]
    return names
