"""``python -m app train``: one training job (flag > TFMP_* environment variable > default)."""
from __future__ import annotations

import argparse
import os
import sys

from app.config import DATASETS, LOOPS, MODELS, PRECISIONS, STRATEGIES, TrainConfig

EXIT_DIVERGED = 3
EXIT_SIGTERM = 143  # 128 + SIGTERM, what a shell reports for a job killed by `docker stop`
EXIT_SIGINT = 130
EXIT_PEER_LOST = 4  # multi-worker: another worker stopped; restart them all to resume
_PEER_ERRORS = ("UnavailableError", "AbortedError", "CancelledError", "DeadlineExceededError")


SPEC_HELP = """\
your own model and data (docs/your-model.md):
  --model nets.small:build        a function in a module importable from the current
                                  directory or PYTHONPATH
  --model ./nets/small.py:build   a function in a .py file
  The model function is called as build(input_shape, num_classes) (declare only the
  parameters you need) after the precision policy is set; it returns a keras.Model,
  compiled or not.  The dataset function returns ((x_train, y_train), (x_val, y_val))
  arrays or (train, val) unbatched tf.data datasets; it may declare data_dir and seed.
"""


def add_task_flags(p, d=None):
    """--model/--dataset/--loss/--metrics and their shapes; shared by train, benchmark, check."""
    d = d or TrainConfig()
    what = p.add_argument_group("what to train")
    what.add_argument("--model", metavar="SPEC",
                      help=f"{', '.join(MODELS)} or MODULE:FUNCTION / file.py:FUNCTION "
                           f"(default {d.model})")
    what.add_argument("--dataset", metavar="SPEC",
                      help=f"{', '.join(DATASETS)} or MODULE:FUNCTION / file.py:FUNCTION "
                           f"(default {d.dataset})")
    what.add_argument("--loss", metavar="SPEC",
                      help="Keras loss name or MODULE:OBJECT (default: the compiled model's, "
                           "else sparse categorical cross-entropy, from logits when the "
                           "outputs are not probabilities)")
    what.add_argument("--metrics", metavar="LIST",
                      help="comma-separated Keras metric names or MODULE:OBJECT (default: the "
                           "compiled model's, else accuracy)")
    what.add_argument("--input-shape", metavar="D,D,...",
                      help="sample shape for --dataset synthetic with your own model "
                           "(default 28,28,1); other data gives its own")
    what.add_argument("--num-classes", type=int, metavar="N",
                      help="number of classes (default: counted from the labels)")
    return what


def add_parser(subparsers):
    d = TrainConfig()
    p = subparsers.add_parser(
        "train", help="train a model with mixed precision",
        description="Train a model. Every flag can also be set with an environment variable "
                    "TFMP_<FLAG> (e.g. TFMP_EPOCHS=3); a flag wins over the variable.",
        epilog=SPEC_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=None)
    add_task_flags(p, d)
    what = [g for g in p._action_groups if g.title == "what to train"][0]
    what.add_argument("--image-dir", help="for --dataset images: folder with one subfolder per class")
    what.add_argument("--image-size", type=int, help="images are resized to this square size (32)")
    how = p.add_argument_group("how to train")
    how.add_argument("--precision", help=f"one of {', '.join(PRECISIONS)} (default {d.precision})")
    how.add_argument("--loop", help=f"one of {', '.join(LOOPS)} (default {d.loop})")
    how.add_argument("--epochs", type=int, help=f"number of epochs (default {d.epochs})")
    how.add_argument("--batch-size", type=int,
                     help=f"batch size per replica (default {d.batch_size}); the global batch is "
                          "this times the number of replicas")
    how.add_argument("--strategy",
                     help=f"tf.distribute strategy, one of {', '.join(STRATEGIES)} (default "
                          f"{d.strategy}: mirrored with several GPUs, multi-worker when TF_CONFIG "
                          "describes a cluster, else one device)")
    how.add_argument("--learning-rate", type=float, help=f"Adam learning rate ({d.learning_rate})")
    how.add_argument("--seed", type=int, help=f"random seed (default {d.seed})")
    how.add_argument("--max-train-samples", type=int, help="use at most this many training samples")
    how.add_argument("--max-val-samples", type=int, help="use at most this many validation samples")
    how.add_argument("--initial-loss-scale", type=float,
                     help=f"first loss scale for mixed_float16 (default {d.initial_loss_scale:g})")
    how.add_argument("--max-skipped-steps", type=int,
                     help="stop when this many steps in a row have non-finite gradients "
                          f"(default {d.max_skipped_steps})")
    how.add_argument("--steps-per-execution", type=int,
                     help="--loop fit: training steps per tf.function call; step logs and "
                          "skipped-step checks then happen once per call (default 1)")
    how.add_argument("--jit", action="store_true", default=None, help="XLA-compile the train step")
    where = p.add_argument_group("where")
    where.add_argument("--workspace", help="base folder (default $TFMP_WORKSPACE or ./workspace)")
    where.add_argument("--data-dir", help="dataset files (default <workspace>/data)")
    where.add_argument("--output", help="run folder (default <workspace>/runs/<UTC>-<model>-<dataset>-<policy>)")
    where.add_argument("--offline", action="store_true", default=None,
                       help="never download; fail if the dataset files are missing")
    where.add_argument("--resume", action="store_true", default=None,
                       help="continue the run in --output from its last checkpoint")
    where.add_argument("--no-save-model", dest="save_model", action="store_false", default=None,
                       help="do not save the final model")
    out = p.add_argument_group("output")
    out.add_argument("--log-every", type=int,
                     help=f"log loss, gradient norm and loss scale every N steps ({d.log_every})")
    out.add_argument("--progress", dest="verbose", choices=["auto", "bar", "lines"],
                     help="progress bar, plain lines, or auto (bar on a terminal)")
    return p


def run(args) -> int:
    from app.config import resolve_config

    flags = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "command"}
    cfg = resolve_config(flags)  # UsageError -> exit 2 (before TensorFlow is even imported)
    from app.distribute import parse_logical_cpus, parse_tf_config

    cluster = parse_tf_config(os.environ.get("TF_CONFIG"))  # malformed: exit 2, no TF import
    parse_logical_cpus(os.environ)

    code = _train(cfg)
    if cluster is not None and cluster.num_workers > 1:
        _exit_without_teardown(code)
    return code


def _exit_without_teardown(code: int) -> None:
    """End a multi-worker process here, skipping interpreter and C++ teardown.

    After a finished MultiWorkerMirroredStrategy job, TensorFlow's collective runtime can
    abort while the process exits ("terminate called without an active exception", SIGABRT;
    tensorflow/tensorflow#55250, #56684), turning a completed job into a failed one for the
    scheduler.  Every output is already written and closed (atomically) at this point, so
    the process flushes its streams and leaves with the real status.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _train(cfg) -> int:
    from app.training import train

    try:
        metrics = train(cfg)
    except Exception as exc:
        # MultiWorkerMirroredStrategy cannot go on with a worker missing: its collectives fail
        # once the peer stops sending heartbeats.  Say what to do instead of a traceback.
        if cfg.output and os.environ.get("TF_CONFIG") and type(exc).__name__ in _PEER_ERRORS:
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            sys.stderr.write(f"error: multi-worker training lost a worker ({type(exc).__name__}: "
                             f"{first}); restart every worker with the same command: they resume "
                             f"from the last backup in {os.path.join(cfg.output, 'checkpoints')}\n")
            return EXIT_PEER_LOST
        raise
    status = metrics["status"]
    if status == "completed":
        last = metrics["epochs"][-1] if metrics["epochs"] else {}
        print(f"done: {len(metrics['epochs'])} epoch(s), val_accuracy="
              f"{last.get('val_accuracy')}, outputs in {cfg.output}")
        return 0
    if status == "interrupted":
        return EXIT_SIGINT if metrics.get("signal") == 2 else EXIT_SIGTERM
    return EXIT_DIVERGED
