"""A run folder shared by a team (one group, ``umask 002``) whose lock file another user's
run created and this user cannot open.  QA: a second user's ``tfmp train --resume`` into a
live run's folder printed "cannot write .../.tfmp-run.lock: permission denied", exit 5, and
replaced the live run's metrics.json with "failed" (a finished run's "completed" too).  A
run that has not taken the folder's lock now writes nothing there: one line naming the
lock's owner, exit 2, every byte and owner kept; and the lock file follows the umask, as
metrics.json does, so such a team shares it.

As root (the host's CI) the second user is a real other UID (``seteuid``); as any other
user (the image's self-test) the lock file is made unopenable with ``chmod``."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile

import pytest

from app.run_folder.lock import LOCK_NAME, LockOfAnotherUser, OutputInUse, RunLock
from app.training.recorder import FolderNotHeld, Recorder

from tests.unit.helpers import error_lines

ROOT = os.geteuid() == 0
OWNER_UID, TEAM_GID, SECOND_UID = 4001, 4000, 4002

TINY = ["--model", "mlp", "--dataset", "synthetic", "--max-train-samples", "256",
        "--max-val-samples", "64", "--precision", "float32", "--batch-size", "32",
        "--offline", "--progress", "lines"]


@pytest.fixture
def shared(tmp_path):
    """A folder every UID can reach (pytest's own tmp folders are root's alone)."""
    base = tempfile.mkdtemp(prefix="tfmp-shared-", dir="/tmp")
    os.chmod(base, 0o777)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _others_lock(folder: str, readable: bool) -> None:
    """Make ``folder``'s lock file one this user cannot open read-write (``readable``: it
    may still read it), the rest group-writable as a shared folder's."""
    lock = os.path.join(folder, LOCK_NAME)
    if not ROOT:
        os.chmod(lock, 0o444 if readable else 0o000)
        return
    for root, dirs, files in os.walk(folder):
        for name in [root] + [os.path.join(root, n) for n in dirs + files]:
            os.chown(name, OWNER_UID, TEAM_GID)
            os.chmod(name, os.stat(name).st_mode | 0o060)
    os.chmod(lock, 0o644 if readable else 0o600)   # created under umask 022 (or 077)


@contextlib.contextmanager
def _as_second_user():
    """Root: this process acts as another member of the team until the block ends."""
    if not ROOT:
        yield
        return
    os.setegid(TEAM_GID)
    os.seteuid(SECOND_UID)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def _contents(folder):
    """Every file and folder with its bytes' digest and its owner."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            digest = (hashlib.sha256(open(path, "rb").read()).hexdigest()
                      if os.path.isfile(path) and os.access(path, os.R_OK) else None)
            found[os.path.relpath(path, folder)] = (digest, st.st_uid, st.st_mode)
    return found


@pytest.mark.parametrize("umask, mode", [(0o002, 0o664), (0o022, 0o644)])
def test_the_lock_file_is_created_with_the_umasks_mode(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        with RunLock(str(tmp_path / "run")) as lock:
            assert os.stat(lock.path).st_mode & 0o777 == mode
    finally:
        os.umask(old)


def test_an_unopenable_lock_is_refused_as_another_users(shared):
    out = os.path.join(shared, "run")
    RunLock(out).acquire().release()
    _others_lock(out, readable=False)
    before = _contents(out)
    with _as_second_user():
        for look in (RunLock(out).check_free, RunLock(out).acquire):
            with pytest.raises(LockOfAnotherUser) as err:
                look()
            line = err.value.line()
            assert line.startswith(f"error: output directory {out!r} is locked by another "
                                   f"user: its lock file {os.path.join(out, LOCK_NAME)!r} "
                                   f"belongs to UID {os.stat(out + '/' + LOCK_NAME).st_uid}")
            assert "may be in use by their run" in line
            assert "allowed: another --output, or the folder's owner makes it writable" in line
    assert _contents(out) == before


def test_a_live_run_behind_a_read_only_lock_is_named(shared):
    """A lock file this user may read but not write: a read-only look finds the live run,
    named as any other (local file systems lock read-only descriptors)."""
    out = os.path.join(shared, "live")
    with RunLock(out, command="tfmp train --output live"):
        _others_lock(out, readable=True)
        with _as_second_user():
            with pytest.raises(OutputInUse) as err:
                RunLock(out).check_free()
    assert f"pid {os.getpid()}" in err.value.line()
    assert "command: tfmp train --output live" in err.value.line()


def test_a_recorder_writes_nothing_into_a_folder_it_does_not_hold(tmp_path):
    recorder = Recorder(str(tmp_path), {"status": "running", "epochs": []}, None, epochs=1,
                        train_samples=1, is_chief=True, plain=True,
                        folder_lock=RunLock(str(tmp_path)))
    recorder.finish("failed", diagnosis="a refused run's error")
    recorder.on_disk = json.dumps({"status": "running"})
    recorder.record_stop_at_once(15, None)         # a second signal, before open()
    with pytest.raises(FolderNotHeld):
        recorder.open()
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A real two-epoch run with its checkpoints, trained once for the module."""
    from app.cli import main

    out = tmp_path_factory.mktemp("done") / "run"
    assert main(["train", *TINY, "--epochs", "2", "--no-save-model", "--output", str(out)]) == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("refused_at", ["the first look", "taking the lock"])
def test_resume_into_another_users_run_exits_2_and_writes_nothing(
        finished_run, shared, capsys, monkeypatch, refused_at):
    """``taking the lock``: the first look found the folder free (the other user's run
    started after it): the refusal then comes from the lock itself, still before any
    write."""
    from app.cli import main

    out = os.path.join(shared, "run")
    shutil.copytree(finished_run, out)
    _others_lock(out, readable=False)
    before = _contents(out)
    if refused_at == "taking the lock":
        monkeypatch.setattr(RunLock, "check_free", lambda self: None)
    capsys.readouterr()
    with _as_second_user():
        code = main(["train", *TINY, "--epochs", "3", "--no-save-model", "--output", out,
                     "--resume"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = error_lines(err)
    assert len(lines) == 1 and "is locked by another user" in lines[0], err
    assert _contents(out) == before    # metrics.json's bytes and owner, and no new file
    assert json.loads(open(os.path.join(out, "metrics.json")).read())["status"] == "completed"
