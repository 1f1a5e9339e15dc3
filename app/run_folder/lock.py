"""One run per output folder: an OS file lock held for the run's whole life.

Two runs writing one folder (the same command in two SSH sessions, a scheduler retrying a
job whose first attempt still runs) interleave checkpoints, TensorBoard events and
metrics.json, and both report success.  The chief of every run therefore holds
``flock(LOCK_EX)`` on ``<output>/.tfmp-run.lock`` from before its first write until it
exits.  The kernel drops the lock with the process, so ``kill -9``, an OOM kill or a
``docker kill`` leaves no stale lock to clean up; the file's text (who holds it) is only
read to name the other run.

``flock`` works on local file systems, Docker's overlay and named volumes and bind mounts;
on NFS, Linux emulates it with byte-range locks held by the server, which also work
between hosts.

    lock = RunLock(output)
    lock.check_free()        # before validation ends: refuses, creates nothing
    ...
    lock.acquire()           # just before the first write; held until release()/exit
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from datetime import datetime, timezone
from typing import Optional

from app.core.errors import UsageError

LOCK_NAME = ".tfmp-run.lock"


class OutputInUse(UsageError):
    """Another live process holds the output folder (exit status 2, nothing written)."""

    def __init__(self, output: str, holder: dict):
        self.output, self.holder = output, holder
        super().__init__(f"output directory {output!r} is in use by another run "
                         f"({describe_holder(holder)})",
                         "another --output, wait for that run to finish, or stop it "
                         "(its checkpoints let --resume continue it later)")


def describe_holder(holder: dict) -> str:
    if not holder:
        return "its details could not be read"
    parts = [f"host {holder.get('host', '?')}", f"pid {holder.get('pid', '?')}",
             f"started {holder.get('started_utc', '?')}"]
    command = holder.get("command")
    if command:
        parts.append(f"command: {command}")
    return ", ".join(parts)


def current_command() -> str:
    """This process's command line as the user typed it (``tfmp train ...``), or the
    script that called the Python API."""
    argv = list(sys.argv) or ["python"]
    first = os.path.basename(argv[0])
    if first in ("tfmp", "__main__.py"):
        return " ".join(["tfmp"] + argv[1:])
    return " ".join(["python"] + argv)


def _this_run(command: Optional[str]) -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": command if command is not None else current_command()}


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _read_holder(path: str) -> dict:
    # The holder writes its details right after locking; a reader racing that write may
    # see an empty file for a moment.
    for _ in range(20):
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError:
            return {}
        if text.strip():
            try:
                holder = json.loads(text)
            except ValueError:
                return {}
            return holder if isinstance(holder, dict) else {}
        time.sleep(0.05)
    return {}


class RunLock:
    """The lock on one output folder; a context manager that acquires and releases it."""

    def __init__(self, output: str, command: Optional[str] = None):
        self.output, self.command = output, command
        self.path = os.path.join(output, LOCK_NAME)
        self.fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def check_free(self) -> None:
        """Raise ``OutputInUse`` if a live run holds the folder; create nothing."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        except OSError:
            return  # unreadable: acquire() will say why, with the path
        try:
            if not _try_lock(fd):
                raise OutputInUse(self.output, _read_holder(self.path))
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def acquire(self) -> "RunLock":
        """Create the folder if needed and take the lock, or raise ``OutputInUse``."""
        if self.fd is not None:
            return self
        os.makedirs(self.output, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not _try_lock(fd):
                raise OutputInUse(self.output, _read_holder(self.path))
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(_this_run(self.command)) + "\n").encode("utf-8"))
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def release(self) -> None:
        # The file stays: unlinking a lock file lets a third process lock a new inode while
        # a second still waits on the old one.  An unlocked file means a free folder.
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
