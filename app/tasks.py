"""What to train: the seam between "what" (model, data, loss, metrics) and "how" (the loops).

A ``Task`` answers the few questions the training loops, the benchmark and ``check`` ask:
build the model, load the data, give the loss and the metrics.  The built-in models
(``mlp``, ``cnn``, ``resnet``) and datasets (``mnist``, ``fashion_mnist``, ``cifar10``,
``synthetic``, ``images``) are entries of the same registry as a user's own
``MODULE:FUNCTION`` specs, so there is one code path for both.

    task = Task.from_specs(model="mlp", dataset="./mydata.py:load")
    bundle = task.load_data(global_batch=128, ...)
    with strategy.scope():
        built = task.build(bundle)   # model, optimizer (or None), loss, metrics factory

A model function is called as ``FUNCTION(input_shape, num_classes)`` with only the
parameters it declares, after the dtype policy is set and inside the strategy's scope.
It returns a ``keras.Model``, compiled or not: a compiled model brings its own optimizer,
loss and metrics.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from app import specs
from app.errors import UsageError

BUILTIN_MODELS = ("mlp", "cnn", "resnet")
BUILTIN_DATASETS = ("mnist", "fashion_mnist", "cifar10", "synthetic", "images")
# Natural sample shapes of the built-in datasets, for a user model given no --input-shape.
DATASET_SHAPES = {"mnist": (28, 28, 1), "fashion_mnist": (28, 28, 1), "cifar10": (32, 32, 3),
                  "synthetic": (28, 28, 1)}
DEFAULT_LOSS = "sparse_categorical_crossentropy"
DEFAULT_METRICS = ("accuracy",)
MODEL_ARGS = ("input_shape", "num_classes")
DATASET_ARGS = ("data_dir", "seed")


def _builtin_input_shape(name: str, image_size: int = 32) -> tuple:
    return {"mlp": (784,), "cnn": (28, 28, 1), "resnet": (image_size, image_size, 3)}[name]


@dataclass
class ModelEntry:
    spec: str
    builtin: bool
    function: Callable          # (input_shape, num_classes) -> keras.Model
    source: Optional[str] = None

    def preferred_input_shape(self, image_size: int = 32) -> Optional[tuple]:
        """Built-ins have the shape the seeds train them on; user models take the data's."""
        return _builtin_input_shape(self.spec, image_size) if self.builtin else None


@dataclass
class DatasetEntry:
    spec: str
    builtin: bool
    function: Optional[Callable] = None   # user specs: () -> arrays or tf.data datasets
    source: Optional[str] = None


def _user_function(spec: str, what: str, builtins: tuple, expected: str) -> Callable:
    """The function a MODULE:FUNCTION spec names; UsageError for anything else."""
    if not specs.is_user_spec(spec):
        raise UsageError(f"{what} must be one of {', '.join(builtins)} or MODULE:FUNCTION. "
                         f"Received: {what}={spec!r}", specs.SPEC_FORMS)
    fn = specs.load_object(spec, what)
    if not callable(fn):
        raise UsageError(f"{what} spec {spec!r} names a {type(fn).__name__}, not a function",
                         expected)
    return fn


def resolve_model(spec: str) -> ModelEntry:
    if spec in BUILTIN_MODELS:
        from app import models

        return ModelEntry(spec, True, models.BUILDERS[spec])
    fn = _user_function(spec, "model", BUILTIN_MODELS,
                        "a function (input_shape, num_classes) -> keras.Model")
    return ModelEntry(spec, False, fn, specs.source_file(fn))


def resolve_dataset(spec: str) -> DatasetEntry:
    if spec in BUILTIN_DATASETS:
        return DatasetEntry(spec, True)
    fn = _user_function(spec, "dataset", BUILTIN_DATASETS,
                        "a function returning ((x_train, y_train), (x_val, y_val)) or "
                        "(train, val) unbatched tf.data datasets")
    return DatasetEntry(spec, False, fn, specs.source_file(fn))


MODEL_FORMS = ("a built-in name, 'MODULE:FUNCTION', 'file.py:FUNCTION', a function "
               "(input_shape, num_classes) -> keras.Model, or a keras.Model")
DATA_FORMS = ("None (synthetic data), a built-in name or 'MODULE:FUNCTION', a function "
              "returning the data, ((x_train, y_train), (x_val, y_val)) arrays, or "
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
        built = model
        return ModelEntry(f"<keras.Model {model.name!r}>", False, lambda: built, None)
    if callable(model):
        return ModelEntry(object_spec(model), False, model, specs.source_file(model))
    raise UsageError(f"model is a {type(model).__name__}", MODEL_FORMS)


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


@dataclass
class BuiltModel:
    """What the loops need, built under the policy inside the strategy's scope."""
    model: Any
    optimizer: Any                 # the compiled model's, or None (the loop makes Adam)
    loss: Callable                 # per-example loss(y_true, y_pred), float32 y_pred
    loss_name: str
    make_metrics: Callable[[], list]  # fresh Keras metric objects (train and val each)
    notes: list = field(default_factory=list)
    warnings: list = field(default_factory=list)


class Task:
    """One model entry + one dataset entry + loss + metrics."""

    def __init__(self, model: ModelEntry, dataset: DatasetEntry, loss: Any = None,
                 metrics: Optional[Sequence] = None, input_shape: Optional[tuple] = None,
                 num_classes: Optional[int] = None, image_size: int = 32):
        self.model, self.dataset = model, dataset
        self.loss_spec, self.metrics_spec = loss, (list(metrics) if metrics is not None else None)
        self.input_shape, self.num_classes, self.image_size = input_shape, num_classes, image_size
        self.check_pairing()

    @classmethod
    def from_specs(cls, model: str, dataset: str, loss=None, metrics=None, input_shape=None,
                   num_classes=None, image_size: int = 32) -> "Task":
        return cls(resolve_model(model), resolve_dataset(dataset), loss, parse_metrics(metrics),
                   input_shape, num_classes, image_size)

    @classmethod
    def from_objects(cls, model, data, loss=None, metrics=None, input_shape=None,
                     num_classes=None, image_size: int = 32) -> "Task":
        """The Python API's task: ``model`` a spec or a function; ``data`` a spec, a function,
        or what a dataset function would return (arrays, or a (train, val) tf.data pair)."""
        return cls(model_entry(model), dataset_entry(data), loss, parse_metrics(metrics),
                   parse_input_shape(input_shape), num_classes, image_size)

    @classmethod
    def from_config(cls, cfg) -> "Task":
        return cls.from_specs(cfg.model, cfg.dataset, cfg.loss, cfg.metrics,
                              parse_input_shape(cfg.input_shape), cfg.num_classes, cfg.image_size)

    def check_pairing(self) -> None:
        """The built-in pairs that cannot work (a 28x28x1 model on colour images)."""
        m, d = self.model.spec, self.dataset.spec
        if not (self.model.builtin and self.dataset.builtin):
            return
        if m in ("mlp", "cnn") and d in ("cifar10", "images"):
            raise UsageError(f"model {m!r} expects 28x28x1 images, dataset {d!r} has colour images",
                             "resnet with cifar10/images")
        if m == "resnet" and d in ("mnist", "fashion_mnist"):
            raise UsageError(f"model 'resnet' expects 32x32x3 images, dataset {d!r} has 28x28x1",
                             "mlp or cnn with mnist/fashion_mnist")

    # --- description (metrics.json, --resume) ------------------------------------------------
    def describe(self) -> dict:
        return {"model": self.model.spec, "model_source": self.model.source,
                "dataset": self.dataset.spec, "dataset_source": self.dataset.source,
                "loss": _spec_text(self.loss_spec), "metrics": self.metrics_spec}

    @property
    def is_builtin(self) -> bool:
        return self.model.builtin and self.dataset.builtin

    # --- data --------------------------------------------------------------------------------
    def load_data(self, global_batch: int, data_dir: Optional[str] = None, *,
                  image_dir=None, max_train_samples=None, max_val_samples=None, seed: int = 0,
                  offline: bool = False, data_dir_explicit: bool = True):
        """Batched, shuffled, prefetched tf.data pipelines (``app.data.DataBundle``)."""
        from app import data as data_mod

        if self.dataset.builtin:
            shape = (self.model.preferred_input_shape(self.image_size) or self.input_shape
                     or DATASET_SHAPES.get(self.dataset.spec)
                     or (self.image_size, self.image_size, 3))
            return data_mod.load(self.dataset.spec, shape, global_batch, data_dir,
                                 image_dir=image_dir, max_train_samples=max_train_samples,
                                 max_val_samples=max_val_samples, seed=seed, offline=offline,
                                 data_dir_explicit=data_dir_explicit,
                                 num_classes=self.num_classes or 10)
        returned = specs.call_user(self.dataset.function, self.dataset.spec, "dataset",
                                   {"data_dir": data_dir, "seed": seed})
        from app.user_data import from_user

        return from_user(returned, self.dataset.spec, global_batch, seed=seed,
                                  max_train_samples=max_train_samples,
                                  max_val_samples=max_val_samples,
                                  input_shape=self._data_shape_for_model,
                                  num_classes=self.num_classes)

    def _data_shape_for_model(self, shape: tuple) -> tuple:
        """Built-in conv models fed user images without a channel axis get one."""
        if self.model.builtin and self.model.spec in ("cnn", "resnet") and len(shape) == 2:
            return tuple(shape) + (1,)
        return tuple(shape)

    # --- model -------------------------------------------------------------------------------
    def build(self, bundle, sample_batch=None) -> BuiltModel:
        """Call the model function (policy already set, inside the strategy's scope)."""
        import tensorflow as tf

        input_shape, num_classes = tuple(bundle.input_shape), int(bundle.num_classes)
        model = specs.call_user(self.model.function, self.model.spec, "model",
                                {"input_shape": input_shape, "num_classes": num_classes})
        if not isinstance(model, tf.keras.Model):
            raise UsageError(f"model spec {self.model.spec!r} returned "
                             f"{type(model).__module__}.{type(model).__name__}, not a keras.Model",
                             "a function returning a tf.keras.Model (Sequential, functional or "
                             "subclassed), compiled or not")
        notes: list = []
        # One forward pass on a few samples: it builds a subclassed model, and its output
        # gives the unit count, the dtype and whether the outputs are probabilities.
        prediction = (_forward(model, sample_batch[0], self.model.spec)
                      if sample_batch is not None else None)
        units = _output_units(model, prediction)
        compiled_loss, compiled_metrics, optimizer = _compiled_parts(model)
        self._check_output_fits(units, bundle)
        loss_spec = self.loss_spec if self.loss_spec is not None else compiled_loss
        loss_fn, loss_name = self._make_loss(loss_spec, model, bundle, units, prediction, notes)
        metric_specs = (self.metrics_spec if self.metrics_spec is not None
                        else compiled_metrics if compiled_metrics is not None
                        else list(DEFAULT_METRICS))
        if compiled_loss is not None or optimizer is not None:
            notes.append("the model came compiled: its "
                         + ", ".join(w for w, v in (("optimizer", optimizer),
                                                     ("loss", compiled_loss),
                                                     ("metrics", compiled_metrics)) if v)
                         + " are used")

        def make_metrics():
            return [_metric(m, bundle, units) for m in metric_specs]
        make_metrics()  # resolve now: a bad name is a usage error before anything is written
        warnings = []
        out_dtype = _output_dtype(model, prediction)
        if out_dtype in ("float16", "bfloat16"):
            warnings.append(
                f"the model's output (layer {output_layer_name(model)!r}) is {out_dtype}; it is "
                "cast to float32 before the loss. Give that layer dtype='float32', or add a "
                "float32 Activation('linear') after it, so the softmax/logits are computed in "
                "float32 (`python -m app check` lists every finding)")
        return BuiltModel(model, optimizer, loss_fn, loss_name, make_metrics, notes, warnings)

    def _check_output_fits(self, units, bundle):
        if units is None or bundle.label_kind == "other":
            return
        need = int(bundle.num_classes)
        if bundle.label_kind == "binary" and units == 1:
            return
        if units != need:
            spec = self.model.spec
            raise UsageError(f"model {spec!r} has {units} output unit(s) but the labels of "
                             f"dataset {self.dataset.spec!r} have {need} classes "
                             f"(0..{need - 1})",
                             f"a model whose last layer has {need} units (use num_classes), "
                             "or labels 0..units-1")

    def _make_loss(self, loss_spec, model, bundle, units, prediction, notes):
        import tensorflow as tf

        if loss_spec is None:
            if bundle.label_kind == "onehot":
                name = "categorical_crossentropy"
            elif bundle.label_kind == "binary" and units == 1:
                name = "binary_crossentropy"
            else:
                name = DEFAULT_LOSS
            from_logits = not _outputs_look_like_probabilities(model, prediction)
            cls = {"categorical_crossentropy": tf.keras.losses.CategoricalCrossentropy,
                   "binary_crossentropy": tf.keras.losses.BinaryCrossentropy,
                   DEFAULT_LOSS: tf.keras.losses.SparseCategoricalCrossentropy}[name]
            loss = cls(from_logits=from_logits, reduction="none")
            if not self.is_builtin:
                notes.append(f"loss: {name} on "
                             + ("logits (from_logits=True): the model's outputs are not "
                                "probabilities" if from_logits else
                                "probabilities (the model's outputs sum to 1)"))
            return _per_example(loss), name + (" (from logits)" if from_logits else "")
        loss = _keras_object(loss_spec, "loss", tf.keras.losses.get,
                             "a Keras loss name (e.g. sparse_categorical_crossentropy, mse) "
                             "or MODULE:OBJECT")
        if isinstance(loss, tf.keras.losses.Loss):
            cfg = loss.get_config()
            cfg["reduction"] = "none"
            try:
                loss = type(loss).from_config(cfg)
            except Exception:  # a custom Loss without a round-tripping config: use as is
                pass
        if not callable(loss):
            raise UsageError(f"loss {_spec_text(loss_spec)!r} is a {type(loss).__name__}, not a loss",
                             "a Keras loss name, a keras.losses.Loss, or a function "
                             "(y_true, y_pred) -> per-example loss")
        name = _spec_text(loss_spec)
        return _per_example(loss), name


# ---- helpers ---------------------------------------------------------------------------------

def parse_input_shape(text) -> Optional[tuple]:
    if text is None or isinstance(text, tuple):
        return text
    if isinstance(text, (list,)):
        return tuple(int(v) for v in text)
    try:
        shape = tuple(int(p) for p in str(text).replace("x", ",").split(",") if p.strip())
    except ValueError:
        shape = ()
    if not shape or any(d < 1 for d in shape):
        raise UsageError(f"input_shape must be positive integers separated by commas. "
                         f"Received: input_shape={text!r}", "e.g. 28,28,1 or 784")
    return shape


def _spec_text(spec) -> Optional[str]:
    if spec is None or isinstance(spec, str):
        return spec
    return getattr(spec, "name", None) or getattr(spec, "__name__", None) or type(spec).__name__


def _forward(model, x, spec):
    try:
        return model(x[:2], training=False)
    except Exception as exc:
        from app.errors import UserCodeError

        raise UserCodeError(spec, "running the model on one batch", exc) from exc


def _compiled_parts(model):
    """(loss, metrics, optimizer) the user compiled the model with, each None if absent."""
    if not getattr(model, "optimizer", None) and not getattr(model, "compiled_loss", None) \
            and not getattr(model, "_is_compiled", False) and not getattr(model, "compiled", False):
        return None, None, None
    loss = getattr(model, "loss", None) or None
    metrics = None
    # Keras 3 keeps them in _compile_metrics (compiled_metrics is a deprecated stand-in);
    # Keras 2 in compiled_metrics.
    for attr in ("_compile_metrics", "compiled_metrics"):
        metrics = getattr(getattr(model, attr, None), "_user_metrics", None)
        if metrics:
            break
    if isinstance(metrics, dict):
        metrics = None  # per-output dict: not supported, fall back to the default
    optimizer = getattr(model, "optimizer", None)
    return loss, (list(metrics) if metrics else None), optimizer


def _output_units(model, prediction=None) -> Optional[int]:
    try:
        shape = model.outputs[0].shape if getattr(model, "outputs", None) else None
    except (AttributeError, ValueError):
        shape = None
    if shape is None and prediction is not None:
        shape = prediction.shape
    if shape is None or len(shape) < 2 or shape[-1] is None:
        return None
    return int(shape[-1])


def _outputs_look_like_probabilities(model, prediction) -> bool:
    """Softmax outputs are non-negative and sum to 1; logits almost never do."""
    import numpy as np
    import tensorflow as tf

    if prediction is None:
        last = model.layers[-1] if model.layers else None
        act = getattr(getattr(last, "activation", None), "__name__", "")
        return act == "softmax" or type(last).__name__ == "Softmax"
    y = np.asarray(tf.cast(prediction, tf.float32))
    if y.ndim < 2 or y.shape[-1] == 1:
        return bool(((y >= 0) & (y <= 1)).all())
    return bool((y >= -1e-3).all() and np.allclose(y.sum(axis=-1), 1.0, atol=2e-2))


def output_layer_name(model) -> str:
    """The layer that produces the model's output (what the user must make float32)."""
    names = getattr(model, "output_names", None)
    if names:
        return str(names[0])
    layers = getattr(model, "layers", None)
    return layers[-1].name if layers else model.name


def _output_dtype(model, prediction) -> Optional[str]:
    try:
        if getattr(model, "outputs", None):
            return str(getattr(model.outputs[0].dtype, "name", model.outputs[0].dtype))
    except (AttributeError, ValueError):
        pass
    return None if prediction is None else prediction.dtype.name


def _per_example(loss):
    """Per-example losses computed on float32 predictions whatever the model's output dtype
    (a 16-bit softmax or log-softmax loses the small probabilities; build() warns)."""
    import tensorflow as tf

    def per_example(y_true, y_pred):
        if y_pred.dtype != tf.float32:
            y_pred = tf.cast(y_pred, tf.float32)
        return loss(y_true, y_pred)
    per_example.__name__ = getattr(loss, "__name__", None) or getattr(loss, "name", "loss")
    return per_example


def _keras_object(spec, what: str, keras_get, allowed: str):
    """A loss or metric named by ``spec``: ``MODULE:OBJECT`` (a class is instantiated with no
    arguments), a Keras identifier through ``keras_get``, or an object given directly."""
    obj = spec
    if isinstance(spec, str) and specs.is_user_spec(spec):
        obj = specs.load_object(spec, what)
    elif isinstance(spec, str):
        try:
            obj = keras_get(spec)
        except (ValueError, TypeError):
            raise UsageError(f"{what} {spec!r} is not a Keras {what}", allowed) from None
    if isinstance(obj, type):
        obj = specs.call_user(obj, _spec_text(spec), what, {})
    return obj


def _metric(spec, bundle, units):
    """A fresh Keras metric object for ``spec`` (the loops each need their own)."""
    import tensorflow as tf

    if spec in ("accuracy", "acc"):
        if bundle.label_kind == "onehot":
            return tf.keras.metrics.CategoricalAccuracy(name="accuracy")
        if bundle.label_kind == "binary" and units == 1:
            return tf.keras.metrics.BinaryAccuracy(name="accuracy")
        return tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    obj = _keras_object(spec, "metric", tf.keras.metrics.get,
                        "Keras metric names (e.g. accuracy, mae, auc) or MODULE:OBJECT, "
                        "comma-separated")
    if isinstance(obj, tf.keras.metrics.Metric):
        return type(obj).from_config(obj.get_config())
    if callable(obj):
        name = spec if isinstance(spec, str) and not specs.is_user_spec(spec) else \
            getattr(obj, "__name__", "metric")
        return tf.keras.metrics.MeanMetricWrapper(obj, name=name)
    raise UsageError(f"metric {spec!r} is a {type(obj).__name__}, not a metric",
                     "a Keras metric name, a keras.metrics.Metric, or a function")
