"""Training configuration: flag, then TFMP_* environment variable, then default.

``TrainConfig`` is what ``app.training.job.train`` takes; the CLI builds it with
``resolve_config``.  Validation happens here, before anything is written to disk.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Iterator, Mapping

from app.core import catalog as registry
from app.core import folders
from app.core import settings
from app.core.errors import UsageError
from app.training.distribute import STRATEGIES  # noqa: F401  (re-exported for the flags)

# Re-exported for the flags' help texts and choices (app.core.catalog holds the names).
MODELS = registry.MODEL_NAMES              # built-ins; MODULE:FUNCTION names the user's own
DATASETS = registry.DATASET_NAMES
PRECISIONS = registry.PRECISIONS
LOOPS = ("fit", "custom")
SCALE_LR = settings.BY_NAME["scale_lr"].choices
ENV_PREFIX = settings.ENV_PREFIX


@dataclass
class TrainConfig:
    model: str = "mlp"
    dataset: str = "mnist"
    precision: str = "auto"
    loop: str = "fit"
    epochs: int = 5
    batch_size: int = 128
    accumulate: int | None = None     # micro-batches per update; None: from global_batch, else 1
    global_batch: int | None = None   # per update; None: batch_size x replicas x accumulate
    learning_rate: float = 1e-3
    workspace: str = "workspace"
    data_dir: str | None = None       # default: <workspace>/data
    image_dir: str | None = None      # for dataset=images: folder of class subfolders
    output: str | None = None         # default: <workspace>/runs/<UTC>-<model>-<dataset>-<policy>
    log_every: int = 100
    max_train_samples: int | None = None
    max_val_samples: int | None = None
    seed: int = 0
    resume: bool = False
    max_skipped_steps: int = 20       # consecutive skipped steps before giving up
    early_stop: int = 0               # epochs without a better val_loss before stopping; 0: off
    early_stop_on: str = "val_loss"   # the epoch record's key --early-stop watches
    initial_loss_scale: float = registry.DEFAULT_INITIAL_LOSS_SCALE
    offline: bool = False
    save_model: bool = True
    image_size: int = 32
    progress: str = "auto"            # auto: progress bar on a TTY, plain lines otherwise
    steps_per_execution: int = 1      # fit only: steps per tf.function call
    jit: bool = False                 # XLA-compile the train step
    tf32: str = "on"                  # TF32 Tensor Cores for float32 (CC 8.0+): on | off
    profile_steps: str | None = None  # "A-B": a profile of those training steps
    sentinel: bool = True             # the numerics sentinel (app.training.sentinel)
    numerics_every: int = 100         # the sentinel's headroom probe, every N steps
    strategy: str = "auto"            # tf.distribute: auto | one | mirrored | multi-worker
    loss: str | None = None           # Keras loss name or MODULE:OBJECT; None: the default
    metrics: str | None = None        # comma-separated Keras names or MODULE:OBJECT
    input_shape: str | None = None    # "28,28,1": synthetic data for a user model
    num_classes: int | None = None    # default: from the labels
    float32_layers: str | None = None  # "a,b": layers run in float32; None: not given
    class_weight: str | None = None    # "balanced" or "0=1,3=10" (app.task.class_weights)
    tuned: str | None = None          # a tune.json: its precision and batch size (flags win)
    scale_lr: str = "none"            # with tuned: none | linear (learning rate x batch / 128)
    # Set by resolve_config from ``tuned``: metrics.json's "tuned" block (not a setting).
    tuning: dict | None = field(default=None, compare=False, repr=False)
    # Set by resolve_config: the settings given (flags, TFMP_ variables), not defaulted; what
    # --resume keeps of the run's own when it is not given (not recorded).
    given: tuple = field(default=(), compare=False, repr=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in NOT_SETTINGS:
            d.pop(name)
        return d


# TrainConfig's fields that resolve_config sets itself: no flag, variable or API keyword
# gives them, and metrics.json's "config" does not record them.
NOT_SETTINGS = ("tuning", "given")


def variable_settings(environ: Mapping[str, str]) -> tuple:
    """(each set TFMP_ variable -> its value as ``train`` reads it, None for a bad one;
    the UsageError of each variable ``train`` would refuse).  Each is checked as train
    checks it, beside the defaults; a refusal that does not name the variable is about
    another setting, which a flag may still give (TFMP_DATASET=images wants an
    --image-dir)."""
    variables: dict[str, Any] = {}
    errors = []
    for s in sorted(settings.BY_NAME.values(), key=lambda s: s.env or ""):
        if not s.env or environ.get(s.env, "") == "":
            continue
        try:
            resolve_config({}, {s.env: environ[s.env]})
        except UsageError as exc:
            if s.env in str(exc):
                variables[s.env] = None
                errors.append(exc)
                continue
        variables[s.env] = env_value(s.name, environ)
    return variables, errors


def check_variables(environ: Mapping[str, str] | None = None) -> None:
    """A command that runs training processes (``tune``) refuses a bad TFMP_ variable up
    front, in train's words, as ``train`` itself would: not from inside a trial."""
    errors = variable_settings(os.environ if environ is None else environ)[1]
    if errors:
        raise errors[0]


def env_name(field_name: str) -> str:
    """The TFMP_ variable of a setting (``app.core.settings``)."""
    return settings.BY_NAME[field_name].env


def env_value(field_name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The setting's value from its TFMP_ variable, or None when unset or empty."""
    environ = os.environ if environ is None else environ
    s = settings.BY_NAME[field_name]
    raw = environ.get(s.env, "")
    if raw == "":
        return None
    try:
        return s.read_env(raw)
    except ValueError:
        raise UsageError(f"environment variable {s.env}={raw!r} is not valid", s.allowed) from None


TUNED_FIELDS = ("tuned", "scale_lr")


def resolve_config(flags: Mapping[str, Any], environ: Mapping[str, str] | None = None, *,
                   use_tuned: bool = True, said: Mapping[str, str] | None = None
                   ) -> TrainConfig:
    """Build a validated TrainConfig.  ``flags`` holds only what was given on the command
    line (None = not given); then each setting's TFMP_ variable; then, for the precision and
    batch size, a ``tuned`` tune.json; then the default.  ``use_tuned`` False (the
    benchmark, which gives its runs every value explicitly) ignores --tuned/TFMP_TUNED.
    ``said``: ``settings.given_as``'s answer, whose words a refusal names another setting
    by (app.train's keywords; None: the flags)."""
    values: dict[str, Any] = {}
    from_variables: dict[str, str] = {}   # field -> the TFMP_ variable it came from
    for name in TrainConfig.__dataclass_fields__:
        if name in NOT_SETTINGS or (not use_tuned and name in TUNED_FIELDS):
            continue
        value = flags.get(name)
        if value is None and name in settings.BY_NAME:
            value = env_value(name, environ)
            if value is not None:
                from_variables[name] = env_name(name)
        if value is not None:
            values[name] = value
    if "float32_layers" in values:   # "a, b" or a list -> "a,b" (UsageError for a bad one)
        from app.task import float32_layers

        values["float32_layers"] = float32_layers.text(float32_layers.parse(
            values["float32_layers"], _as_given("float32_layers", from_variables, said)))
    if "class_weight" in values:   # "balanced", "3=10" or a dict -> its text (UsageError)
        from app.task import class_weights

        values["class_weight"] = class_weights.text(class_weights.parse(
            values["class_weight"], _as_given("class_weight", from_variables, said,
                                              class_weights.FLAG)))
    cfg = TrainConfig(**values, given=tuple(sorted(values)))
    validate(cfg, from_variables, said)
    if cfg.tuned:
        cfg = _with_tune(cfg, values, said)
    if cfg.data_dir is None:
        cfg.data_dir = default_data_dir(cfg.workspace)
    return cfg


def _as_given(name: str, from_variables: Mapping[str, str], said: Mapping[str, str] | None,
              default: str | None = None) -> str:
    """Setting ``name`` as the user gave it: its TFMP_ variable, its flag (``said``: tfmp
    train's), app.train's keyword, else ``default`` (the setting's name)."""
    if name in from_variables:
        return from_variables[name]
    if said is not None and name in said:
        return said[name]
    return default or name


def _with_tune(cfg: TrainConfig, given: Mapping[str, Any],
               said: Mapping[str, str] | None = None) -> TrainConfig:
    """``cfg`` with the tune's precision and batch size where none was given explicitly,
    the learning rate scaled as ``scale_lr`` says, and the record of it in ``tuning``."""
    from app.training import tuned

    applied = tuned.apply(cfg.tuned, model=cfg.model, dataset=cfg.dataset,
                          precision=given.get("precision"), batch_size=given.get("batch_size"),
                          learning_rate=cfg.learning_rate, scale_lr=cfg.scale_lr,
                          default_batch=TrainConfig.batch_size,
                          accumulation_given=given.get("accumulate") is not None
                          or given.get("global_batch") is not None,
                          # the N an update really sees, for --scale-lr linear
                          accumulate=given.get("accumulate"),
                          global_batch=given.get("global_batch"))
    cfg = replace(cfg, precision=applied.precision, batch_size=applied.batch_size,
                  learning_rate=applied.learning_rate, tuning=applied.record,
                  accumulate=applied.accumulate or cfg.accumulate)
    validate(cfg, words=said)
    return cfg


def default_data_dir(workspace: str) -> str:
    return os.path.join(workspace, "data")


def data_dir_chosen(cfg: TrainConfig) -> bool:
    """The user named a data directory (rather than the workspace default): then it must
    exist, and nothing is downloaded into a folder they did not ask for."""
    return cfg.data_dir is not None and cfg.data_dir != default_data_dir(cfg.workspace)


def utc_stamp(now: datetime | None = None) -> str:
    """The UTC time in the names of default run and benchmark folders: sortable, no colons."""
    return (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")


def short_name(spec: str) -> str:
    """A spec as one folder-name part, never a path: ``mlp`` -> mlp, ``nets/small.py:build``
    -> small.build, ``../data/digits.npz`` -> digits."""
    if ":" not in spec:   # a built-in name, or a file (a dataset's .npz): its name alone
        name = os.path.splitext(os.path.basename(os.path.normpath(spec)))[0]
    else:
        module, _, fn = spec.rpartition(":")
        if module.endswith(".py") or "/" in module:
            base = os.path.splitext(os.path.basename(module))[0]
        else:
            base = module.split(".")[-1]  # a dotted module: its last part
        name = f"{base}.{fn}" if fn not in ("build", "load", "build_model", "load_data") else base
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:40].lstrip(".")
    return name or "data"


def run_name(cfg: TrainConfig, policy: str, now: datetime | None = None) -> str:
    """Sortable, and says what ran: time, model, dataset, policy (TensorBoard's run list)."""
    return f"{utc_stamp(now)}-{short_name(cfg.model)}-{short_name(cfg.dataset)}-{policy}"


def default_base(cfg: TrainConfig, policy: str, now: datetime | None = None) -> str:
    """``<workspace>/runs/<run name>``: the default run folder before its ``-2``, ``-3``, ...
    (``unused`` finds the first free one, ``claim_unused`` makes it the run's own): two runs
    of the same model, data and policy started in the same second (quick runs from a
    notebook or a script) would otherwise collide in a folder neither user chose."""
    return os.path.join(cfg.workspace, "runs", run_name(cfg, policy, now))


def _numbered(base: str) -> Iterator[str]:
    yield base
    n = 2
    while True:
        yield f"{base}-{n}"
        n += 1


def unused(base: str) -> str:
    """``base``, or ``base-2``, ``base-3``, ... : the first that does not exist yet."""
    return next(path for path in _numbered(base) if not os.path.exists(path))


def claim_unused(base: str) -> str:
    """The first of ``base``, ``base-2``, ... that this process creates: ``unused`` only
    looks, so two runs started in the same second both pick ``base``; the claim is the
    folder's creation (``folders.make_new_folder``), which only one of them wins, and the
    other moves on to the next name.  A name taken in any way (a folder, locked or holding
    a run, a file, a dangling link) is passed by."""
    return next(path for path in _numbered(base)
                if not os.path.lexists(path) and folders.make_new_folder(path))


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UsageError(f"{name} must be one of {', '.join(allowed)}. Received: {name}={value!r}",
                         ", ".join(allowed))


def _spec_or_one_of(what: str, name: str, value: str, allowed: tuple[str, ...],
                    files: str = "") -> None:
    """A built-in name, or a spec read later (a MODULE:FUNCTION is imported by app.task.task
    after every cheap check); ``name``: the setting as given (a flag's or a variable's);
    ``files``: another form the setting takes (a dataset's .npz)."""
    if isinstance(value, str) and (":" in value or (files and value.lower().endswith(files))):
        return
    if value not in allowed:
        from app.task.user_code import not_a_spec

        raise not_a_spec(what, value, allowed, name, files)


def validate(cfg: TrainConfig, from_variables: Mapping[str, str] | None = None,
             words: Mapping[str, str] | None = None) -> None:
    """Every cheap check of ``cfg``: one UsageError, naming the setting as the user gave it,
    the TFMP_ variable for a value ``from_variables`` says came from one (a bad
    TFMP_PRECISION in .env was called "precision", which no flag of theirs said).  Another
    setting a line tells them to give is in the words of what they called (``words``:
    ``settings.given_as``'s answer; None: tfmp train's flags, ``settings.spelled``)."""
    named = dict(from_variables or {})

    def said(name: str) -> str:
        # "--numerics-every must be at least 1", not numerics_every, which nobody typed
        return _as_given(name, named, words)

    def flag(name: str, value: str | None = None) -> str:
        return settings.spelled(words, name, value)

    def subject(name: str, value: str | None = None) -> str:
        # A line about two settings names both as the user gives them: "--early-stop-on
        # applies with --early-stop only", not "early_stop_on applies with --early-stop".
        if name in named:
            return named[name] if value is None else f"{named[name]}={value}"
        return flag(name, value)

    for name, value in cfg.to_dict().items():
        if (isinstance(value, str) and not value.strip()   # the API's output="" and the like
                and name not in settings.EMPTY_IS_NONE):
            raise UsageError(f"{said(name)} is empty. Received: {said(name)}={value!r}",
                             settings.EMPTY_ALLOWED)
    _one_of(said("precision"), cfg.precision, PRECISIONS)
    _spec_or_one_of("model", said("model"), cfg.model, MODELS)
    _spec_or_one_of("dataset", said("dataset"), cfg.dataset, DATASETS, ".npz")
    _one_of(said("loop"), cfg.loop, LOOPS)
    _one_of(said("strategy"), cfg.strategy, STRATEGIES)
    _one_of(said("scale_lr"), cfg.scale_lr, SCALE_LR)
    _one_of(said("tf32"), cfg.tf32, settings.BY_NAME["tf32"].choices)
    if cfg.profile_steps is not None:
        try:
            settings.parse_step_range(cfg.profile_steps)
        except ValueError:
            raise UsageError(f"{said('profile_steps')} must be a range of steps. Received: "
                             f"{said('profile_steps')}={cfg.profile_steps!r}",
                             settings.STEP_RANGE_FORM) from None
    if cfg.scale_lr != "none" and not cfg.tuned:
        raise UsageError(f"{subject('scale_lr', cfg.scale_lr)} applies with {flag('tuned')} only",
                         f"{flag('scale_lr', 'linear')} together with "
                         f"{flag('tuned', 'DIR/tune.json')}")
    for name in ("epochs", "batch_size", "log_every", "max_skipped_steps", "steps_per_execution",
                 "image_size", "numerics_every"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or v < 1:
            raise UsageError(f"{said(name)} must be at least 1. Received: {said(name)}={v!r}",
                             "an integer >= 1")
        if v > LARGEST_GLOBAL_BATCH and name in ("batch_size", "steps_per_execution"):
            raise _too_large(said(name), v)
    if cfg.steps_per_execution > 1 and cfg.loop != "fit":
        raise UsageError(f"{subject('steps_per_execution')} applies to {flag('loop', 'fit')} "
                         "only. "
                         f"Received: {said('steps_per_execution')}={cfg.steps_per_execution}, "
                         f"{said('loop')}={cfg.loop!r}",
                         f"{flag('loop', 'fit')} with {flag('steps_per_execution')}, or leave "
                         "it at 1")
    # A tune gives the batch size later (_with_tune, then this check again): a global batch
    # is judged against the tune's micro-batch, not against the default it replaces.
    tune_pending = bool(cfg.tuned) and cfg.tuning is None and "batch_size" not in cfg.given
    check_accumulation(cfg, said=said, words=words, batch_known=not tune_pending)
    if not isinstance(cfg.early_stop, int) or cfg.early_stop < 0:
        raise UsageError(f"{said('early_stop')} must be 0 or more. Received: "
                         f"{said('early_stop')}={cfg.early_stop!r}",
                         "an integer >= 1, the epochs without a better val_loss before "
                         "stopping, or 0 (the default) for no early stop")
    if cfg.early_stop_on != "val_loss" and not cfg.early_stop:
        raise UsageError(f"{subject('early_stop_on')} applies with {flag('early_stop')} only. "
                         f"Received: {said('early_stop_on')}={cfg.early_stop_on!r}",
                         f"{flag('early_stop', 'N')} together with "
                         f"{flag('early_stop_on', 'METRIC')}")
    for name in ("max_train_samples", "max_val_samples"):
        v = getattr(cfg, name)
        if v is not None and v < 1:
            raise UsageError(f"{said(name)} must be at least 1. Received: {said(name)}={v!r}",
                             "an integer >= 1, or leave it unset for all samples")
    if not settings.FLOAT32_TINY <= cfg.learning_rate <= settings.FLOAT32_MAX:
        # inf, nan, 0 and what float32 rounds to 0 or inf would train nothing, or diverge
        raise UsageError(f"{said('learning_rate')} must be a finite number > 0 that float32 "
                         f"holds. Received: {said('learning_rate')}={cfg.learning_rate!r}",
                         "a number from 1.4e-45 to 3.4e+38, e.g. 0.001")
    seed = settings.seed_problem(said("seed"), cfg.seed)
    if seed:
        raise UsageError(*seed)
    if not (math.isfinite(cfg.initial_loss_scale) and
            0 < cfg.initial_loss_scale <= settings.FLOAT32_MAX):   # the scale is float32
        raise UsageError(f"{said('initial_loss_scale')} must be a finite number > 0. Received: "
                         f"{said('initial_loss_scale')}={cfg.initial_loss_scale!r}",
                         f"a number > 0, e.g. {registry.DEFAULT_INITIAL_LOSS_SCALE:g} (2**15)")
    if cfg.dataset == "images" and not cfg.image_dir:
        raise UsageError(f"dataset 'images' needs {flag('image_dir')}",
                         "a folder with one subfolder of images per class")
    check_data_dir(cfg, named.get("data_dir") or settings.listed(words, "data_dir"))
    if cfg.num_classes is not None and (not isinstance(cfg.num_classes, int) or cfg.num_classes < 1):
        raise UsageError(f"{said('num_classes')} must be at least 1. Received: "
                         f"{said('num_classes')}={cfg.num_classes!r}",
                         "an integer >= 1, or leave it unset to count the labels")
    if cfg.float32_layers is not None:
        from app.task import float32_layers

        float32_layers.parse(cfg.float32_layers)   # the names are found in the built model
    if cfg.input_shape is not None:
        from app.task.user_code import parse_input_shape

        parse_input_shape(cfg.input_shape, said("input_shape"))
    problem = registry.pairing_problem(cfg.model, cfg.dataset)   # pairs that cannot work
    if problem:
        raise UsageError(*problem)


def check_data_dir(cfg: TrainConfig, said: str = "--data-dir") -> None:
    """A data folder the user named must exist, whatever the dataset: synthetic data and a
    dataset function took a missing one without a word.  ``said``: the setting as they gave
    it (TFMP_DATA_DIR, --data-dir, data_dir)."""
    if not data_dir_chosen(cfg) or os.path.isdir(cfg.data_dir):
        return
    what = "is a file, not a folder" if os.path.exists(cfg.data_dir) else "does not exist"
    raise UsageError(f"{said} {cfg.data_dir!r} {what}",
                     "an existing folder holding the dataset files, or none given (then "
                     f"{default_data_dir(cfg.workspace)!r})")


# The largest --global-batch (and --accumulate, and their micro-batch x N): TensorFlow's int32.
LARGEST_GLOBAL_BATCH = 2 ** 31 - 1


def _too_large(named: str, value: int, note: str = "") -> UsageError:
    """The line for a count past LARGEST_GLOBAL_BATCH (a batch size, an accumulation, steps
    per execution).  TensorFlow counts steps and samples in int32 (2**31 micro-batches
    already train on NaN): a larger value ended in a traceback, after the run folder was
    made, or deep in the input pipeline."""
    return UsageError(f"{named} must be at most {LARGEST_GLOBAL_BATCH} (2**31-1). "
                      f"Received: {named}={value!r}",
                      f"an integer from 1 to {LARGEST_GLOBAL_BATCH}{note}")


def check_accumulation(cfg: TrainConfig, replicas: int | None = None,
                       said=lambda name: name, words: Mapping[str, str] | None = None,
                       batch_known: bool = True) -> int:
    """The number of micro-batches per update that ``--accumulate`` and ``--global-batch``
    say, checked (UsageError).  ``replicas`` None (before the strategy exists): the
    global batch is checked against the batch size alone.  ``said(name)``: the setting as
    the user gave it (its TFMP_ variable); ``words``: the others' (``validate``).
    ``batch_known`` False: only the values' own bounds (a tune sets the batch size later)."""
    n, total = cfg.accumulate, cfg.global_batch
    for name, v in (("accumulate", n), ("global_batch", total)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise UsageError(f"{said(name)} must be at least 1. Received: {said(name)}={v!r}",
                             "an integer >= 1" + (" (1: no accumulation)"
                                                  if name == "accumulate" else ""))
        if v is not None and v > LARGEST_GLOBAL_BATCH:
            raise _too_large(said(name), v, " (1: no accumulation)" if name == "accumulate"
                             else "")
    if not batch_known:   # the micro-batch is not settled yet: its checks come later
        return n or 1

    def option(name):   # its TFMP_ variable when it came from one, else its flag (keyword)
        return said(name) if said(name) != name else settings.listed(words, name)
    micro = cfg.batch_size * (replicas or 1)
    if total is None:
        if n is not None and micro * n > LARGEST_GLOBAL_BATCH:
            what = f"{option('batch_size')} {cfg.batch_size}" + (
                f" x {replicas} replicas" if replicas else "")
            raise UsageError(f"{said('accumulate')} {n} x the micro-batch {micro} ({what}) is a "
                             f"global batch of {micro * n}, more than {LARGEST_GLOBAL_BATCH} "
                             f"(2**31-1). Received: {said('accumulate')}={n}",
                             f"{option('accumulate')} from 1 to "
                             f"{max(1, LARGEST_GLOBAL_BATCH // micro)}, or a smaller "
                             f"{option('batch_size')}")
        return n or 1
    if total % micro:
        lower, upper = total // micro * micro, (total // micro + 1) * micro
        what = f"{option('batch_size')} {cfg.batch_size}" + (
            f" x {replicas} replicas" if replicas else "")
        raise UsageError(f"{said('global_batch')} {total} is not a multiple of the micro-batch "
                         f"{micro} ({what})", f"{option('global_batch')} " + " or ".join(
                             str(b) for b in (lower, upper) if b) + ", or a "
                         f"{option('batch_size')} that divides {total}")
    if n is not None and total != micro * n:
        raise UsageError(f"{said('global_batch')} {total} does not match "
                         f"{option('accumulate')} {n} x the micro-batch {micro} (= {micro * n})",
                         f"one of {option('global_batch')} or {option('accumulate')}, or "
                         "values that agree")
    return total // micro
