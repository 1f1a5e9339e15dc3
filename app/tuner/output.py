"""The tune's output folder: its default name, what it may already hold (one tune per folder,
never over a training run), and writing the results into it (tune.json, tune.png, trials/).

A tune that a trial's failure ends keeps the trials' logs in trials/ and marks them as its own
(``FAILED_MARKER``): the same command, run again after the fix, may use the folder, and moves
them aside to trials-failed-<UTC time>/ (kept, never merged or deleted) when it writes its own
trials/.  A trials/ without that mark is the user's, or of a tune that did not say: refused."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from typing import Callable, Optional

from app.core import folders
from app.core.errors import UsageError
from app.training import config
from app.tuner import report


def default_base(model: str, dataset: str, workspace: str) -> str:
    """``<workspace>/tune/<UTC>-<model>-<dataset>``, named like train's run folders."""
    return os.path.join(
        workspace, "tune",
        f"{config.utc_stamp()}-{config.short_name(model)}-{config.short_name(dataset)}")


def claim_default(model: str, dataset: str, workspace: str) -> str:
    """The default folder, made this tune's own (``config.claim_unused``): of two tunes
    started in the same second, the second takes ``-2`` instead of meeting the first's
    lock, as train's runs do."""
    return config.claim_unused(default_base(model, dataset, workspace))


# What a tune writes into its folder, and what a training run's folder holds.
TUNE_NAMES = ("tune.json", "tune.png", "trials")
RUN_NAMES = ("metrics.json", "checkpoints")


def check_output(path: str) -> None:
    """Refuse a folder that holds a tune, a training run, or something else under the names a
    tune writes (one line, exit 2, naming what is there); a folder that cannot be written.
    The trials/ a failed tune left, alone, is not refused (``failed_tune``)."""
    def there(names):
        return [n + ("/" if os.path.isdir(os.path.join(path, n)) else "") for n in names
                if os.path.lexists(os.path.join(path, n))]

    old_tune = there(TUNE_NAMES)
    if "tune.json" in old_tune:
        # Every file of the old tune named, to be deleted by the user's word, never by a tune:
        # "delete the old tune.json" alone left tune.png and trials/, and the next refusal.
        rm = " ".join(shlex.quote(os.path.join(path, n.rstrip("/"))) for n in old_tune)
        raise UsageError(f"output directory {path!r} already holds a tune "
                         f"({', '.join(old_tune)})",
                         f"a new --output, or the old tune deleted first: rm -r {rm}")
    run = there(RUN_NAMES)
    if run:
        raise UsageError(f"output directory {path!r} holds a training run ({', '.join(run)})",
                         "a new --output (a tune writes tune.json, tune.png and trials/)")
    other = there(TUNE_NAMES)
    if other and not (other == ["trials/"] and failed_tune(path) is not None):
        raise UsageError(f"output directory {path!r} already holds {', '.join(other)}, "
                         "which are not from a finished tune",
                         "a new --output, or move those away (a tune writes tune.json, "
                         "tune.png and trials/ and deletes nothing)")
    folders.check_writable(path)


# ---- a tune that a trial's failure ended ----------------------------------------------------

FAILED_MARKER = "tune-failed.json"
_FAILED_SCHEMA = "tfmp.tune-failed/1"
_STAMP = re.compile(r"\d{8}T\d{6}Z")     # config.utc_stamp()'s form


def failed_tune(path: str) -> Optional[dict]:
    """The mark of ``path``/trials when that folder is what a tune ended by a failed trial
    left (a real folder holding our ``FAILED_MARKER``); None for any other trials/."""
    trials_dir = os.path.join(path, "trials")
    marker = os.path.join(trials_dir, FAILED_MARKER)
    if os.path.islink(trials_dir) or os.path.islink(marker) or not os.path.isfile(marker):
        return None
    try:
        with open(marker, encoding="utf-8") as fh:
            mark = json.load(fh)
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) and mark.get("schema") == _FAILED_SCHEMA else None


def _mark_failed(trials_dir: str, failure: str, log: str) -> None:
    """Say in ``trials_dir`` that a failed tune left it, what failed and when: what lets the
    same command, run again, use the folder.  Unwritten, the logs are still kept (and the
    rerun refused, as any trials/)."""
    from app.core.files import utc_now_iso, write_json_atomic

    try:
        write_json_atomic(os.path.join(trials_dir, FAILED_MARKER), {
            "schema": _FAILED_SCHEMA, "failed_utc": utc_now_iso(), "stamp": config.utc_stamp(),
            "error": failure, "log": os.path.basename(log)})
    except OSError:
        pass


def _set_aside_failed(output: str, mark: dict, workdir: str) -> str:
    """A failed tune's trials/ renamed to trials-failed-<its UTC time>/ (``-2``, ... when
    that is taken), whole, out of the way of this tune's trials/; the line that says so."""
    stamp = mark.get("stamp")
    stamp = stamp if isinstance(stamp, str) and _STAMP.fullmatch(stamp) else config.utc_stamp()
    trials_dir = os.path.join(output, "trials")
    kept = config.unused(os.path.join(output, f"trials-failed-{stamp}"))
    try:
        os.rename(trials_dir, kept)
    except OSError as exc:
        raise UsageError(f"the logs of the tune that failed here ({trials_dir!r}) cannot be "
                         f"moved to {kept!r} ({exc.strerror}); this tune's trials' logs stay "
                         f"in {workdir!r}", "a new --output") from None
    failed_log = mark.get("log") if isinstance(mark.get("log"), str) else "?"
    return (f"kept the logs of the tune that failed here (its failed trial's: {failed_log}) "
            f"in {kept}/; trials/ holds this tune's")


def _move_trials(output: str, workdir: str, say: Callable[[str], None]) -> str:
    """The trials' logs moved from their temporary folder to ``output``/trials; its path.
    A failed tune's trials/ there is set aside first, and ``say`` gets the line."""
    folders.make_folder(output)
    trials_dir = os.path.join(output, "trials")
    mark = failed_tune(output)
    if mark is not None:
        say(_set_aside_failed(output, mark, workdir))
    # check_output found no trials/ under the lock (or a failed tune's, set aside above);
    # never delete or merge into one.
    if os.path.lexists(trials_dir):
        raise UsageError(f"{trials_dir!r} appeared while the tune ran; the trials' logs stay "
                         f"in {workdir!r}", "a new --output")
    shutil.move(workdir, trials_dir)
    return trials_dir


def keep_failed_logs(output: str, workdir: str, log: str, failure: str,
                     say: Callable[[str], None]) -> str:
    """A tune that a trial's failure ends keeps its trials' logs in ``output``/trials, where a
    container's --rm does not take them as it takes /tmp, marked as a failed tune's
    (``failure``: what failed); the failed log's path there (its old path when they cannot be
    moved: the error still names a log that exists)."""
    if os.path.commonpath([os.path.abspath(log), os.path.abspath(workdir)]) != \
            os.path.abspath(workdir):
        return log
    try:
        trials_dir = _move_trials(output, workdir, say)
    except (OSError, UsageError):
        return log
    _mark_failed(trials_dir, failure, log)
    return os.path.join(trials_dir, os.path.relpath(log, workdir))


def write_outputs(output: str, doc: dict, workdir: str, say: Callable[[str], None]) -> None:
    from app.core.files import write_atomic, write_json_atomic

    def say_and_note(line: str) -> None:
        say(f"[tune] {line}")
        doc["notes"].append(line)
    _move_trials(output, workdir, say_and_note)
    try:
        write_atomic(os.path.join(output, "tune.png"), report.render_png(doc))
    except ImportError:
        doc["notes"].append("matplotlib is not installed: no tune.png")
    write_json_atomic(os.path.join(output, "tune.json"), doc)
