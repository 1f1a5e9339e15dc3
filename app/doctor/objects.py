"""Task entries from Python objects, for the API (``app.check``): a model function or a
built ``keras.Model``, and data as a load function, arrays or ``(train, val)`` datasets.

Spec strings go through ``app.tasks.resolve_model`` / ``resolve_dataset`` as on the command
line; objects become entries of the same kinds (``ModelEntry`` / ``DatasetEntry``), so the
rest of the machinery cannot tell them apart.
"""
from __future__ import annotations

from typing import Any

from app.errors import UsageError
from app.specs import source_file
from app.tasks import DatasetEntry, ModelEntry, resolve_dataset, resolve_model

MODEL_FORMS = ("a built-in name, 'MODULE:FUNCTION', 'file.py:FUNCTION', a function "
               "(input_shape, num_classes) -> keras.Model, or a keras.Model")
DATA_FORMS = ("None (synthetic data), a built-in name or 'MODULE:FUNCTION', a function "
              "returning the data, ((x_train, y_train), (x_val, y_val)) arrays, or "
              "(train, val) unbatched tf.data datasets")


def _name(obj) -> str:
    module = getattr(obj, "__module__", None) or "?"
    return f"{module}:{getattr(obj, '__qualname__', None) or getattr(obj, '__name__', type(obj).__name__)}"


def model_entry(model: Any) -> ModelEntry:
    if isinstance(model, str):
        return resolve_model(model)
    import tensorflow as tf

    if isinstance(model, tf.keras.Model):
        # Already built, so built under whatever policy was set then: check reports that.
        built = model

        def returns_it():
            return built
        return ModelEntry(f"<keras.Model {model.name!r}>", False, returns_it, None)
    if callable(model):
        return ModelEntry(_name(model), False, model, source_file(model))
    raise UsageError(f"model is a {type(model).__name__}", MODEL_FORMS)


def dataset_entry(data: Any) -> DatasetEntry:
    if data is None:
        return DatasetEntry("synthetic", True)
    if isinstance(data, str):
        return resolve_dataset(data)
    if callable(data):
        return DatasetEntry(_name(data), False, data, source_file(data))
    if isinstance(data, (tuple, list)) and len(data) == 2:
        held = data

        def returns_it():
            return held
        return DatasetEntry(f"<{type(data).__name__} of data>", False, returns_it, None)
    raise UsageError(f"data is a {type(data).__name__}", DATA_FORMS)


def task_from_objects(model, data=None, loss=None, metrics=None, input_shape=None,
                      num_classes=None):
    from app.tasks import Task, parse_input_shape, parse_metrics

    return Task(model_entry(model), dataset_entry(data), loss, parse_metrics(metrics),
                parse_input_shape(input_shape), num_classes)
