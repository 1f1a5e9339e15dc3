"""A training job that cannot write its outputs: one line, its own exit status, a resumable state.

The most common fault of a long job is a full disk (or a read-only mount, a quota, a
permission lost mid-run).  TensorFlow reports it as a 26-line ``ResourceExhaustedError ...
No space left on device [Op:SaveV2]`` and leaves a ``ckpt-N_temp`` folder behind.  Here it
becomes ``OutputFault``: the path, the cause, what to do; ``tfmp train`` exits
with ``EXIT_OUTPUT_FAULT``.  Half-written checkpoint folders are removed; the last complete
checkpoint is never touched, so after freeing space the same command with ``--resume``
finishes the job.
"""
from __future__ import annotations

import errno
import glob
import os
import re
import shutil
from typing import Optional

from app.core.errors import ReportedError
from app.core.exit_codes import EXIT_OUTPUT_FAULT

# errno -> (what the user reads, what to do)
_CAUSES = {
    errno.ENOSPC: ("no space left on the device", "free space on that volume (or give the "
                   "container a larger one)"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota"),
    errno.EROFS: ("the file system is read-only", "mount the output folder read-write"),
    errno.EACCES: ("permission denied", "make the output folder writable for this user "
                   "(in the image: NB_UID/NB_GID must own the mounted folder)"),
    errno.EPERM: ("operation not permitted", "make the output folder writable for this user"),
    errno.EIO: ("an I/O error from the device", "check the disk or network mount"),
}
# TensorFlow's file ops report the OS error only as text.
_TEXTS = (
    (re.compile(r"no space left on device", re.I), errno.ENOSPC),
    (re.compile(r"disk quota exceeded", re.I), errno.EDQUOT),
    (re.compile(r"read-only file system", re.I), errno.EROFS),
    (re.compile(r"permission denied", re.I), errno.EACCES),
    (re.compile(r"operation not permitted", re.I), errno.EPERM),
    (re.compile(r"input/output error", re.I), errno.EIO),
)
_PATH_IN_TEXT = re.compile(r"(/[^\s:;'\"]+)")


class OutputFault(ReportedError):
    """Writing ``path`` failed for ``cause``; see ``line()``."""

    exit_status = EXIT_OUTPUT_FAULT

    def __init__(self, path: str, code: int, detail: str = "", resume_hint: str = ""):
        self.path, self.code, self.detail, self.resume_hint = path, code, detail, resume_hint
        super().__init__(self.line())

    @property
    def cause(self) -> str:
        return _CAUSES.get(self.code, (os.strerror(self.code), ""))[0]

    def line(self) -> str:
        todo = _CAUSES.get(self.code, ("", "fix the output folder"))[1]
        return (f"error: cannot write {self.path}: {self.cause}; {todo}, then "
                + (self.resume_hint or "run the same command again"))


def classify(exc: BaseException) -> Optional[int]:
    """The errno behind an output failure, or None when ``exc`` is something else."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _CAUSES:
            return exc.errno
        name = type(exc).__name__
        if name in ("ResourceExhaustedError", "UnknownError", "PermissionDeniedError",
                    "FailedPreconditionError", "InternalError", "NotFoundError", "OSError",
                    "UnavailableError", "AbortedError", "DataLossError"):
            text = str(exc)
            for pattern, code in _TEXTS:
                if pattern.search(text):
                    return code
        exc = exc.__cause__ or exc.__context__
    return None


def path_of(exc: BaseException, default: str) -> str:
    """The file named by the error when it names one under ``default``, else ``default``."""
    if isinstance(exc, OSError) and exc.filename:
        return str(exc.filename)
    for candidate in _PATH_IN_TEXT.findall(str(exc)):
        if candidate.startswith(os.path.abspath(default)):
            candidate = candidate.rstrip(".,)")
            # TensorFlow names its scratch file (ckpt-2_temp/part-...tempstate123): the
            # user's question is which folder, so name the checkpoints folder.
            parts = candidate.split(os.sep)
            temp = [i for i, p in enumerate(parts) if "_temp" in p]
            return os.sep.join(parts[:temp[0]]) if temp else candidate
    return default


def remove_partial_checkpoints(checkpoint_dir: str) -> list:
    """Delete what an interrupted save leaves: ``<prefix>_temp*`` folders (TensorFlow's
    sharded writer) and files of a checkpoint whose ``.index`` never made it."""
    removed = []
    for path in glob.glob(os.path.join(checkpoint_dir, "*_temp*")):
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else _unlink(path)
        removed.append(path)
    for data in glob.glob(os.path.join(checkpoint_dir, "*.data-*")):
        prefix = data.split(".data-")[0]
        if not os.path.exists(prefix + ".index"):
            _unlink(data)
            removed.append(data)
    return removed


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
