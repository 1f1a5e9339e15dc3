"""``tfmp tune``: the largest batch that fits the memory budget and the fastest one,
per precision, on your model and hardware (docs/tune.md).

Exit status: 0 done, 1 a trial failed for a reason other than memory (your code raised;
the log is named), 2 bad input or no size fits (one line, nothing written).
"""
from __future__ import annotations

from app.core.exit_codes import EXIT_FAILED, EXIT_OK
from app.core.settings import non_empty

EPILOG = """\
how it searches (each trial is its own process; warm-up steps excluded):
  per precision, batch sizes in multiples of 8: doubling from 16 until a size does not fit
  or --max-batch is reached, then narrowing between the last fit and the first misfit.
  A size fits when its steps ran and its peak memory stayed within budget x (1 - margin)
  (GPU: TensorFlow's peak allocation; CPU: the process' peak resident memory).  The
  fastest size that fits is the best batch; the choice is the fastest precision at its
  best batch, run once more for longer to verify it.

examples:
  tfmp tune --model resnet --dataset cifar10
  tfmp tune --model mlp --dataset synthetic --memory-budget 2GiB --max-batch 2048
  tfmp tune --model ./nets.py:build --dataset ./data.py:load --precision float32,auto
  tfmp train --tuned workspace/tune/<run>/tune.json --model resnet --dataset cifar10
  tfmp benchmark --tuned workspace/tune/<run>/tune.json --model resnet --dataset cifar10
"""


def add_parser(subparsers):
    from app.commands.flags import add_setting_flags, add_task_flags, command_parser, require
    from app.tuner import arguments, search
    from app.tuner import tuning as api

    p = command_parser(
        subparsers, "tune", "find the largest and the fastest batch size per precision",
        description="Find, per precision, the largest batch size that fits the memory budget "
                    "and the fastest one, on your model and hardware; write tune.json and "
                    "tune.png.",
        epilog=EPILOG)
    # The same task and data flags as train (app.core.settings), resolved as train resolves
    # them (flag, TFMP_ variable, default): `train --tuned` in the same environment then
    # trains what was tuned.  The tune's children get every value explicitly.
    what = add_task_flags(p)
    what.title = "what to tune"
    add_setting_flags(p, arguments.TRAIN_SETTINGS, group=what)
    add_setting_flags(p, ("workspace",), group=what)
    require(what, "model", "dataset")
    how = p.add_argument_group("how to tune")
    how.add_argument("--precision", type=non_empty, metavar="P[,P...]",
                     help="policies to tune, from float32, mixed_float16, mixed_bfloat16, auto "
                          "(default: float32 and what auto picks here)")
    how.add_argument("--memory-budget", type=non_empty, default="auto", metavar="auto|SIZE",
                     help="GPU: auto is the GPU's memory; CPU: what is free under the "
                          "container's memory limit (the limit less what the container uses "
                          "now), else the memory available now; or a size (2GiB, 1500MiB)")
    how.add_argument("--margin", type=float, default=api.DEFAULT_MARGIN, metavar="F",
                     help="fraction of the budget kept free, in [0, 0.9) (default 0.1)")
    how.add_argument("--max-batch", type=int, metavar="N",
                     help=f"largest batch size to try (default {search.DEFAULT_CAP})")
    how.add_argument("--time-budget", type=float, metavar="SECONDS",
                     help="end the search after this long with the best size so far")
    how.add_argument("--steps", type=int, default=api.DEFAULT_STEPS, metavar="N",
                     help=f"timed steps per trial, at least (default {api.DEFAULT_STEPS}; the "
                          f"verification runs {api.VERIFY_FACTOR}x as many)")
    how.add_argument("--reference-batch-size", type=int, metavar="B",
                     help="the batch size --learning-rate was set for, written into tune.json: "
                          "`train --tuned --scale-lr linear` scales the learning rate from it "
                          "(default: the train batch size setting, TFMP_BATCH_SIZE, else "
                          "train's default 128)")
    how.add_argument("--global-batch", type=int, metavar="B",
                     help="the batch each update must see, when it is larger than fits: "
                          "also plan, per precision, the micro-batch and the accumulation N "
                          "(B = micro-batch x N) that reach it fastest, measured; "
                          "`train --tuned` then trains with them (docs/tune.md)")
    how.add_argument("--output", type=non_empty, metavar="DIR",
                     help="where tune.json, tune.png and the trials' logs go (default "
                          "<workspace>/tune/<UTC time>-<model>-<dataset>)")
    how.add_argument("--quiet", action="store_true", help="no progress and no table")
    return p


def run(args) -> int:
    from app.tuner.arguments import trial_settings
    from app.tuner.tuning import tune
    from app.tuner.runner import TrialFailed

    try:
        doc = tune(args.model, args.dataset, precision=args.precision,
                   memory_budget=args.memory_budget, margin=args.margin,
                   max_batch=args.max_batch, time_budget=args.time_budget, output=args.output,
                   steps=args.steps, workspace=args.workspace, progress=not args.quiet,
                   reference_batch_size=args.reference_batch_size,
                   global_batch=args.global_batch, **trial_settings(vars(args)))
    except TrialFailed as exc:
        import sys

        from app.core.launch import log_traceback

        # The child's traceback first (the user's code that raised, and the line), as train
        # shows it; the logs are kept in the output folder's trials/.
        sys.stderr.write(log_traceback(exc.log) + exc.line() + "\n")
        return EXIT_FAILED
    if doc.get("choice") is None:
        import sys

        sys.stderr.write("error: no size held its budget in the verification run; see "
                         f"{doc['output']}/tune.json and its trials/ logs\n")
        return EXIT_FAILED
    return EXIT_OK
