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

from typing import Any, Callable, Optional

from app.core.errors import UsageError


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


def _config(model, data, settings: dict):
    from app.training.config import TrainConfig, resolve_config
    from app.task.task import Task

    unknown = sorted(set(settings) - set(TrainConfig.__dataclass_fields__))
    if unknown:
        raise UsageError(f"unknown setting(s) {', '.join(unknown)}",
                         ", ".join(sorted(TrainConfig.__dataclass_fields__)))
    task = Task.from_objects(model, data, settings.get("loss"), settings.get("metrics"),
                             settings.get("input_shape"), settings.get("num_classes"),
                             settings.get("image_size") or 32, settings.get("float32_layers"))
    flags = dict(settings, model=task.model.spec, dataset=task.dataset.spec)
    if isinstance(flags.get("metrics"), (list, tuple)):
        flags["metrics"] = ",".join(str(m) for m in flags["metrics"])
    if isinstance(flags.get("input_shape"), (list, tuple)):
        flags["input_shape"] = ",".join(str(d) for d in flags["input_shape"])
    cfg = resolve_config(flags)
    # TFMP_FLOAT32_LAYERS applies when the keyword is not given, as on the command line.
    return cfg, task.with_float32_layers(cfg.float32_layers)


def train(model: Any = "mlp", data: Any = None, *, precision: Optional[str] = None,
          loop: str = "fit", epochs: int = 5, output: Optional[str] = None,
          on_step: Optional[Callable[[dict], None]] = None, **settings) -> dict:
    """Train; return the metrics dict (also written to ``<output>/metrics.json``).

    ``metrics["status"]`` is ``completed``, ``interrupted`` or ``diverged``.  A setting not
    given here comes from its ``TFMP_*`` variable, as on the command line (in the image,
    ``TFMP_WORKSPACE=/workspace`` puts runs where TensorBoard looks).  ``precision`` None:
    ``TFMP_PRECISION``, else the ``tuned=`` tune's choice, else ``auto``.  ``data`` None:
    ``dataset=`` if given (the command line's name), else ``"mnist"``.
    """
    from app.training.job import train as run_training

    _no_namesakes()
    data = _data_of(data, settings, "mnist")
    cfg, task = _config(model, data, dict(settings, precision=precision, loop=loop,
                                          epochs=epochs, output=output))
    return run_training(cfg, on_step=on_step, task=task)


def check(model: Any, data: Any = None, **settings) -> dict:
    """The mixed-precision doctor (``tfmp check``): the report as a dict."""
    from app.doctor.check import check as run_check

    _no_namesakes()
    return run_check(model=model, data=_data_of(data, settings, None), **settings)
