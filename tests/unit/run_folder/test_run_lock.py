"""One run per output folder (app/run_folder/lock.py): a real flock, real processes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from app.core.errors import UsageError
from app.run_folder.lock import LOCK_NAME, OutputInUse, RunLock

from tests.paths import ROOT

TWINS = ("the same two runs are driven in real containers on TF 2.9 by "
         "tests/image/test_interrupt_image.py and test_stack.py")
# Each drives both runs (a second run refused, a killed one's folder free for --resume).
TWIN_TESTS = (
    "tests/image/test_interrupt_image.py::"
    "test_two_jobs_on_one_volume_one_trains_and_docker_kill_frees_the_folder",
    "tests/image/test_stack.py::test_one_run_per_output_folder_over_ssh",
)


# A child that takes the lock, says so, and sleeps until killed.
HOLDER = textwrap.dedent("""
    import sys, time
    from app.run_folder.lock import RunLock
    lock = RunLock(sys.argv[1], command="tfmp train --output twin").acquire()
    print("locked", flush=True)
    time.sleep(120)
""")


@pytest.fixture
def holder(tmp_path):
    out = tmp_path / "twin"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "locked", "the holder never took the lock"
        yield out, proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_acquire_creates_the_folder_and_names_this_process(tmp_path):
    out = tmp_path / "runs" / "a"
    with RunLock(str(out), command="tfmp train x") as lock:
        assert lock.held
        holder = json.loads((out / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid()
        assert holder["command"] == "tfmp train x"
        assert holder["host"] and holder["started_utc"].endswith("Z")
    assert not lock.held


def test_check_free_creates_nothing(tmp_path):
    out = tmp_path / "new"
    RunLock(str(out)).check_free()
    assert not out.exists()


def test_released_lock_can_be_taken_again_in_the_same_process(tmp_path):
    RunLock(str(tmp_path)).acquire().release()
    lock = RunLock(str(tmp_path)).acquire()
    lock.release()


def test_second_process_is_refused_with_the_first_named(holder):
    out, proc = holder
    before = sorted(os.listdir(out))
    with pytest.raises(OutputInUse) as err:
        RunLock(str(out)).check_free()
    with pytest.raises(OutputInUse):
        RunLock(str(out)).acquire()
    line = err.value.line()
    assert isinstance(err.value, UsageError)   # exit status 2 through app.cli
    assert line.startswith(f"error: output directory {str(out)!r} is in use by another run")
    assert f"pid {proc.pid}" in line and "command: tfmp train --output twin" in line
    assert "allowed: another --output, wait for that run to finish, or stop it" in line
    assert "\n" not in line
    # The refusal touched nothing, not even the holder's details.
    assert sorted(os.listdir(out)) == before
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == proc.pid


def test_kill_9_leaves_no_stale_lock(holder):
    out, proc = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    RunLock(str(out)).check_free()
    with RunLock(str(out)) as lock:
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
        assert lock.held


def test_same_process_second_lock_is_refused(tmp_path):
    # flock belongs to the open file: a second RunLock in one process (two app.train calls
    # on one folder from two threads) is refused like another process.
    first = RunLock(str(tmp_path)).acquire()
    try:
        with pytest.raises(OutputInUse):
            RunLock(str(tmp_path)).acquire()
    finally:
        first.release()


# ---- through `tfmp train`: two real runs into one folder ---------------------------------------

TRAIN = ["train", "--dataset", "synthetic", "--max-train-samples", "20000",
         "--max-val-samples", "256", "--batch-size", "32", "--precision", "float32",
         "--epochs", "3", "--offline", "--no-save-model", "--progress", "lines",
         "--log-every", "50"]


def _snapshot(folder):
    """Every file of a run folder with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.host_only(reason=TWINS)
@pytest.mark.in_containers(reason=TWINS, twins=TWIN_TESTS)
def test_second_train_into_a_live_runs_folder_exits_2_and_touches_nothing(tmp_path):
    from tests.unit.helpers import run_app
    from tests.unit.training_process import TrainingProcess

    out = tmp_path / "twin"
    with TrainingProcess([*TRAIN, "--output", str(out)]) as first:
        first.wait_inside_epoch(2)      # the first run has written its epoch 1
        # Paused (its lock held) so that any change to the folder is the refusals' doing.
        first.send(signal.SIGSTOP)
        before = _snapshot(out)
        assert "metrics.json" in before and LOCK_NAME in before
        second = run_app(*TRAIN, "--output", str(out), timeout=300)
        also_resume = run_app(*TRAIN, "--output", str(out), "--resume", timeout=300)
        assert _snapshot(out) == before
        first.proc.send_signal(signal.SIGCONT)
        code, _, err = first.finish(timeout=600)
    assert code == 0, err              # exactly one run trained, undisturbed
    final = json.loads((out / "metrics.json").read_text())
    assert final["status"] == "completed" and [e["epoch"] for e in final["epochs"]] == [1, 2, 3]
    for refused in (second, also_resume):
        assert refused.returncode == 2, refused.stderr
        lines = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, refused.stderr
        assert "is in use by another run" in lines[0]
        assert f"pid {first.proc.pid}" in lines[0] and "tfmp train" in lines[0]
        assert "another --output" in lines[0] and "wait for that run to finish" in lines[0]


@pytest.mark.slow
@pytest.mark.host_only(reason=TWINS)
@pytest.mark.in_containers(reason=TWINS, twins=TWIN_TESTS)
def test_a_run_killed_with_sigkill_leaves_the_folder_free_for_resume(tmp_path):
    from tests.unit.helpers import run_app
    from tests.unit.training_process import TrainingProcess

    out = tmp_path / "killed"
    with TrainingProcess([*TRAIN, "--output", str(out)]) as run:
        run.wait_inside_epoch(2)
        run.send(signal.SIGKILL)        # no handler, no cleanup: only the kernel drops the lock
        run.finish()
    assert (out / LOCK_NAME).exists()  # the file stays; its lock died with the process
    resumed = run_app(*TRAIN, "--output", str(out), "--resume", timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    final = json.loads((out / "metrics.json").read_text())
    assert final["status"] == "completed"
    assert [e["epoch"] for e in final["epochs"]] == [1, 2, 3]


# ---- file systems that lock differently (issue 24, item 7) -------------------------------------

def _nfs_like_flock(real):
    """flock as Linux emulates it on NFS: a byte-range lock, which an exclusive lock on a
    descriptor opened read-only cannot take (EBADF)."""
    import errno
    import fcntl

    def flock(fd, op):
        if op & fcntl.LOCK_EX and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return real(fd, op)
    return flock


def test_the_lock_works_where_flock_is_a_byte_range_lock_as_on_nfs(tmp_path, monkeypatch):
    import fcntl

    from app.run_folder import lock as run_lock

    monkeypatch.setattr(run_lock.fcntl, "flock", _nfs_like_flock(fcntl.flock))
    out = tmp_path / "run"
    RunLock(str(out)).check_free()                 # no file yet
    with RunLock(str(out)):
        with pytest.raises(OutputInUse):           # held: refused, not EBADF
            RunLock(str(out)).check_free()
    RunLock(str(out)).check_free()                 # --resume's check on a released lock file
    with RunLock(str(out)) as again:
        assert again.held


def test_a_file_system_without_locks_is_one_line_naming_the_folder_and_the_fs(tmp_path,
                                                                              monkeypatch):
    import errno

    from app.run_folder import lock as run_lock

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text("")
    monkeypatch.setattr(run_lock.fcntl, "flock", no_locks)
    for call in (RunLock(str(out)).check_free, RunLock(str(out)).acquire):
        with pytest.raises(run_lock.LockUnavailable) as err:
            call()
        line = err.value.line()
        assert len(line.splitlines()) == 1 and str(out) in line and "ENOLCK" in line
        assert f"on a {run_lock.filesystem_of(str(out))} file system" in line
        assert "nolock" in line


def test_filesystem_of_takes_the_longest_mount_point(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                    "40 22 0:50 / /mnt/shared rw - nfs4 srv:/export rw\n"
                    "41 22 0:51 / /mnt/sharedx rw - tmpfs tmpfs rw\n")
    from app.run_folder.lock import filesystem_of

    assert filesystem_of("/mnt/shared/runs/a", str(info)) == "nfs4"
    assert filesystem_of("/mnt/sharedx", str(info)) == "tmpfs"
    assert filesystem_of("/home/x", str(info)) == "ext4"
    assert filesystem_of("/x", str(tmp_path / "missing")) == "unknown"


def test_release_and_remove_leaves_no_lock_file(tmp_path):
    lock = RunLock(str(tmp_path)).acquire()
    lock.release_and_remove()
    assert not (tmp_path / LOCK_NAME).exists() and not lock.held


# ---- what holds the folder: a run or a tune --------------------------------------------------

def _refusal_by(out, kind: str, command: str, said=None) -> str:
    """The line a second run (or tune) into ``out`` gets while ``kind`` holds it."""
    from app.run_folder.lock import describe_holder

    with RunLock(str(out), command=command, kind=kind):
        holder = json.loads((out / LOCK_NAME).read_text())
        assert holder["kind"] == kind
        with pytest.raises(OutputInUse) as err:
            RunLock(str(out), said=said).check_free()
    return err.value.line().replace(describe_holder(holder), "DETAILS")


def test_a_folder_a_tune_holds_says_so_with_no_word_of_resuming(tmp_path):
    """It said "stop it (its checkpoints let --resume continue it later)": a tune has no
    checkpoints and no --resume (a QA pass)."""
    from app.core import settings
    from app.run_folder.lock import TUNE

    out = tmp_path / "tuned"
    line = _refusal_by(out, TUNE, "tfmp tune --output tuned")
    assert line == (f"error: output directory {str(out)!r} is in use by a running tune "
                    "(DETAILS); allowed: another --output, wait for that tune to finish, or stop "
                    "it (a stopped tune leaves nothing to continue: run it again to start over)")
    under_api = _refusal_by(out, TUNE, "python tune.py", settings.GivenAs(keyword=True))
    assert "allowed: another output=..., wait for that tune" in under_api
    assert "resume" not in line + under_api and "checkpoint" not in line + under_api


def test_a_folder_a_run_holds_is_refused_as_before(tmp_path):
    from app.run_folder.lock import RUN

    out = tmp_path / "run"
    assert _refusal_by(out, RUN, "tfmp train --output run") == (
        f"error: output directory {str(out)!r} is in use by another run (DETAILS); allowed: "
        "another --output, wait for that run to finish, or stop it (its checkpoints let "
        "--resume continue it later)")
    # A lock file written before the kind was recorded is a run's.
    assert "in use by another run" in OutputInUse(str(out), {"pid": 1}).line()


@pytest.mark.parametrize("look", ["acquire", "check_free"])
def test_a_lock_file_removed_between_open_and_lock_is_not_taken_as_the_lock(tmp_path,
                                                                           monkeypatch, look):
    """A (a failed tune) releases and removes its lock file after B opened it but before B
    locked it, and C takes the path's new file: B's lock on the removed file guarded
    nothing, so B and C both held the folder.  B now looks at the path's file again."""
    import app.run_folder.lock as lock_module

    out = str(tmp_path / "run")
    a, c = RunLock(out).acquire(), RunLock(out)
    real_try_lock, moved = lock_module._try_lock, []

    def a_lets_go_and_c_starts_first(fd):
        if not moved:
            moved.append(fd)
            a.release_and_remove()      # B has A's file open; A lets go of it now
            c.acquire()                 # and C makes and locks a new one
        return real_try_lock(fd)

    monkeypatch.setattr(lock_module, "_try_lock", a_lets_go_and_c_starts_first)
    with pytest.raises(OutputInUse):
        getattr(RunLock(out), look)()   # B
    assert c.held
    c.release()
