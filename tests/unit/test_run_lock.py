"""One run per output folder (app/run_folder/lock.py): a real flock, real processes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from app.core.errors import UsageError
from app.run_folder.lock import LOCK_NAME, OutputInUse, RunLock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
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
@pytest.mark.host_only(reason="the same two runs are driven in real containers on TF 2.9 by "
                               "tests/image/test_interrupt_image.py and test_stack.py")
def test_second_train_into_a_live_runs_folder_exits_2_and_touches_nothing(tmp_path):
    from conftest import run_app
    from training_process import TrainingProcess

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
@pytest.mark.host_only(reason="the same two runs are driven in real containers on TF 2.9 by "
                               "tests/image/test_interrupt_image.py and test_stack.py")
def test_a_run_killed_with_sigkill_leaves_the_folder_free_for_resume(tmp_path):
    from conftest import run_app
    from training_process import TrainingProcess

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
