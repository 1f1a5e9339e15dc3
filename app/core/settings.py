"""Every training setting, declared once: its flag, its TFMP_ variable, its help, how a
value is read, and whether the benchmark passes it to its child runs.

``app.training.config`` resolves the variables from this table, ``app.commands.train`` (and the
task flags of ``benchmark`` and ``check``) build their argparse flags from it, and the
benchmark's pass-through to its ``tfmp train`` children is the table's ``passed`` column.
Defaults live on ``app.training.config.TrainConfig``; ``{default}`` in a help text is filled in
from there.  No TensorFlow here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

ENV_PREFIX = "TFMP_"
SEED_MAX = 2 ** 32 - 1   # numpy's and TensorFlow's seeds are 32-bit unsigned integers
# float32's smallest positive (subnormal) and largest finite values: a learning rate outside
# them is 0 or inf in the optimizer's float32 arithmetic.
FLOAT32_TINY, FLOAT32_MAX = 1.401298464324817e-45, 3.4028234663852886e+38


BOOL_FORMS = "1/0, true/false, yes/no or on/off"


def parse_bool(v: str) -> bool:
    low = v.strip().lower()
    if low in {"1", "true", "yes", "on"}:
        return True
    if low in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(v)


def _parse_negated(v: str) -> bool:
    return not parse_bool(v)


EMPTY_ALLOWED = "a value, or leave it out for its default"
# Settings whose empty value says "none" (a --resume given it drops the run's own); every
# other text setting refuses an empty value.
EMPTY_IS_NONE = ("float32_layers", "class_weight")


def non_empty(v: str) -> str:
    """A text flag's value.  Empty is refused, not read as "not given": ``--output "$OUT"``
    with OUT unset sent the run to the default folder, in a container one not mounted."""
    if not v.strip():
        import argparse

        raise argparse.ArgumentTypeError("is empty")
    return v


STEP_RANGE_FORM = "A-B with 1 <= A <= B, e.g. 10-15 (training steps, counted from 1)"


def parse_step_range(v: str) -> Tuple[int, int]:
    """``"10-15"`` -> (10, 15); ``"7"`` -> (7, 7).  ValueError for anything else."""
    text = str(v).strip()
    first, sep, last = text.partition("-")
    try:
        a, b = int(first), int(last if sep else first)
    except ValueError:
        raise ValueError(v) from None
    if a < 1 or b < a:
        raise ValueError(v)
    return a, b


@dataclass(frozen=True)
class Setting:
    name: str                       # the TrainConfig field
    group: str                      # what | how | where | output (the --help sections)
    help: str
    parse: Callable[[str], Any] = str   # argparse ``type`` and the variable's reader
    flag_name: Optional[str] = None     # default: --<name with dashes>
    switch: bool = False                # a flag without a value (store_true/store_false)
    env_parse: Optional[Callable[[str], Any]] = None   # default: ``parse`` (parse_bool for switches)
    env_name: Optional[str] = None      # default: TFMP_<FLAG>
    passed: bool = False                # the benchmark passes it to every child run
    task: bool = False                  # one of the task flags shared by train/benchmark/check
    metavar: Optional[str] = None
    choices: Optional[Tuple[str, ...]] = None

    @property
    def flag(self) -> str:
        return self.flag_name or "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return self.env_name or ENV_PREFIX + self.flag[2:].replace("-", "_").upper()

    def read_env(self, raw: str) -> Any:
        """The variable's text as a value (ValueError when it is not one)."""
        if self.env_parse is not None:
            return self.env_parse(raw)
        value = parse_bool(raw) if self.switch else self.parse(raw)
        if self.choices and value not in self.choices:
            raise ValueError(raw)
        return value

    @property
    def allowed(self) -> str:
        if self.choices:
            return ", ".join(self.choices)
        reader = self.env_parse or (parse_bool if self.switch else self.parse)
        return {int: "an integer", float: "a number", parse_bool: BOOL_FORMS,
                _parse_negated: BOOL_FORMS}.get(reader, "text")


_SPEC_FORMS = "MODULE:FUNCTION / file.py:FUNCTION"

SETTINGS: Tuple[Setting, ...] = (
    # what to train
    Setting("model", "what", "{models} or " + _SPEC_FORMS + " (default {default})",
            metavar="SPEC", passed=True, task=True),
    Setting("dataset", "what", "{datasets}, " + _SPEC_FORMS + " or data.npz (arrays x_train, "
            "y_train, x_val, y_val) (default {default})",
            metavar="SPEC", passed=True, task=True),
    Setting("loss", "what", "Keras loss name or MODULE:OBJECT (default: the compiled model's, "
            "else the cross-entropy that fits class-id or one-hot labels, from logits when "
            "the outputs are not probabilities; labels that are values need one, e.g. mse)", metavar="SPEC", passed=True, task=True),
    Setting("metrics", "what", "comma-separated Keras metric names or MODULE:OBJECT (default: "
            "the compiled model's, else accuracy; mae for labels that are values)", metavar="LIST", passed=True, task=True),
    Setting("input_shape", "what", "sample shape for --dataset synthetic with your own model "
            "(default 28,28,1); other data gives its own, and a different one given there is "
            "refused", metavar="D,D,...", passed=True,
            task=True),
    Setting("num_classes", "what", "number of classes (default: counted from the labels)",
            int, metavar="N", passed=True, task=True),
    Setting("float32_layers", "what", "run these layers of the model in float32, the rest "
            "under the policy, without editing the model: full paths (outer/inner) or plain "
            "names; `tfmp check` names the layers and prints this flag; a train --resume "
            "without it keeps the run's own, with '' drops them", metavar="NAME[,NAME...]", passed=True, task=True),
    Setting("image_dir", "what", "for --dataset images: folder with one subfolder per class",
            passed=True),
    Setting("image_size", "what", "images are resized to this square size ({default})", int,
            passed=True),
    # how to train
    Setting("precision", "how", "one of {precisions} (default {default})"),
    Setting("loop", "how", "one of {loops} (default {default})", passed=True),
    Setting("epochs", "how", "number of epochs (default {default})", int, passed=True),
    Setting("batch_size", "how", "batch size per replica (default {default}); the global batch "
            "is this times the number of replicas", int, passed=True),
    Setting("accumulate", "how", "gradient accumulation: N micro-batches of --batch-size per "
            "optimizer update, so the update sees a global batch N times larger than fits "
            "(default 1: none; docs/training.md)", int, passed=True),
    Setting("class_weight", "how", "weigh each training sample by its class, as Keras' "
            "fit(class_weight=...): 'balanced' (n / (classes * the class's samples)) or "
            "CLASS=WEIGHT pairs, e.g. 3=10 (classes not listed weigh 1); multiplies the "
            "data's own sample weights", metavar="balanced|C=W,...", passed=True),
    Setting("global_batch", "how", "the batch each update sees, the other way to say "
            "--accumulate: a multiple of --batch-size times the replicas (default: --batch-size "
            "times the replicas times --accumulate)", int, metavar="B"),
    # Not passed: the benchmark gives its runs batch sizes of their own (--best-batch), which
    # one global batch would contradict; --accumulate is passed.
    Setting("strategy", "how", "tf.distribute strategy, one of {strategies} (default {default}: "
            "mirrored with several GPUs, multi-worker when TF_CONFIG describes a cluster, else "
            "one device)"),
    Setting("learning_rate", "how", "Adam learning rate ({default})", float, passed=True),
    Setting("seed", "how", "random seed (default {default})", int, passed=True),
    Setting("max_train_samples", "how", "use at most this many training samples", int,
            passed=True),
    Setting("max_val_samples", "how", "use at most this many validation samples", int,
            passed=True),
    # Not passed: the benchmark gives every run its precision and batch size explicitly
    # (``benchmark --tuned`` reads the tune itself), and its children never see TFMP_TUNED.
    Setting("tuned", "how", "a tune.json of `tfmp tune` (or its folder) for this --model and "
            "--dataset: train with its chosen precision and batch size; --precision and "
            "--batch-size given here or as TFMP_ variables win", metavar="FILE"),
    Setting("scale_lr", "how", "with --tuned: linear scales the learning rate with the batch "
            "(relative to the batch it was set for: 128, or the tune's reference_batch_size); "
            "none keeps it (default {default})", choices=("none", "linear")),
    Setting("initial_loss_scale", "how", "first loss scale for mixed_float16 (default "
            "{default:g})", float),
    Setting("max_skipped_steps", "how", "stop when this many steps in a row have non-finite "
            "gradients (default {default})", int),
    # Not passed: the benchmark times a fixed number of epochs.
    Setting("early_stop", "how", "stop when val_loss (or --early-stop-on) has not improved for "
            "N epochs in a row, and save the best epoch's weights as the model (default "
            "{default}: off; docs/training.md)", int, metavar="N"),
    Setting("early_stop_on", "how", "the number --early-stop watches: val_loss, or val_ and a "
            "metric of the run, e.g. val_accuracy, val_auc (default {default}); accuracies, "
            "AUC, precision, recall and the like must rise, the others fall",
            metavar="METRIC"),
    Setting("steps_per_execution", "how", "--loop fit: training steps per tf.function call; "
            "step logs and skipped-step checks then happen once per call (default {default})",
            int, passed=True),
    Setting("jit", "how", "XLA-compile the train step (on a GPU it needs libdevice and ptxas: "
            "`tfmp env` says whether XLA can compile here; on a CPU it is often slower)",
            switch=True, passed=True),
    # Not passed: the benchmark sets it per run (--fp32-baseline).
    Setting("tf32", "how", "float32 matmuls and convolutions on TF32 Tensor Cores (compute "
            "capability 8.0+): on, TensorFlow's default, or off for strict float32 (default "
            "{default})", choices=("on", "off")),
    Setting("sentinel", "how", "do not watch the numerics (the sentinel: every step's loss and "
            "gradients, each layer's headroom, a replay of the step that went non-finite; "
            "docs/numerics.md)", flag_name="--no-sentinel", switch=True,
            env_parse=_parse_negated, passed=True),
    # where
    Setting("workspace", "where", "base folder (default {default})", passed=True),
    Setting("data_dir", "where", "dataset files (default <workspace>/data)", passed=True),
    Setting("output", "where",
            "run folder (default <workspace>/runs/<UTC>-<model>-<dataset>-<policy>)"),
    Setting("offline", "where", "never download; fail if the dataset files are missing",
            switch=True, passed=True),
    Setting("resume", "where", "continue the run in --output from its last checkpoint",
            switch=True),
    Setting("save_model", "where", "do not save the final model", flag_name="--no-save-model",
            switch=True, env_parse=_parse_negated),
    # output
    Setting("log_every", "output", "log loss, gradient norm and loss scale every N steps "
            "({default})", int),
    Setting("numerics_every", "output", "the sentinel measures each layer's headroom against "
            "its dtype's largest value every N steps, checked at the step logs (default "
            "{default})", int, passed=True),
    Setting("profile_steps", "output", "write a profile of training steps A to B (TensorBoard's "
            "Profile tab) into the run's tensorboard/ folder; on a GPU it needs CUPTI's "
            "profiling rights", metavar="A-B"),
    Setting("progress", "output", "progress bar, plain lines, or auto (bar on a terminal)",
            choices=("auto", "bar", "lines")),
)
BY_NAME: Dict[str, Setting] = {s.name: s for s in SETTINGS}
_METAVARS = {"image_dir": "DIR", "workspace": "DIR", "data_dir": "DIR", "output": "DIR",
             "precision": "POLICY", "loop": "LOOP", "strategy": "NAME", "learning_rate": "LR",
             "initial_loss_scale": "SCALE"}
GROUP_TITLES = {"what": "what to train", "how": "how to train", "where": "where",
                "output": "output"}
PASSED: Tuple[Setting, ...] = tuple(s for s in SETTINGS if s.passed)


def passed_flags(values: Dict[str, Any]) -> list:
    """The flags that give a child ``tfmp train`` run the settings in ``values`` (the
    benchmark's pass-through): a value flag when set, a switch when true."""
    out: list = []
    for s in PASSED:
        v = values.get(s.name)
        if s.switch:
            if v:
                out.append(s.flag)
        elif v is not None:
            out += [s.flag, str(v)]
    return out


def add_flag(group, s: Setting, defaults, help_context: Dict[str, Any], show_env: bool = True):
    """One argparse flag for ``s`` (default None: resolved later, flag > variable > default);
    ``{default}`` in its help is the field of ``defaults`` (a TrainConfig)."""
    text = s.help.format(default=getattr(defaults, s.name), **help_context)
    if show_env:
        text += f" [{s.env}]"
    kw: Dict[str, Any] = {"dest": s.name, "default": None, "help": text}
    if s.switch:
        kw["action"] = "store_false" if s.flag.startswith("--no-") else "store_true"
    else:
        kw["type"] = (non_empty if s.parse is str and s.name not in EMPTY_IS_NONE
                      else s.parse)
        metavar = s.metavar or _METAVARS.get(s.name) or ("N" if s.parse is int else None)
        if metavar and not s.choices:
            kw["metavar"] = metavar
        if s.choices:
            kw["choices"] = list(s.choices)
    return group.add_argument(s.flag, **kw)


def add_flags(parser, names: Sequence[str], defaults, help_context: Dict[str, Any],
              show_env: bool = True, group=None) -> Dict[str, Any]:
    """Flags for the settings ``names``, in ``group`` or else in their --help sections;
    returns {section key: argument group}."""
    groups: Dict[str, Any] = {}
    for name in names:
        s = BY_NAME[name]
        key = "given" if group is not None else s.group
        if key not in groups:
            title = GROUP_TITLES[s.group]
            existing = [g for g in parser._action_groups if g.title == title]
            groups[key] = group if group is not None else (
                existing[0] if existing else parser.add_argument_group(title))
        add_flag(groups[key], s, defaults, help_context, show_env)
    return groups


class GivenAs(dict):
    """``given_as``'s answer: {setting: how the user gave it}, and ``keyword``, whether what
    they called takes app.train's keywords (else tfmp train's flags): the words a line
    names a setting by that they did not give (``spelled``).  Empty, it is still the
    API's: test it with ``is None``, not its truth."""

    def __init__(self, named: Mapping[str, str] = (), keyword: bool = False):
        super().__init__(named)
        self.keyword = keyword


def spelled(said: Optional[Mapping[str, str]], name: str, value: Optional[str] = None) -> str:
    """Setting ``name`` as the user writes it in what they called (``said``: ``given_as``'s
    answer; a plain mapping or None is the command line's): ``--resume`` or
    ``resume=True``, ``--output DIR`` or ``output=DIR`` (``value`` None: the flag alone,
    ``output=...``), or its ``TFMP_`` variable when that is how they gave it (``said``
    says so): ``TFMP_RESUME``, ``TFMP_OUTPUT=DIR``.  A line about --resume under app.train,
    or under TFMP_RESUME=1 in a Compose file, named a flag the user never typed."""
    s = BY_NAME[name]
    if said is not None and said.get(name) == s.env:
        return s.env if s.switch or value is None else f"{s.env}={value}"
    if getattr(said, "keyword", False):
        if s.switch:   # --no-save-model is save_model=False
            return f"{name}={not s.flag.startswith('--no-')}"
        return f"{name}={'...' if value is None else value}"
    return s.flag if s.switch or value is None else f"{s.flag} {value}"


def together(said: Optional[Mapping[str, str]], *words: str) -> str:
    """Settings ``spelled`` as one call writes them: ``--resume --output DIR``, or
    ``resume=True, output=DIR``."""
    return (", " if getattr(said, "keyword", False) else " ").join(words)


def listed(said: Optional[Mapping[str, str]], *names: str) -> str:
    """Settings named in a sentence, in the words of what the user called (``spelled``):
    ``--model, --dataset and --precision``, or ``model, dataset and precision``."""
    words = [name if getattr(said, "keyword", False) else BY_NAME[name].flag for name in names]
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]


def given_as(given: Mapping[str, Any], environ: Mapping[str, str],
             keyword: bool = False) -> GivenAs:
    """How the user gave each setting they gave, as resolve_config reads them (a flag wins
    over its TFMP_ variable): {name: its flag (``keyword``: app.train's keyword, the
    setting's name), or its TFMP_ variable when no flag gave it}.  ``given``: the flags (or
    keywords), None for one not given.  For the lines about a value found wrong only once
    the model or the data are there (a layer the model does not have): a value from
    TFMP_FLOAT32_LAYERS was called --float32-layers, which the user never typed."""
    named = GivenAs(keyword=keyword)
    for s in SETTINGS:
        if given.get(s.name) is not None:
            named[s.name] = s.name if keyword else s.flag
        elif environ.get(s.env, "") != "":
            named[s.name] = s.env
    return named


def seed_problem(name: str, seed: Any) -> Optional[Tuple[str, str]]:
    """(what is wrong, what is allowed) for a seed that numpy or TensorFlow cannot take."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        return (f"{name} must be an integer from 0 to 2**32 - 1. Received: {name}={seed!r}",
                f"an integer from 0 to {SEED_MAX}, e.g. 0")
    return None
