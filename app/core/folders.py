"""A folder the user names for outputs (``--output``, ``--install``): checked before any work
starts, and made with one clear line when the file system still refuses.

The check walks up from the folder to the part of the path that exists, because that part
decides whether the rest can be made.  On the way it stops at a link whose target is gone:
a run folder kept on a volume that is not mounted today (``runs -> /mnt/data/runs``) is the
common case, and ``os.makedirs`` reports it as "No such file or directory: 'runs/a'" about a
folder the user asked us to create.

The check cannot foresee everything (root passes ``os.access`` on /proc, another process
can remove a folder between the check and the write), so ``make_folder`` turns the
``OSError`` of the creation itself into the same kind of line.
"""
from __future__ import annotations

import os

from app.core.errors import UsageError

ALLOWED = "a writable directory path"


def check_writable(path: str, what: str = "output directory") -> None:
    """Fail early, creating nothing, when ``path`` cannot be made and written: a part of it
    that is a link to nothing, or a file, or the first existing folder above it not
    writable.  ``what`` names the flag's folder in the line."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        if os.path.islink(probe):
            raise UsageError(f"{what} {path!r} cannot be created: {probe!r} is a link to "
                             f"{os.readlink(probe)!r}, which does not exist (a volume or "
                             "folder that is not there now?)",
                             f"{ALLOWED}, or a link to an existing folder")
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise UsageError(f"{what} {path!r} cannot be created: {probe!r} is not a directory",
                         ALLOWED)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {path!r} is not writable ({probe!r} denies writing)",
                         ALLOWED)


def make_folder(path: str, what: str = "output directory") -> None:
    """``os.makedirs(path, exist_ok=True)``; a refusal is one line (``UsageError``), never a
    traceback.  Checked first (an existing folder too: it must be writable), so a dangling
    link is named as such."""
    check_writable(path, what)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise _cannot_create(path, what, exc) from None


def make_new_folder(path: str, what: str = "output directory") -> bool:
    """Create ``path`` as this process's own: True when it was made here, False when it
    exists already.  ``os.mkdir`` is the claim: of two processes making one folder at
    once, exactly one succeeds (``os.makedirs(exist_ok=True)`` lets both think they made
    it).  Its parents are made as ``make_folder`` makes them; a refusal is one line."""
    make_folder(os.path.dirname(os.path.abspath(path)), what)
    try:
        os.mkdir(path)
    except FileExistsError:
        return False
    except OSError as exc:
        raise _cannot_create(path, what, exc) from None
    return True


def _cannot_create(path: str, what: str, exc: OSError) -> UsageError:
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    where = f" ({exc.filename!r})" if exc.filename and exc.filename != path else ""
    return UsageError(f"{what} {path!r} cannot be created: {why}{where}", ALLOWED)


def current_umask() -> int:
    """This process's umask.  Read from /proc (Linux 4.7+): setting it to 0 and back, the
    only other way, lets a thread that creates a file at that moment make it 0666."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0)
    os.umask(umask)
    return umask


# The mode TensorFlow's POSIX file system gives every folder it makes (checkpoints/,
# tensorboard/, a SavedModel's variables/), whatever the umask.
TENSORFLOW_FOLDER_MODE = 0o755


def follow_umask(root: str) -> None:
    """Give this user's folders under ``root`` that TensorFlow made the mode the umask asks
    for, as the files in them have.  Under a team's ``umask 002`` those folders were 0755
    while the files were 0664: a teammate could replace metrics.json but not write the next
    checkpoint, so ``--resume`` of a shared run failed.  A folder with any other mode was
    chosen by someone and stays; nothing happens under the usual umask 022."""
    wanted = 0o777 & ~current_umask()
    if wanted == TENSORFLOW_FOLDER_MODE:
        return
    me = os.geteuid()
    for top, dirs, _ in os.walk(root):    # links are not followed
        for path in [top] + [os.path.join(top, d) for d in dirs]:
            try:
                st = os.lstat(path)
                if st.st_uid == me and st.st_mode & 0o777 == TENSORFLOW_FOLDER_MODE:
                    os.chmod(path, (st.st_mode & 0o7000) | wanted)   # setgid kept
            except OSError:
                continue   # removed meanwhile, or not ours to change: left as it is
