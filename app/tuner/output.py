"""The tune's output folder: its default name, what it may already hold (one tune per folder,
never over a training run), and writing the results into it (tune.json, tune.png, trials/)."""
from __future__ import annotations

import os
import shutil

from app.core import folders
from app.core.errors import UsageError
from app.training import config
from app.tuner import report


def default_output(model: str, dataset: str, workspace: str) -> str:
    """``<workspace>/tune/<UTC>-<model>-<dataset>``, named like train's run folders (and, like
    them, never one that exists already)."""
    return config.unused(os.path.join(
        workspace, "tune",
        f"{config.utc_stamp()}-{config.short_name(model)}-{config.short_name(dataset)}"))


# What a tune writes into its folder, and what a training run's folder holds.
TUNE_NAMES = ("tune.json", "tune.png", "trials")
RUN_NAMES = ("metrics.json", "checkpoints")


def check_output(path: str) -> None:
    """Refuse a folder that holds a tune, a training run, or something else under the names a
    tune writes (one line, exit 2, naming what is there); a folder that cannot be written."""
    def there(names):
        return [n + ("/" if os.path.isdir(os.path.join(path, n)) else "") for n in names
                if os.path.lexists(os.path.join(path, n))]

    if there(("tune.json",)):
        raise UsageError(f"output directory {path!r} already holds a tune",
                         "a new --output, or delete the old tune.json")
    run = there(RUN_NAMES)
    if run:
        raise UsageError(f"output directory {path!r} holds a training run ({', '.join(run)})",
                         "a new --output (a tune writes tune.json, tune.png and trials/)")
    other = there(TUNE_NAMES)
    if other:
        raise UsageError(f"output directory {path!r} already holds {', '.join(other)}, "
                         "which are not from a finished tune",
                         "a new --output, or move those away (a tune writes tune.json, "
                         "tune.png and trials/ and deletes nothing)")
    folders.check_writable(path)


def _move_trials(output: str, workdir: str) -> str:
    """The trials' logs moved from their temporary folder to ``output``/trials; its path."""
    folders.make_folder(output)
    trials_dir = os.path.join(output, "trials")
    # check_output found no trials/ under the lock; never delete or merge into one.
    if os.path.lexists(trials_dir):
        raise UsageError(f"{trials_dir!r} appeared while the tune ran; the trials' logs stay "
                         f"in {workdir!r}", "a new --output")
    shutil.move(workdir, trials_dir)
    return trials_dir


def keep_failed_logs(output: str, workdir: str, log: str) -> str:
    """A tune that a trial's failure ends keeps its trials' logs in ``output``/trials, where a
    container's --rm does not take them as it takes /tmp; the failed log's path there (its
    old path when they cannot be moved: the error still names a log that exists)."""
    if os.path.commonpath([os.path.abspath(log), os.path.abspath(workdir)]) != \
            os.path.abspath(workdir):
        return log
    try:
        trials_dir = _move_trials(output, workdir)
    except (OSError, UsageError):
        return log
    return os.path.join(trials_dir, os.path.relpath(log, workdir))


def write_outputs(output: str, doc: dict, workdir: str) -> None:
    from app.core.files import write_atomic, write_json_atomic

    _move_trials(output, workdir)
    try:
        write_atomic(os.path.join(output, "tune.png"), report.render_png(doc))
    except ImportError:
        doc["notes"].append("matplotlib is not installed: no tune.png")
    write_json_atomic(os.path.join(output, "tune.json"), doc)
