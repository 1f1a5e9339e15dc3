"""One run per output folder: an OS file lock held for the run's whole life.

Two runs writing one folder (the same command in two SSH sessions, a scheduler retrying a
job whose first attempt still runs) interleave checkpoints, TensorBoard events and
metrics.json, and both report success.  The chief of every run therefore holds
``flock(LOCK_EX)`` on ``<output>/.tfmp-run.lock`` from before its first write until it
exits.  The kernel drops the lock with the process, so ``kill -9``, an OOM kill or a
``docker kill`` leaves no stale lock to clean up; the file's text (who holds it) is only
read to name the other run.

``flock`` works on local file systems, Docker's overlay and named volumes and bind mounts;
on NFS, Linux emulates it with a byte-range (POSIX) lock held by the server, which also
works between hosts, with two conditions: an exclusive byte-range lock needs a file open
for writing (a read-only descriptor fails with EBADF there), so the lock file is always
opened read-write; and NFSv3 locks need the lock daemon (``lockd``/``rpc.statd``) on both
ends, while a ``nolock`` mount keeps locks local to each host (docs/distributed.md).  A
file system that cannot lock at all is one line naming the folder and the file system.

The lock file is created as any other file of the run (``0o666`` less the umask), so a
team sharing a group and ``umask 002`` shares run folders, lock included, as it shares
metrics.json.  A lock file this user cannot open read-write (another user's, under a
stricter umask) cannot be taken: that is a refusal naming its owner, never a write fault
(``LockOfAnotherUser``); a read-only descriptor still tells whether a run holds it now,
where the file system locks one (local disks: then the refusal names that run).

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

from app.core import folders
from app.core.errors import UsageError
from app.core.settings import spelled

LOCK_NAME = ".tfmp-run.lock"


class LockUnavailable(UsageError):
    """The file system refused the lock itself (not another run): exit status 2, one line."""

    def __init__(self, output: str, path: str, exc: OSError, said=None):
        fs = filesystem_of(output)
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        super().__init__(f"cannot lock {path!r} to keep other runs out of {output!r}: "
                         f"{why} (errno {errno.errorcode.get(exc.errno, exc.errno)}) on a "
                         f"{fs} file system",
                         f"an {spelled(said, 'output')} on a file system with working locks: "
                         "local, a Docker "
                         "volume, or NFS with its lock service (NFSv4, or NFSv3 with lockd; "
                         "not a `nolock` mount)")


def filesystem_of(path: str, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The type of the file system holding ``path`` (``nfs4``, ``ext4``, ...), from the
    longest mount point that contains it; "unknown" where /proc cannot tell."""
    probe = os.path.realpath(path)
    best, fstype = "", "unknown"
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return fstype
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        point = fields[4].replace("\\040", " ")
        inside = probe == point or probe.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, right.split()[0]
    return fstype


class LockOfAnotherUser(UsageError):
    """The folder's lock file exists and this user cannot open it to lock it: another
    user's, whose run may hold the folder.  Exit status 2, nothing written."""

    def __init__(self, output: str, path: str, said=None):
        owner = _owner_of(path)
        super().__init__(f"output directory {output!r} is locked by another user: its lock "
                         f"file {path!r} belongs to UID {owner}, which this user (UID "
                         f"{os.geteuid()}) cannot open, and may be in use by their run; "
                         "nothing was written",
                         f"another {spelled(said, 'output')}, or the folder's owner makes it "
                         f"writable for this user (chmod g+w {path!r} for a shared group)")


def _owner_of(path: str) -> str:
    try:
        return str(os.stat(path).st_uid)
    except OSError:
        return "?"


# What holds a folder (the lock file's "kind"): a training run, or a tune.  A lock file
# written before the kind was recorded is a run's.
RUN, TUNE = "run", "tune"


class OutputInUse(UsageError):
    """Another live process holds the output folder (exit status 2, nothing written); the
    line says which kind of job holds it, and what stopping it would leave: a run's
    checkpoints, which --resume continues, or nothing of a tune's (it starts over)."""

    def __init__(self, output: str, holder: dict, said=None):
        self.output, self.holder = output, holder
        if holder.get("kind") == TUNE:
            who, job = "a running tune", "tune"
            stopped = "a stopped tune leaves nothing to continue: run it again to start over"
        else:
            who, job = "another run", "run"
            stopped = f"its checkpoints let {spelled(said, 'resume')} continue it later"
        super().__init__(f"output directory {output!r} is in use by {who} "
                         f"({describe_holder(holder)})",
                         f"another {spelled(said, 'output')}, wait for that {job} to finish, "
                         f"or stop it ({stopped})")


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


def _this_run(command: Optional[str], kind: str) -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": command if command is not None else current_command(), "kind": kind}


def _still_the_lock_file(fd: int, path: str) -> bool:
    """Whether the file ``fd`` locked is still the one at ``path`` (not removed meanwhile)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (st.st_dev, st.st_ino)


def _try_lock(fd: int) -> bool:
    """True when locked, False when another open file holds the lock; any other failure
    (ENOLCK: no lock service, EBADF, ...) is raised for the caller to name."""
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
    """The lock on one output folder; a context manager that acquires and releases it.
    ``said``: how the user gave the settings (``app.core.settings.given_as``), whose words
    its refusals use (``output=`` under app.train; None: the flags).  ``kind``: what holds
    it, ``RUN`` or ``TUNE``, written beside the holder's details for the refusal to name."""

    def __init__(self, output: str, command: Optional[str] = None, said=None,
                 kind: str = RUN):
        self.output, self.command, self.said, self.kind = output, command, said, kind
        self.path = os.path.join(output, LOCK_NAME)
        self.fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def check_free(self) -> None:
        """Raise ``OutputInUse`` if a live run holds the folder; create nothing.

        Opened read-write like ``acquire``: on NFS an exclusive lock on a read-only
        descriptor fails (EBADF) whatever the folder holds."""
        for _ in range(10):
            try:
                fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                return
            except PermissionError:
                self._refuse_anothers_lock()
            except OSError:
                return  # not writable: acquire() will say why, with the path
            try:
                self._lock_or_raise(fd)
                fcntl.flock(fd, fcntl.LOCK_UN)
                if _still_the_lock_file(fd, self.path):
                    return
            finally:
                os.close(fd)
            # A file its holder removed (release_and_remove): look at the path's new one.

    def _refuse_anothers_lock(self) -> None:
        """The lock file exists and this user may not open it read-write: raise
        ``OutputInUse`` when a read-only look finds a run holding it (the holder named, as
        for a lock of this user's), else ``LockOfAnotherUser``.  Locks nothing."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            raise LockOfAnotherUser(self.output, self.path, self.said) from None
        try:
            free = _try_lock(fd)
        except OSError:   # NFS: no exclusive lock on a read-only descriptor, nothing known
            free = True
        finally:
            os.close(fd)   # closing drops the lock this look may have taken
        if not free:
            raise OutputInUse(self.output, _read_holder(self.path), self.said)
        raise LockOfAnotherUser(self.output, self.path, self.said)

    def _lock_or_raise(self, fd: int) -> None:
        """Take the exclusive lock on ``fd`` without waiting, or raise: ``OutputInUse`` naming
        the live holder, ``LockUnavailable`` when the file system cannot lock."""
        try:
            free = _try_lock(fd)
        except OSError as exc:
            raise LockUnavailable(self.output, self.path, exc, self.said) from None
        if not free:
            raise OutputInUse(self.output, _read_holder(self.path), self.said)

    def acquire(self) -> "RunLock":
        """Create the folder if needed and take the lock, or raise ``OutputInUse``."""
        if self.fd is not None:
            return self
        folders.make_folder(self.output)
        for _ in range(10):
            fd = self._open_and_lock()
            if _still_the_lock_file(fd, self.path):
                break
            # Locked after its holder removed it (release_and_remove): that file is
            # nobody's lock any more, and a run opening the path now makes a new one.
            os.close(fd)
        else:
            raise LockUnavailable(self.output, self.path,
                                  OSError(0, "the lock file kept being replaced"), self.said)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(_this_run(self.command, self.kind)) + "\n").encode("utf-8"))
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def _open_and_lock(self) -> int:
        """The lock file opened (created if missing) and locked, or the refusal."""
        try:
            # Like every other file of the run: 0o666 less the umask (module docstring).
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            if os.path.lexists(self.path):
                self._refuse_anothers_lock()
            # The folder refuses a new file though it looked writable (check_writable):
            # its line, the one a folder that cannot be written at all gets.
            raise UsageError(f"output directory {self.output!r} is not writable (cannot "
                             f"create {self.path!r})", folders.ALLOWED) from None
        except OSError as exc:
            raise LockUnavailable(self.output, self.path, exc, self.said) from None
        try:
            self._lock_or_raise(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

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

    def release_and_remove(self) -> None:
        """Release after a run that wrote nothing else: the lock file goes too.  Unlinked while
        still locked: a process that opened it before and locks it after finds it is no longer
        the path's file and opens the path again (``acquire``); one that opens it after makes
        a new one."""
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        self.release()

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
