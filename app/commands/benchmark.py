"""``tfmp benchmark``: float32 against mixed precision on this machine.

Every policy trains the same model on the same data with the same settings, each run in a
fresh ``tfmp train`` process, interleaved over ``--repeats``.  Writes
benchmark.json, benchmark.md (also printed), benchmark.png, env.json and env.txt into
``--output``.  See docs/benchmark.md.
"""
from __future__ import annotations

import os
import shlex
import sys

from app.core import folders
from app.core import settings as settings_table
from app.core.errors import UsageError
from app.core.exit_codes import EXIT_FAILED
from app.core.catalog import POLICIES
from app.core.settings import non_empty

# The training settings the benchmark passes to its runs (app.core.settings' ``passed``
# column), apart from the task flags and --epochs (its own, below) and the two speed
# settings, which get their own --help group.
_SPEED = ("steps_per_execution", "jit")
_WHAT = tuple(s.name for s in settings_table.PASSED
              if not s.task and s.name != "epochs" and s.name not in _SPEED)


def add_parser(subparsers):

    from app.commands.flags import SPEC_HELP, add_setting_flags, add_task_flags, command_parser

    p = command_parser(
        subparsers, "benchmark", "measure float32 against mixed precision on this machine",
        description="Train the same model under each precision policy, interleaved, and "
                    "report speed, peak memory and accuracy with plain-word diagnoses; "
                    "also time the input pipeline alone and say when the job is input-bound.",
        epilog=SPEC_HELP)
    # The same task and data flags as train, passed to every `tfmp train` run.  Defaults of
    # None: resolved like `train` does (flag, then TFMP_* variable, then default).
    what = add_task_flags(p)
    what.title = "what to train (passed to `tfmp train`)"
    add_setting_flags(p, _WHAT, group=what)
    add_setting_flags(p, _SPEED, group=p.add_argument_group("speed settings recorded with the results"))
    how = p.add_argument_group("how to measure")
    how.add_argument("--policies", type=non_empty, default=None, metavar="LIST",
                     help="comma-separated subset of float32,mixed_float16,mixed_bfloat16 "
                          "(default: all that make sense on this hardware; named ones always run)")
    how.add_argument("--repeats", type=int, default=3, metavar="N",
                     help="runs per policy, interleaved A,B,A,B (default 3)")
    how.add_argument("--epochs", type=int, default=3, metavar="N",
                     help="epochs per run, warm-up included (default 3)")
    how.add_argument("--warmup-epochs", type=int, default=1, metavar="N",
                     help="epochs left out of the timing at the start of every run (default 1)")
    how.add_argument("--max-accuracy-gap", type=float, default=1.0, metavar="POINTS",
                     help="flag a policy whose final val accuracy differs from float32 by more "
                          "(percentage points, default 1.0)")
    how.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS",
                     help="give up on a single run after this long (default 3600)")
    how.add_argument("--fp32-baseline", default="tf32", choices=("tf32", "strict", "both"),
                     help="the float32 mixed precision is compared with, on a GPU with TF32 "
                          "Tensor Cores (compute capability 8.0+): tf32, the float32 "
                          "TensorFlow runs by default (default); strict, TF32 off; both: tf32 "
                          "as the baseline and strict measured beside it.  Elsewhere float32 "
                          "is strict either way")
    how.add_argument("--profile", action="store_true",
                     help="after the measured runs, one short run per policy with a profile "
                          "of steps 3-5 (TensorBoard's Profile tab, <output>/profiles/); not "
                          "timed")
    best = p.add_argument_group(
        "each at its own best batch (the larger batch mixed precision allows; docs/benchmark.md)")
    one = best.add_mutually_exclusive_group()
    one.add_argument("--tuned", type=non_empty, default=None, metavar="FILE",
                     help="a tune.json of `tfmp tune` for this --model and --dataset: after the "
                          "equal-batch runs, each policy runs again at its own best batch")
    one.add_argument("--best-batch", action="store_true",
                     help="run `tfmp tune` first (into <output>/tune, default budget), then "
                          "the same comparison")
    how.add_argument("--output", type=non_empty, default=None, metavar="DIR",
                     help="new or empty folder for the results (default: "
                          "<workspace>/benchmarks/<UTC time>-<model>)")
    return p


def parse_policies(text):
    """``"float32, mixed_bfloat16"`` -> list; None for the default; UsageError otherwise."""
    from app.precision.policy import parse_names

    return parse_names(text, "policies", POLICIES)


def precheck_spec(spec, what: str) -> None:
    """The spec errors this process can see without importing the user's code (which would
    import TensorFlow here): the form, a missing .py file, a missing top-level module.
    Everything else (no such function, a wrong return type...) is found by the first child
    process, which exits 2 with its own one-line error."""
    import importlib.util

    from app.task import user_code as specs

    if not specs.is_user_spec(spec):
        return
    module, _ = specs.split_spec(spec, what)
    if module.endswith(".py") or "/" in module or os.sep in module:
        if not os.path.isfile(module):
            raise UsageError(f"{what} spec {spec!r}: file {module!r} does not exist",
                             "an existing .py file, relative to the current directory "
                             f"({os.getcwd()}) or absolute")
        return
    top = module.split(".")[0]
    specs.current_folder_importable()   # as the child runs will
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UsageError(f"{what} spec {spec!r}: no module named {top!r} on the import path",
                         f"{specs.SPEC_FORMS}; run from the folder that holds the module, or "
                         "add it to PYTHONPATH")


def validate(args):
    """Every check that can fail, before anything is created.  Returns (settings, policies)."""
    from app.training import config

    # Its runs are trains, and so is what a user runs next in this environment: a variable
    # train refuses is train's one line here too (as for tune), also one the benchmark does
    # not read (TFMP_EPOCHS, TFMP_PRECISION: --epochs and --policies set its runs').
    config.check_variables()
    policies = parse_policies(args.policies)
    if args.repeats < 1:
        raise UsageError(f"repeats must be at least 1. Received: repeats={args.repeats}",
                         "an integer >= 1")
    if args.warmup_epochs < 0:
        raise UsageError(f"warmup_epochs must be 0 or more. Received: warmup_epochs={args.warmup_epochs}",
                         "an integer >= 0")
    if args.epochs <= args.warmup_epochs:
        raise UsageError(f"epochs must exceed warmup_epochs so some epochs are timed. Received: "
                         f"epochs={args.epochs}, warmup_epochs={args.warmup_epochs}",
                         f"epochs >= {args.warmup_epochs + 1}")
    if args.steps_per_execution is not None and args.steps_per_execution < 1:
        raise UsageError(f"steps_per_execution must be at least 1. Received: "
                         f"steps_per_execution={args.steps_per_execution}", "an integer >= 1")
    if not args.max_accuracy_gap >= 0:
        raise UsageError(f"max_accuracy_gap must be 0 or more. Received: "
                         f"max_accuracy_gap={args.max_accuracy_gap}", "percentage points >= 0")
    if not args.timeout > 0:
        raise UsageError(f"timeout must be positive. Received: timeout={args.timeout}", "seconds > 0")
    if args.image_size is not None and args.image_size < 1:
        raise UsageError(f"image_size must be at least 1. Received: image_size={args.image_size}",
                         "an integer >= 1")
    # The training settings go through the same validation as `tfmp train`.  TFMP_*
    # variables are resolved here, and the result is passed to every run as explicit flags,
    # so what the report records is what the runs used.
    flags = {s.name: getattr(args, s.name) for s in settings_table.PASSED}
    flags["precision"] = "float32"
    cfg = config.resolve_config(flags, use_tuned=False)   # --tuned here is the benchmark's own
    for what, spec in (("model", cfg.model), ("dataset", cfg.dataset), ("loss", cfg.loss)):
        precheck_spec(spec, what)
    output = args.output or os.path.join(
        cfg.workspace, "benchmarks",
        config.utc_stamp() + f"-{config.short_name(cfg.model)}")
    if args.output and os.path.exists(output) and (not os.path.isdir(output)
                                                   or os.listdir(output)):
        if _interrupted_benchmark(output):   # Ctrl-C'd: its partial runs are kept, not reused
            raise UsageError(f"output {output!r} holds an interrupted benchmark (runs/ and no "
                             "benchmark.json)", "a new --output, or that folder removed first "
                             f"(rm -r {shlex.quote(output)}) to run it again there")
        raise UsageError(f"output {output!r} already exists and is not an empty folder",
                         "a new or empty folder, so runs of different benchmarks never mix")
    folders.check_writable(output)
    best = None
    if args.tuned is not None:
        from app.training.tuned import best_batches

        best = best_batches(args.tuned, cfg.model, cfg.dataset)
    settings = {s.name: getattr(cfg, s.name) for s in settings_table.PASSED}
    # Passed on only when chosen: the trainer's own default is <workspace>/data.
    settings["data_dir"] = cfg.data_dir if config.data_dir_chosen(cfg) else None
    settings["offline"], settings["jit"] = bool(cfg.offline), bool(cfg.jit)
    if not args.output:
        # Every check is done: the default folder is made this benchmark's own, so that two
        # started in the same second never write into one folder (nor one remove the
        # other's runs with its own, after a rejected setting): the second takes -2.
        output = config.claim_unused(output)
    return settings, policies, output, best


def _interrupted_benchmark(output: str) -> bool:
    return (os.path.isdir(os.path.join(output, "runs"))
            and not os.path.exists(os.path.join(output, "benchmark.json")))


def tune_first(settings: dict, policies, output: str) -> dict:
    """``--best-batch``: the tune of this job (every requested policy, or float32 and auto),
    into ``<output>/tune``; returns ``{policy: best batch}``."""
    from app.tuner.arguments import trial_settings
    from app.tuner.tuning import tune

    doc = tune(settings["model"], settings["dataset"],
               precision=",".join(policies) if policies else None,
               output=os.path.join(output, "tune"), workspace=settings.get("workspace"),
               reference_batch_size=settings.get("batch_size"),
               **trial_settings(settings))
    return {p: e["best_batch"] for p, e in doc["precisions"].items() if e.get("best_batch")}


def run(args) -> int:
    from app.benchmark.suite import run_benchmark

    settings, policies, output, best = validate(args)
    source = args.tuned
    if args.best_batch:
        from app.tuner.runner import TrialFailed

        try:
            best = tune_first(settings, policies, output)
        except TrialFailed as exc:
            sys.stderr.write(exc.line() + "\n")
            return EXIT_FAILED
        source = os.path.join(output, "tune", "tune.json")
    return run_benchmark(settings, policies, output, output_made=not args.output,
                         repeats=args.repeats,
                         best_batches=best, best_batch_source=source,
                         warmup_epochs=args.warmup_epochs,
                         max_accuracy_gap=args.max_accuracy_gap, timeout=args.timeout,
                         fp32_baseline=args.fp32_baseline, profile=args.profile,
                         argv=sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "benchmark" else [])
