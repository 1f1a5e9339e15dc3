"""``tfmp train``: one training job (flag > TFMP_* environment variable > default)."""
from __future__ import annotations

import os
import sys

from app.commands.flags import SPEC_HELP, add_setting_flags, add_task_flags, command_parser
from app.core import settings
from app.core.files import fmt
from app.core.exit_codes import EXIT_DIVERGED, EXIT_OK, EXIT_PEER_LOST, interrupted

_PEER_ERRORS = ("UnavailableError", "AbortedError", "CancelledError", "DeadlineExceededError")


def add_parser(subparsers):
    p = command_parser(
        subparsers, "train", "train a model with mixed precision",
        description="Train a model. Every flag can also be set with the environment variable "
                    "shown after its help in brackets (e.g. TFMP_EPOCHS=3); a flag wins over "
                    "the variable. Switches take 1/0, true/false, yes/no or on/off there.",
        epilog=SPEC_HELP)
    add_task_flags(p)
    add_setting_flags(p, [s.name for s in settings.SETTINGS if not s.task])
    return p


def run(args) -> int:
    from app.training.config import resolve_config

    flags = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "command"}
    # How each setting was given: a refusal names it so (--seed, TFMP_SEED).
    said = settings.given_as(flags, os.environ)
    cfg = resolve_config(flags, said=said)  # UsageError -> exit 2, before TensorFlow loads
    from app.training.distribute import parse_logical_cpus, parse_tf_config

    cluster = parse_tf_config(os.environ.get("TF_CONFIG"))  # malformed: exit 2, no TF import
    parse_logical_cpus(os.environ)

    code = _train(cfg, said)   # and for a value refused only once the model is built
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


def _train(cfg, said: dict) -> int:
    from app.training.job import train

    try:
        metrics = train(cfg, repeat_signal_exits=True, said=said)
    except Exception as exc:
        # MultiWorkerMirroredStrategy cannot go on with a worker missing: its collectives fail
        # once the peer stops sending heartbeats.  Say what to do instead of a traceback.
        if os.environ.get("TF_CONFIG") and type(exc).__name__ in _PEER_ERRORS:
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            # Without --output the run folder is named by the start time: a restart would
            # start a new one, so the backup can only be resumed with an --output.
            where = (f"they resume from the last backup in {os.path.join(cfg.output, 'checkpoints')}"
                     if cfg.output else "give them one --output so that a restart resumes "
                     "from its backup")
            sys.stderr.write(f"error: multi-worker training lost a worker ({type(exc).__name__}: "
                             f"{first}); restart every worker with the same command: {where}\n")
            return EXIT_PEER_LOST
        raise
    status = metrics["status"]
    if status == "completed":
        print(done_line(metrics, cfg.output))
        return EXIT_OK
    if status == "interrupted":
        return interrupted(metrics.get("signal"))
    return EXIT_DIVERGED


def done_line(metrics: dict, output: str) -> str:
    """``done: N epoch(s), <the run's own validation metrics>, outputs in DIR``: the last
    epoch's metrics, or under --early-stop those of the epoch whose weights were saved."""
    epochs = metrics["epochs"]
    last = epochs[-1] if epochs else {}
    kept = (metrics.get("early_stop") or {}).get("model_epoch")
    head = [f"done: {len(epochs)} epoch(s)"]
    if kept and last and kept != last["epoch"]:
        last = next((e for e in epochs if e["epoch"] == kept), last)
        head.append(f"the model saved is epoch {kept}'s")
    shown = [f"{k}={fmt(v)}" for k, v in last.items()
             if k.startswith("val_") and k != "val_loss"]
    return ", ".join(head + shown
                     + [f"outputs in {(metrics.get('config') or {}).get('output') or output}"])
