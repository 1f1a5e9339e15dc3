"""What to train: the seam between "what" (model, data, loss, metrics) and "how" (the loops).

A ``Task`` answers the few questions the training loops, the benchmark and ``check`` ask:
build the model, load the data, give the loss and the metrics.  The built-in models and
datasets (``app.core.catalog``) are entries (``app.task.entries``) like a user's own
``MODULE:FUNCTION`` specs, so there is one code path for both; the loss and the metrics
come from ``app.task.losses``.

    task = Task.from_specs(model="mlp", dataset="./mydata.py:load")
    bundle = task.load_data(global_batch=128, ...)
    with strategy.scope():
        built = task.build(bundle)   # model, optimizer (or None), loss, metrics factory

A model function is called as ``FUNCTION(input_shape, num_classes)`` with only the
parameters it declares, after the dtype policy is set and inside the strategy's scope.
It returns a ``keras.Model``, compiled or not: a compiled model brings its own optimizer,
loss and metrics.  The layers ``float32_layers`` names then get the float32 policy, before
the model's first call (``app.task.float32_layers``: ``--float32-layers``).
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from app.task import float32_layers as f32
from app.task import losses
from app.core import catalog as registry
from app.task import user_code as specs
from app.task.entries import (DatasetEntry, ModelEntry, dataset_entry, model_entry,  # noqa: F401
                              parse_metrics, resolve_dataset, resolve_model)
from app.core.errors import UsageError, UserCodeError
from app.task.user_code import parse_input_shape  # noqa: F401  (re-exported)
from app.task.data import several_inputs, shape_text


@dataclass
class BuiltModel:
    """What the loops need, built under the policy inside the strategy's scope."""
    model: Any
    optimizer: Any                 # the compiled model's, or None (the loop makes Adam)
    loss: Callable                 # per-example loss(y_true, y_pred), float32 y_pred
    make_metrics: Callable[[], list]  # fresh Keras metric objects (train and val each)
    notes: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    float32_layers: list = field(default_factory=list)   # full paths --float32-layers set
    metric_names: list = field(default_factory=list)     # the metrics' names, as logged


class Task:
    """One model entry + one dataset entry + loss + metrics."""

    def __init__(self, model: ModelEntry, dataset: DatasetEntry, loss: Any = None,
                 metrics: Optional[Sequence] = None, input_shape: Optional[tuple] = None,
                 num_classes: Optional[int] = None, image_size: int = 32,
                 float32_layers: Any = None):
        self.model, self.dataset = model, dataset
        self.loss_spec, self.metrics_spec = loss, (list(metrics) if metrics is not None else None)
        self.input_shape, self.num_classes, self.image_size = input_shape, num_classes, image_size
        self.float32_layers = f32.parse(float32_layers)   # names; found in the built model
        # How the user gave them (the flag, TFMP_FLOAT32_LAYERS, app.train's keyword, a
        # resumed run's record): a name the model lacks is refused in those words.
        self.float32_said = f32.FLAG
        _check_pairing(model, dataset)

    @classmethod
    def from_specs(cls, model: str, dataset: str, loss=None, metrics=None, input_shape=None,
                   num_classes=None, image_size: int = 32, float32_layers=None) -> "Task":
        return cls(resolve_model(model), resolve_dataset(dataset), loss, parse_metrics(metrics),
                   input_shape, num_classes, image_size, float32_layers)

    @classmethod
    def from_objects(cls, model, data, loss=None, metrics=None, input_shape=None,
                     num_classes=None, image_size: int = 32, float32_layers=None) -> "Task":
        """The Python API's task: ``model`` a spec or a function; ``data`` a spec, a function,
        or what a dataset function would return (arrays, or a (train, val) tf.data pair)."""
        return cls(model_entry(model), dataset_entry(data), loss, parse_metrics(metrics),
                   parse_input_shape(input_shape), num_classes, image_size, float32_layers)

    @classmethod
    def from_config(cls, cfg, said: Optional[Mapping[str, str]] = None) -> "Task":
        """``said``: how the user gave each setting (``app.core.settings.given_as``)."""
        task = cls.from_specs(cfg.model, cfg.dataset, cfg.loss, cfg.metrics, parse_input_shape(
            cfg.input_shape), cfg.num_classes, cfg.image_size, cfg.float32_layers)
        task.float32_said = (said or {}).get("float32_layers", f32.FLAG)
        return task

    def with_float32_layers(self, names, said: Optional[str] = None) -> "Task":
        """This task with other float32 layers (a resumed run keeps the run's own);
        ``said``: how the user gave them (None: as this task's were)."""
        other = copy.copy(self)
        other.float32_layers = f32.parse(names)
        other.float32_said = said or self.float32_said
        return other

    def describe(self) -> dict:
        """The task in metrics.json (what --resume compares)."""
        return {"model": self.model.spec, "model_source": self.model.source,
                "dataset": self.dataset.spec, "dataset_source": self.dataset.source,
                "loss": losses.spec_text(self.loss_spec), "metrics": self.metrics_spec,
                "float32_layers": list(self.float32_layers)}

    is_builtin = property(lambda self: self.model.builtin and self.dataset.builtin)

    # --- data --------------------------------------------------------------------------------
    def load_data(self, global_batch: int, data_dir: Optional[str] = None, *,
                  image_dir=None, max_train_samples=None, max_val_samples=None, seed: int = 0,
                  offline: bool = False, data_dir_explicit: bool = True):
        """Batched, shuffled, prefetched tf.data pipelines (``app.task.data.DataBundle``)."""
        from app.task import data as data_mod

        if self.dataset.builtin:
            shape = (self.model.preferred_input_shape(self.image_size) or self.input_shape
                     or registry.DATASET_SHAPES.get(self.dataset.spec)
                     or (self.image_size, self.image_size, 3))
            bundle = data_mod.load(self.dataset.spec, shape, global_batch, data_dir,
                                   image_dir=image_dir, max_train_samples=max_train_samples,
                                   max_val_samples=max_val_samples, seed=seed, offline=offline,
                                   data_dir_explicit=data_dir_explicit,
                                   num_classes=self.num_classes or (
                                       self.model.built_classes
                                       if self.dataset.spec == "synthetic" else None) or 10)
        else:
            returned = specs.call_user(self.dataset.function, self.dataset.spec, "dataset",
                                       {"data_dir": data_dir, "seed": seed})
            from app.task.user_data import from_user

            bundle = from_user(returned, self.dataset.spec, global_batch, seed=seed,
                               max_train_samples=max_train_samples,
                               max_val_samples=max_val_samples,
                               input_shape=functools.partial(_data_shape_for_model, self.model),
                               num_classes=self.num_classes)
        self._check_input_shape_applies(bundle.input_shape)
        return bundle

    def _check_input_shape_applies(self, used) -> None:
        """An input shape the user gave that the run does not use (a built-in model has its
        own, your own data has its own) is refused, not ignored without a word."""
        if not self.input_shape or several_inputs(used) or tuple(self.input_shape) == tuple(used):
            return
        given = ",".join(map(str, self.input_shape))
        whose = (f"the built-in model {self.model.spec!r} takes" if self.model.builtin and
                 self.model.preferred_input_shape(self.image_size) else
                 f"the samples of {self.dataset.spec!r} are")
        raise UsageError(f"input shape {given} is not used: {whose} {shape_text(used)}",
                         f"leave --input-shape out, or {','.join(map(str, used))} (it shapes "
                         "--dataset synthetic, and the built-in datasets, for your own model)")

    # --- model -------------------------------------------------------------------------------
    def check_runnable(self, bundle) -> None:
        """Build the model under the policy now set, check its layers' kinds and run it on
        two samples (raises ``PrecisionUnsupported``), nothing more: how ``auto`` tries
        bfloat16 on a user's model.  The model is dropped."""
        import tensorflow as tf

        from app.precision import policy as precision

        # Keras' state as the build for training finds it: a learning phase an earlier call
        # left set would build one branch only of a layer that acts in training alone.
        # Keras 3 keeps the global policy in the state it clears: set again.
        policy = precision.global_policy_name()
        tf.keras.backend.clear_session()
        precision.apply_policy(policy)
        model, provisional = _call_model(self.model, bundle, self.float32_layers)
        model, _ = _before_first_call(model, self.float32_layers, self.model.spec, provisional,
                                      self.float32_said)
        if bundle.sample_batch is not None:   # ops of custom layers: their kernels run
            _check_inputs_fit(model, bundle.sample_batch[0], self.model.spec, self.dataset.spec)
            _forward(model, bundle.sample_batch[0], self.model.spec)
            _trial_step(model, bundle.sample_batch[0], self.model.spec)

    def build(self, bundle, sample_batch=None) -> BuiltModel:
        """Call the model function (policy already set, inside the strategy's scope)."""
        model, provisional = _call_model(self.model, bundle, self.float32_layers)
        # Read before --float32-layers may clone the model (a clone is not compiled).
        compiled_loss, compiled_metrics, optimizer = _compiled_parts(model)
        model, float32_paths = _before_first_call(model, self.float32_layers, self.model.spec,
                                                  provisional, self.float32_said)
        # One forward pass on a few samples: it builds a subclassed model, and its output
        # gives the unit count, the dtype and whether the outputs are probabilities.
        if sample_batch is not None:
            _check_inputs_fit(model, sample_batch[0], self.model.spec, self.dataset.spec)
        prediction = (_forward(model, sample_batch[0], self.model.spec)
                      if sample_batch is not None else None)
        _check_one_output(prediction, self.model.spec)
        _check_output_is_a_row(prediction, bundle, self.model.spec, self.dataset.spec)
        units = _output_units(model, prediction)
        _check_output_fits(units, bundle, self.model.spec, self.dataset.spec)
        notes: list = []
        probabilities = losses.outputs_look_like_probabilities(model, prediction,
                                                               bundle.label_kind)
        loss_fn = losses.make_loss(self.loss_spec if self.loss_spec is not None else compiled_loss,
                                   bundle, units, probabilities, notes,
                                   explain=not self.is_builtin)
        metric_specs = (self.metrics_spec if self.metrics_spec is not None
                        else compiled_metrics if compiled_metrics is not None
                        else losses.default_metrics(bundle, units))
        notes += _compiled_note(optimizer, compiled_loss, compiled_metrics)
        notes += [f"{f32.FLAG}: {', '.join(float32_paths)} compute in float32, the rest of "
                  "the model under the policy"] if float32_paths else []

        def make_metrics():
            return [losses.make_metric(m, bundle, units, probabilities) for m in metric_specs]
        # Resolved now: a bad name is a usage error before anything is written.
        metric_names = [m.name for m in make_metrics()]
        from app.precision.policy import global_policy_name
        from app.task.model_layers import policy_mismatch

        warnings = _output_warnings(model, prediction)
        mismatch = policy_mismatch(model, global_policy_name(), float32_paths)
        if mismatch:
            warnings.insert(0, mismatch)
        return BuiltModel(model, optimizer, loss_fn, make_metrics, notes, warnings,
                          float32_paths, metric_names)


def _before_first_call(model, float32_layers, spec: str, provisional=(),
                       said: str = f32.FLAG) -> list:
    """The float32 layers set (so every step traces them in float32, and the kernels check
    sees the dtypes the model will run in), then the kernels check: a layer whose dtype this
    TensorFlow has no kernels for here (bfloat16 convolutions on TF 2.9 without AVX-512) is
    one line, not "your code raised".  Returns (the model, which ``f32.apply`` may have
    cloned, the float32 layers' full paths)."""
    from app.task import model_layers

    model, paths = f32.apply(model, float32_layers, spec, provisional, said)
    model_layers.check_model(model, spec)
    return model, paths


def _check_pairing(model: ModelEntry, dataset: DatasetEntry) -> None:
    """The built-in pairs that cannot work (a 28x28x1 model on colour images)."""
    if model.builtin and dataset.builtin:
        problem = registry.pairing_problem(model.spec, dataset.spec)
        if problem:
            raise UsageError(*problem)


def _compiled_note(optimizer, loss, metrics) -> list:
    """A compiled model brings its own optimizer, loss and metrics: say which are used."""
    if loss is None and optimizer is None:
        return []
    came = [w for w, v in (("optimizer", optimizer), ("loss", loss), ("metrics", metrics)) if v]
    return ["the model came compiled: its " + ", ".join(came) + " are used"]


def _data_shape_for_model(entry, shape: tuple) -> tuple:
    """Built-in conv models fed user images without a channel axis get one."""
    if entry.builtin and len(registry.builtin_input_shape(entry.spec)) == 3 and len(shape) == 2:
        return tuple(shape) + (1,)
    return tuple(shape)


def _text_features(bundle) -> bool:
    import tensorflow as tf

    sample = bundle.sample_batch
    return sample is not None and any(getattr(t, "dtype", None) == tf.string
                                      for t in tf.nest.flatten(sample[0]))


def _call_model(entry, bundle, float32_layers=()):
    """(The model function's keras.Model for the data's shape and class count, the layers
    made float32 provisionally as it was wired): the layers ``float32_layers`` names compute
    in float32 as the function wires them (``f32.while_building``)."""
    import tensorflow as tf

    several = several_inputs(bundle.input_shape)
    if several and entry.builtin:
        names = ", ".join(map(repr, sorted(bundle.input_shape)))
        raise UsageError(f"the built-in model {entry.spec!r} takes its features as one "
                         f"array; the dataset gives them by input name ({names})",
                         "the features as one array (x_train, not x_train/NAME), or your own "
                         "model of those inputs, by name (docs/your-model.md)")
    if entry.builtin and _text_features(bundle):
        raise UsageError(f"the built-in model {entry.spec!r} takes numbers; the dataset's "
                         "features are text",
                         "numbers (token ids, or features), or your own model that reads "
                         "strings with a TextVectorization or StringLookup layer "
                         "(docs/your-model.md)")
    try:
        with f32.while_building(float32_layers) as provisional:
            model = specs.call_user(entry.function, entry.spec, "model",
                                    {"input_shape": (bundle.input_shape if several
                                                     else tuple(bundle.input_shape)),
                                     "num_classes": int(bundle.num_classes)})
    except UserCodeError as exc:
        from app.task.model_layers import refusal_from_build_error

        refusal = refusal_from_build_error(exc.original, entry.spec)
        if refusal is not None:   # a layer whose ops take no bfloat16, made as it was called
            raise refusal from None
        if several:   # a function written for one input, given the shapes of several
            raise UserCodeError(entry.spec, f"{exc.during} with input_shape="
                                f"{bundle.input_shape!r}, the shapes of the dataset's several "
                                "inputs", exc.original) from exc.original
        raise
    if not isinstance(model, tf.keras.Model):
        raise UsageError(f"model spec {entry.spec!r} returned "
                         f"{type(model).__module__}.{type(model).__name__}, not a keras.Model",
                         "a function returning a tf.keras.Model (Sequential, functional or "
                         "subclassed), compiled or not")
    return model, provisional


def _check_output_fits(units, bundle, model_spec: str, dataset_spec: str):
    if units is None or bundle.label_kind == "other":
        return
    need = int(bundle.num_classes)
    if bundle.label_kind == "binary" and units == 1:
        return
    if units != need:
        tags = bundle.label_kind == "multilabel"
        labels = f"are multi-hot rows of {need}" if tags else f"have {need} classes (0..{need - 1})"
        raise UsageError(f"model {model_spec!r} has {units} output unit(s) but the labels of "
                         f"dataset {dataset_spec!r} {labels}",
                         f"a model whose last layer has {need} units (use num_classes), "
                         + ("or multi-hot rows as wide as its units" if tags
                            else "or labels 0..units-1"))


def _check_output_is_a_row(prediction, bundle, model_spec: str, dataset_spec: str):
    """Class labels take one row of scores a sample.  A model without a Flatten (or a
    pooling) before its last Dense outputs a grid of rows: one line saying so, not Keras'
    "labels.shape must equal logits.shape" from inside the first step, exit 1."""
    if prediction is None or bundle.label_kind == "other" or len(prediction.shape) <= 2:
        return
    per_sample = "x".join(str(d) for d in prediction.shape[1:])
    labels = (f"a one-hot row of {bundle.num_classes}" if bundle.label_kind == "onehot"
              else f"a multi-hot row of {bundle.num_classes}"
              if bundle.label_kind == "multilabel" else "one class id")
    synthetic = (" (synthetic data's sample shape is --input-shape, default 28,28,1: give "
                 "the shape your model takes)" if dataset_spec == "synthetic" else "")
    raise UsageError(f"model {model_spec!r} outputs {per_sample} a sample for samples of "
                     f"{shape_text(bundle.input_shape)}, but the labels of dataset "
                     f"{dataset_spec!r} are {labels} a sample{synthetic}",
                     f"a model whose output is one row of {bundle.num_classes} a sample: "
                     "Flatten() or GlobalAveragePooling2D() before its last Dense")


def _input_struct(model) -> dict:
    """The inputs of a model built on a dict of them (``Model({"num": a, ...}, ...)``), by
    the keys its data is matched by whatever the Input layers are named; {} for any other."""
    for attribute in ("_inputs_struct", "_nested_inputs"):   # Keras 3, Keras 2
        struct = getattr(model, attribute, None)
        if isinstance(struct, dict):
            return dict(struct)
    return {}


def _input_keys(model) -> list:
    """The keys of a model built on a dict of inputs; [] for any other model."""
    return list(_input_struct(model))


def _check_inputs_fit(model, x, model_spec: str, dataset_spec: str):
    """A graph model (functional, Sequential) takes as many inputs as the data's features
    give: say so in one line rather than in Keras' error from inside the model."""
    import tensorflow as tf

    try:
        inputs = model.inputs   # Keras 3: AttributeError on a subclassed model; Keras 2: None
    except AttributeError:
        inputs = None
    if not inputs:   # a subclassed model: its call() decides
        return
    given = tf.nest.flatten(x)
    names = [str(getattr(t, "name", "?")).split(":")[0] for t in inputs]
    if len(inputs) == len(given):
        keys = _input_keys(model) or names
        if isinstance(x, dict) and set(keys) != set(x):   # Keras: "Missing data for input"
            raise UsageError(f"model {model_spec!r} takes inputs named "
                             f"{', '.join(map(repr, sorted(keys)))}; dataset {dataset_spec!r} "
                             f"gives {', '.join(map(repr, sorted(x)))}",
                             "the features keyed by the model's input names "
                             "(tf.keras.Input(..., name=...)), docs/your-model.md")
        if isinstance(x, dict):   # each Input by its key, or by its name
            by_key = _input_struct(model) or dict(zip(names, inputs))
            pairs = [(k, by_key[k], x[k]) for k in keys if k in by_key]
        else:
            pairs = list(zip(names, inputs, given))
        for name, tensor, data in pairs:
            _check_input_shape_fits(tensor, data, name if len(inputs) > 1 else None,
                                    model_spec, dataset_spec)
        return
    data = (f"a dict of {len(given)} ({', '.join(map(repr, sorted(x)))})" if isinstance(x, dict)
            else "one tensor" if len(given) == 1 else f"{len(given)} tensors")
    raise UsageError(f"model {model_spec!r} takes {len(inputs)} input(s) "
                     f"({', '.join(map(repr, names))}); dataset {dataset_spec!r} gives "
                     f"features as {data}",
                     "features as one tensor for a model of one input, or a dict of tensors "
                     "keyed by the model's input names (docs/your-model.md)")


def _as_input_shape(shape) -> str:
    """``(7,)``, ``(None, 3)``: as the user writes ``tf.keras.Input(shape=...)``, open axes
    included, where ``data.shape_text``'s ``28x28x1`` names a dataset's fixed shape."""
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + (
        ",)" if len(shape) == 1 else ")")


def _check_input_shape_fits(tensor, data, name, model_spec: str, dataset_spec: str) -> None:
    """A sample's shape against the model's Input's: one line naming both, where Keras'
    "expected shape=(None, 7), found shape=(None, 8)" came from inside the model as "your
    code raised".  An axis the Input leaves open (None) takes any size; a trailing axis of 1
    more or less is Keras' to add or drop, as it does."""
    try:
        wanted = tuple(None if d is None else int(d) for d in tuple(tensor.shape)[1:])
    except (TypeError, ValueError):   # a shape of unknown rank
        return
    got = tuple(int(d) for d in getattr(data, "shape", ())[1:])
    if len(wanted) == len(got) + 1 and wanted[-1] == 1:
        wanted = wanted[:-1]
    elif len(got) == len(wanted) + 1 and got[-1] == 1:
        got = got[:-1]
    if len(wanted) == len(got) and all(w is None or w == g for w, g in zip(wanted, got)):
        return
    which = f" input {name!r}" if name else ""
    raise UsageError(f"model {model_spec!r} takes samples of shape {_as_input_shape(wanted)}"
                     f"{' at' + which if which else ''}; dataset {dataset_spec!r} gives samples "
                     f"of shape {_as_input_shape(got)}",
                     f"data of shape {_as_input_shape(wanted)}, or a model whose Input takes "
                     f"{_as_input_shape(got)} (tf.keras.Input(shape=input_shape) in the "
                     "model function takes the data's)")


def _check_one_output(prediction, spec: str) -> None:
    """The loss, the metrics and the sentinel take the model's output as one tensor against
    one label: a dict or list of outputs (a model of several heads) is one line."""
    import tensorflow as tf

    if prediction is None or tf.is_tensor(prediction):
        return
    if isinstance(prediction, dict):
        got = f"a dict of {len(prediction)} output(s) ({', '.join(map(repr, prediction))})"
    elif isinstance(prediction, (list, tuple)):
        got = f"a {type(prediction).__name__} of {len(prediction)} output(s)"
    else:
        got = type(prediction).__name__
    raise UsageError(f"model {spec!r} returns {got}; tfmp trains a model of one output "
                     "against one label",
                     "a model whose output is one tensor: return outputs['name'] (or the "
                     "one head to train) from the model function")


def _forward(model, x, spec):
    import tensorflow as tf

    from app.task.model_layers import refusal_from_build_error

    try:
        return model(tf.nest.map_structure(lambda t: t[:2], x), training=False)
    except Exception as exc:
        refusal = refusal_from_build_error(exc, spec, model)
        if refusal is not None:   # an op with no bfloat16 kernel, not the user's bug
            raise refusal from None
        raise UserCodeError(spec, "running the model on one batch", exc) from exc


def _trial_step(model, x, spec) -> None:
    """A training step's forward and backward on two samples, traced as training traces
    them: the ops of layers that act in training alone (augmentation, dropout, noise) and
    the gradients' ops run, which an inference call never reaches."""
    import tensorflow as tf

    from app.task.model_layers import refusal_from_build_error

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            out = model(x, training=True)
            total = tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in tf.nest.flatten(out)])
        return tape.gradient(total, model.trainable_variables)
    try:
        step(tf.nest.map_structure(lambda t: tf.convert_to_tensor(t[:2]), x))
    except Exception as exc:
        refusal = refusal_from_build_error(exc, spec, model)
        if refusal is not None:
            raise refusal from None
        raise UserCodeError(spec, "running one training step on two samples", exc) from exc


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


def output_layer_name(model) -> str:
    """The layer that produces the model's output (what the user must make float32)."""
    names = getattr(model, "output_names", None)
    if names:
        return str(names[0])
    layers = getattr(model, "layers", None)
    return layers[-1].name if layers else model.name


def _output_dtype(model, prediction) -> Optional[str]:
    # The output of a real call first: a functional model's symbolic outputs keep the
    # dtypes of the layers as built, before --float32-layers changed some of them.
    from app.task.model_layers import dtype_name

    if prediction is not None:
        first = _first_tensor(prediction)
        if first is not None:
            return dtype_name(first.dtype)
    try:
        if getattr(model, "outputs", None):
            return dtype_name(model.outputs[0].dtype)
    except (AttributeError, ValueError):
        pass
    return None


def _output_warnings(model, prediction) -> list:
    out_dtype = _output_dtype(model, prediction)
    if out_dtype not in registry.SIXTEEN_BIT:
        return []
    name = output_layer_name(model)
    return [f"the model's output (layer {name!r}) is {out_dtype}; it is "
            "cast to float32 before the loss. Run that layer in float32 without editing the "
            f"model ({f32.flag([name])}), or give it dtype='float32', or add a "
            "float32 Activation('linear') after it, so the softmax/logits are computed in "
            "float32 (`tfmp check` lists every finding)"]


def _first_tensor(value):
    """The first tensor of a (possibly nested) model output, or None."""
    import tensorflow as tf

    flat = tf.nest.flatten(value)
    return flat[0] if flat and hasattr(flat[0], "dtype") else None
