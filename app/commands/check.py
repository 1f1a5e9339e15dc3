"""``tfmp check``: the mixed-precision doctor for a model (docs/your-model.md).

Exit status: 0 ready (warnings included), 1 blocked, 2 bad input.  Prints the report; with
``--json FILE`` also writes it there (atomically; an existing file only when it is an earlier
report), with ``--json -`` prints the JSON alone on stdout and the text on stderr.  Writes
nothing else.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys

from app.core.settings import non_empty
from app.doctor.run import DEFAULT_BATCH, DEFAULT_PRECISION, DEFAULT_STEPS

# --json's name for stdout, as in most tools that write a file.
STDOUT = "-"

EPILOG = """\
what it checks (each finding has a severity, the layer and the fix):
  that this TensorFlow can run the model's layer types under the policy here (bfloat16
  convolutions on TF 2.9 need a CPU with AVX-512; `tfmp env` lists them); per layer:
  class, compute dtype, variable dtype, output dtype; layers computing in float32 under a
  mixed policy and why; the model's output must be float32; one real
  forward and backward step with loss scaling (dtype clashes in custom layers, NaN/inf,
  gradients that underflow without loss scaling); sizes that are not multiples of 8
  (Tensor Cores); --steps training steps under the policy (a mixed one also under
  float32 from the same weights), watched as the sentinel watches train: a non-finite
  value is replayed layer by layer and named, with the float32 verdict and the fix
  (docs/numerics.md).

exit status: 0 ready (warnings included), 1 blocked, 2 bad input.

examples:
  tfmp check --model resnet
  tfmp check --model ./nets/small.py:build --input-shape 28,28,1
  tfmp check --model nets.small:build --dataset nets.data:load --json check.json
  tfmp check --model ./nets/small.py:build --input-shape 32,32,3 --float32-layers predictions
"""


def add_parser(subparsers):
    from app.commands.flags import SPEC_HELP, add_task_flags, command_parser, require
    from app.precision.policy import CHOICES

    p = command_parser(
        subparsers, "check", "check a model for mixed-precision problems (the doctor)",
        description="Check a model under a mixed-precision policy: which layers compute in "
                    "which dtype, whether the output is float32, one real step with loss "
                    "scaling, Tensor Core sizes, and float32 against the policy.",
        epilog=EPILOG + "\n" + SPEC_HELP)
    what = add_task_flags(p, show_env=False)   # check reads no TFMP_ variables
    require(what, "model")
    # check's defaults differ from train's: say them here, not train's.
    for action in what._group_actions:
        if action.dest == "dataset":
            action.help = ("a built-in dataset (read from <workspace>/data, never downloaded) or "
                           "MODULE:FUNCTION / file.py:FUNCTION (default: synthetic data shaped "
                           "like the model's input)")
        elif action.dest == "float32_layers":
            action.help = ("run these layers in float32, the rest under the policy, as `tfmp "
                           "train --float32-layers` would: check the model that run trains "
                           "(full paths outer/inner, or plain names)")
        elif action.dest == "input_shape":
            action.help = ("sample shape of the synthetic data when no --dataset is given "
                           "(required for your own model then; built-ins know theirs)")
    how = p.add_argument_group("how to check")
    how.add_argument("--precision", type=non_empty, default=DEFAULT_PRECISION,
                     help=f"one of {', '.join(CHOICES)} (default {DEFAULT_PRECISION}: the "
                          "policy whose problems the doctor finds; auto picks what train would)")
    how.add_argument("--batch-size", type=int, default=DEFAULT_BATCH,
                     help=f"samples per step (default {DEFAULT_BATCH})")
    how.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                     help="training steps on your data under the policy (a mixed one also "
                          "under float32 from the same weights, to compare), watched by the "
                          "numerics sentinel: a few hundred find a "
                          "fault that needs them, or one sample, before a long run "
                          f"(default {DEFAULT_STEPS})")
    how.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    out = p.add_argument_group("output")
    out.add_argument("--json", type=non_empty, metavar="FILE",
                     help="also write the report as JSON to FILE (a new file, or a report of "
                          "check's to replace); '-': the JSON alone on stdout, the text report "
                          "on stderr")
    return p


def _check_json_path(path: str) -> None:
    """Before TensorFlow: --json names a file this check may write, and replaces nothing of
    the user's but an earlier report (``--json model.py`` by a slip must not eat the model)."""
    from app.core.errors import UsageError

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder):
        raise UsageError(f"--json {path!r}: not a file in an existing folder",
                         "a file path whose folder exists")
    if not os.access(folder, os.W_OK | os.X_OK):   # a read-only mount, another's folder
        raise UsageError(f"--json {path!r}: the folder {folder!r} denies writing",
                         "a file path in a folder you can write")
    if os.path.lexists(path) and not _is_a_check_report(path):
        raise UsageError(f"--json {path!r}: the file exists and is not a report of "
                         "tfmp check, so it is left as it is",
                         "a new file name, an earlier check report to replace, or '-' "
                         "for stdout")


def _is_a_check_report(path: str) -> bool:
    """A regular file holding a JSON object with a check report's fields (an empty file,
    e.g. from ``touch`` or an interrupted shell redirect, counts too)."""
    if os.path.islink(path) or not os.path.isfile(path):
        return False
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(8 * 2**20)
    except (OSError, UnicodeDecodeError):
        return False
    if not text.strip():
        return True
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    return isinstance(doc, dict) and {"schema_version", "verdict", "findings"} <= set(doc)


def _checked(args) -> dict:
    from app.doctor.run import run_check
    from app.task.task import Task
    from app.task.user_code import parse_input_shape

    task = Task.from_specs(args.model, args.dataset or "synthetic", args.loss, args.metrics,
                           parse_input_shape(args.input_shape), args.num_classes,
                           float32_layers=args.float32_layers)
    return run_check(task, args.precision, args.batch_size, args.steps, seed=args.seed)


def run(args) -> int:
    from app.doctor.report import exit_code, to_text
    from app.doctor.run import check_args
    from app.core.errors import UsageError
    from app.precision.policy import validate_name

    # Bad flags are one line and exit 2 before TensorFlow is imported.
    validate_name(args.precision)
    check_args(args.batch_size, args.steps, args.seed)
    from app.task.float32_layers import parse as parse_float32_layers

    parse_float32_layers(args.float32_layers)
    to_stdout = args.json == STDOUT
    if args.json and not to_stdout:
        _check_json_path(args.json)
    # With --json -, stdout is for a program (`| jq`): everything for the person (notes,
    # the user's own prints, the text report) goes to stderr.
    with contextlib.redirect_stdout(sys.stderr) if to_stdout else contextlib.nullcontext():
        report = _checked(args)
        print(to_text(report), flush=True)
    from app.core.files import json_text, write_json_atomic

    if to_stdout:
        sys.stdout.write(json_text(report))
        sys.stdout.flush()
    elif args.json:
        try:
            write_json_atomic(args.json, report)
        except OSError as exc:   # the disk filled, or the folder changed since the start
            raise UsageError(f"--json {args.json!r}: the report could not be written "
                             f"({exc.strerror or exc})", "a file path in a folder you can "
                             "write, with room for the report") from None
    return exit_code(report)
