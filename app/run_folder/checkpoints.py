"""Checkpoints (model, optimizer with its loss-scale state, epoch counter) and the final model."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys

import tensorflow as tf

from app.core.errors import UsageError
from app.core.settings import listed, spelled
from app.precision.keras_version import IS_KERAS3

CHECKPOINT_DIR = "checkpoints"
# The newest checkpoints kept: the one --resume takes, and two behind it should the newest
# be damaged (a write cut off: newest_complete passes it by).
KEEP = 3


class Checkpointer:
    """``write_dir``: multi-worker, a non-chief worker takes part in every save (TensorFlow
    requires it) but into its own temporary folder, deleted after each save; every worker
    restores from the chief's folder (``<output>/checkpoints``)."""

    def __init__(self, output: str, model, optimizer, write_dir=None):
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="completed_epochs")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch,
                                        step=self.step)
        self.read_dir = os.path.join(output, CHECKPOINT_DIR)
        self.restored_path = None
        _repair_state_file(self.read_dir)
        self.temporary = write_dir is not None and write_dir != self.read_dir
        self.manager = tf.train.CheckpointManager(self.ckpt, write_dir or self.read_dir,
                                                  max_to_keep=KEEP)

    def move_to(self, output: str) -> None:
        """Save into and restore from ``<output>/checkpoints`` instead: a run folder claimed
        under another name than the one first chosen, before any save (the chief's only)."""
        self.read_dir = os.path.join(output, CHECKPOINT_DIR)
        self.manager = tf.train.CheckpointManager(self.ckpt, self.read_dir, max_to_keep=KEEP)

    def save(self, completed_epochs: int, global_step: int) -> str:
        self.epoch.assign(completed_epochs)
        self.step.assign(global_step)
        path = self.manager.save()
        if self.temporary:
            shutil.rmtree(self.manager.directory, ignore_errors=True)
        return path

    def restore_latest(self, said=None) -> int:
        """Restore the newest checkpoint that restores; return the number of completed epochs.

        A damaged newest checkpoint (a crash or a full disk during the save, a copy cut
        short) is skipped with a warning and the one before it is used; a checkpoint of
        another model is a UsageError.  Never a silent restart from epoch 1.  ``said``: how
        the user gave the settings (``app.core.settings.given_as``), whose words the lines
        use (``resume=True`` under app.train).
        """
        candidates = complete_checkpoints(self.read_dir)
        if not candidates:
            raise no_checkpoint(self.read_dir, said)
        damaged = []
        for path in reversed(candidates):
            try:
                status = self.ckpt.restore(path)
                status.assert_existing_objects_matched()
                # Keras 2 makes the optimizer's slots at its first step: restored then, and
                # never where nothing is left to train, which TensorFlow otherwise reported
                # at exit in five "Value in checkpoint could not be found" warnings.
                status.expect_partial()
            except (AssertionError, ValueError) as exc:
                raise UsageError(f"checkpoint {path!r} does not match this model/optimizer "
                                 f"({_first_line(exc)})",
                                 f"the same {listed(said, 'model', 'dataset', 'precision')}"
                                 " as the run being resumed") from None
            except (tf.errors.OpError, IndexError, OSError, EOFError, RuntimeError) as exc:
                # Damaged data (TF's reader says "Read less bytes than requested" as an
                # IndexError, "Unable to open table file" as an OpError): try the one before.
                damaged.append(f"{os.path.basename(path)} ({type(exc).__name__}: "
                               f"{_first_line(exc, 100)})")
                continue
            self.restored_path = path
            if damaged:
                print(f"warning: checkpoint {damaged[0]} is damaged"
                      + (f", and {', '.join(damaged[1:])}" if damaged[1:] else "")
                      + f"; resuming from {os.path.basename(path)} (epoch "
                        f"{int(self.epoch.numpy())}) instead", file=sys.stderr, flush=True)
            return int(self.epoch.numpy())
        raise UsageError(f"no checkpoint in {self.read_dir!r} can be restored: "
                         + "; ".join(damaged),
                         "delete the damaged checkpoints folder to start over, or restore it "
                         "from a copy")


def no_checkpoint(read_dir: str, said=None) -> UsageError:
    """The line for a --resume (``resume=True``: ``said``, app.core.settings.given_as) that
    finds no checkpoint to continue from in ``read_dir``."""
    resume = spelled(said, "resume")
    return UsageError(f"{resume} found no checkpoint in {read_dir!r}",
                      f"{resume} with the {spelled(said, 'output')} of a run that saved a "
                      "checkpoint")


def _first_line(exc, limit: int = 160) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def complete_checkpoints(folder: str) -> list:
    """Checkpoint prefixes with an index file, oldest first.

    From TensorFlow's state file when it parses; else (a damaged state file) from the
    ``<prefix>.index`` files themselves, ordered by their save number."""
    paths = []
    try:
        state = tf.train.get_checkpoint_state(folder)
    except Exception:  # a truncated or garbled 'checkpoint' file
        state = None
    if state is not None:
        # TensorFlow has already joined the relative paths of the state file to ``folder``
        # (joining them again doubled a relative folder: `--resume --output runs/x` found
        # no checkpoint).
        paths = list(state.all_model_checkpoint_paths)
    if not paths:
        found = [p[:-len(".index")] for p in _glob_index(folder)]
        paths = sorted(found, key=_save_number)
    return [p for p in paths if os.path.exists(p + ".index")]


def _glob_index(folder: str) -> list:
    import glob

    return glob.glob(os.path.join(folder, "*.index"))


def _save_number(prefix: str) -> int:
    m = re.search(r"-(\d+)$", prefix)
    return int(m.group(1)) if m else -1


def _repair_state_file(folder: str) -> None:
    """A garbled ``checkpoint`` state file (a crash while TensorFlow rewrote it) makes the
    CheckpointManager forget every checkpoint; rebuild it from the index files."""
    state_file = os.path.join(folder, "checkpoint")
    if not os.path.exists(state_file):
        return
    try:
        if tf.train.get_checkpoint_state(folder) is not None:
            return
    except Exception:
        pass
    found = complete_checkpoints(folder)
    if not found:
        return
    print(f"warning: {state_file} is damaged; rebuilt from the checkpoints' index files "
          f"({', '.join(os.path.basename(p) for p in found)})", file=sys.stderr, flush=True)
    tf.compat.v1.train.update_checkpoint_state(folder, found[-1], all_model_checkpoint_paths=found)


def newest_complete(folder: str):
    found = complete_checkpoints(folder)
    return found[-1] if found else None


def has_checkpoint(output: str) -> bool:
    return newest_complete(os.path.join(output, CHECKPOINT_DIR)) is not None


# save_final_model's names before the rename: Keras 2's SavedModel folder, Keras 3's file,
# and Keras 3's weights file for a model it cannot save whole.
PARTIAL_SAVEDMODEL, PARTIAL_KERAS_FILE = ".model.tmp", ".model.tmp.keras"
PARTIAL_WEIGHTS_FILE = ".model.tmp.weights.h5"
PARTIAL_MODELS = (PARTIAL_SAVEDMODEL, PARTIAL_KERAS_FILE, PARTIAL_WEIGHTS_FILE)
FINAL_WEIGHTS = "model.weights.h5"


def remove_partial_model(output: str) -> None:
    """A final model's save cut short (a full disk) leaves its temporary folder or file:
    removed, so the space it held is free and only whole things stay in the run folder."""
    for name in PARTIAL_MODELS:
        path = os.path.join(output, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            with contextlib.suppress(OSError):
                os.remove(path)


def save_final_model(model, output: str) -> str:
    """Save in the running Keras' native format: ``model.keras`` on Keras 3, a SavedModel
    folder ``model/`` on Keras 2.  Written under a temporary name, then renamed.  Keras 3
    saves a subclassed model whose ``__init__`` takes arguments only with a ``get_config()``:
    without one, the weights (``model.weights.h5``) and one line saying so."""
    if IS_KERAS3:
        final = os.path.join(output, "model.keras")
        tmp = os.path.join(output, PARTIAL_KERAS_FILE)
        try:
            model.save(tmp)
        except NotImplementedError as exc:
            if "get_config" not in str(exc):
                raise
            with contextlib.suppress(OSError):
                os.remove(tmp)   # ours: the archive Keras began
            return _save_final_weights(model, output)
        os.replace(tmp, final)
        return final
    final = os.path.join(output, "model")
    tmp = os.path.join(output, PARTIAL_SAVEDMODEL)
    shutil.rmtree(tmp, ignore_errors=True)
    # The optimizer is in the checkpoints; the final model is for inference.
    with _without_uncompiled_notice():
        model.save(tmp, include_optimizer=False)
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def _save_final_weights(model, output: str) -> str:
    """The final model's weights, for a model Keras 3 cannot save whole (a subclassed model
    whose ``__init__`` takes arguments and that has no ``get_config()``)."""
    # Replaced when there, as model.keras is: a folder that held it before the run's first
    # write was refused (resuming._RUN_NAMES), so it is this run's own, from an earlier save.
    final = os.path.join(output, FINAL_WEIGHTS)
    tmp = os.path.join(output, PARTIAL_WEIGHTS_FILE)
    model.save_weights(tmp)
    os.replace(tmp, final)
    print(f"note: model {type(model).__name__!r} cannot be saved whole as model.keras: its "
          "__init__ takes arguments and it has no get_config(), so its weights are saved in "
          f"{os.path.basename(final)} (build the model, then model.load_weights(...)); give "
          "the class a get_config() that returns those arguments for a full model.keras",
          file=sys.stderr, flush=True)
    return final


class _UncompiledNotice:
    """Keras 2's ``save`` of a model never compiled (the custom loop's, a model function's
    that returns one uncompiled) logs "Compiled the loaded model, but the compiled metrics
    have yet to be built": its bare ``except`` around ``compiled_loss.build`` on a model with
    no compiled loss.  Nothing was compiled or loaded; the line only misleads."""

    def filter(self, record) -> bool:
        return not record.getMessage().startswith("Compiled the loaded model, but the compiled")


@contextlib.contextmanager
def _without_uncompiled_notice():
    notice, logger = _UncompiledNotice(), tf.get_logger()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)
