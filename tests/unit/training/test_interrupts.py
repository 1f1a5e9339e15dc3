"""Stopping a run with signals: the first SIGTERM/SIGINT saves a checkpoint after the
running step (tests/image/test_interrupt_image.py, test_user_models.py); from the command
line a second one ends the process at once, also when the step never ends; in Python (a
notebook's kernel) a second one does not end the process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.paths import ROOT, USER_MODELS
from tests.unit.helpers import ONCE_IN_THE_IMAGE, run_app, start_app

STUCK = os.path.join(str(USER_MODELS), "stuck.py") + ":build"
ARRAYS = os.path.join(str(USER_MODELS), "datasets.py") + ":arrays"

# Two signals sent to this very process, a moment apart, under app.training.interrupts.
_SELF_SIGNALLED = textwrap.dedent("""
    import os, signal, sys, time
    from app.training.interrupts import StopFlag, signal_handlers
    flag = StopFlag()
    with signal_handlers(flag, repeat_exits={repeat}):
        for _ in range(2):
            os.kill(os.getpid(), signal.{name})
            time.sleep(1.0)
    print("alive, stop flag", flag.signum)
""")


def _self_signalled(name: str, repeat: bool) -> subprocess.CompletedProcess:
    code = _SELF_SIGNALLED.format(repeat=repeat, name=name)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_second_signal_ends_the_process_when_asked_for(name):
    signum = getattr(signal, name)
    proc = _self_signalled(name, repeat=True)
    assert proc.returncode == 128 + signum, proc.stderr
    assert "alive" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [
        f"received signal {signum}: saving a checkpoint and stopping after this step "
        "(send it again to stop at once, without that checkpoint)",
        f"received signal {signum} again: stopping now, without saving; "
        "no checkpoint had been saved, so a rerun starts from the beginning"], proc.stderr


def test_in_python_a_second_signal_only_sets_the_flag_again():
    proc = _self_signalled("SIGINT", repeat=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "alive, stop flag 2"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["received signal 2: saving a checkpoint and stopping after this step"]


def _wait_for(path, proc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the run ended (status {proc.returncode}) before its step "
                                 f"got stuck:\n{out[-2000:]}{err[-3000:]}")
        assert time.monotonic() < deadline, f"no stuck step within {timeout:.0f} s"
        time.sleep(0.2)


def _signalled(proc, mark, signum, times: int) -> str:
    """Once ``mark`` exists (the model's step has begun, or hangs), send ``signum`` once, or
    twice a few seconds apart (the process must outlive the first); its stderr."""
    try:
        _wait_for(mark, proc, timeout=240)
        proc.send_signal(signum)
        if times == 2:
            time.sleep(4)
            assert proc.poll() is None, "the first signal ended a process whose step had not ended"
            proc.send_signal(signum)
        return proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _metrics(out):
    return json.loads((out / "metrics.json").read_text())


@ONCE_IN_THE_IMAGE
@pytest.mark.parametrize("signum, stuck_at, left", [
    (signal.SIGINT, 3, "no checkpoint had been saved, so a rerun starts from the beginning"),
    (signal.SIGTERM, 25, "--resume continues from {out}/checkpoints/ckpt-1"),
], ids=["SIGINT-in-epoch-1", "SIGTERM-in-epoch-2"])
def test_a_stuck_step_is_ended_by_a_second_signal(tmp_path, signum, stuck_at, left):
    """`tfmp train` inside a step that never returns: the first signal is answered at once
    (the line says a second one ends the run) while the process goes on waiting for the
    step; the second ends it with 128 + the signal and says what is left: the checkpoint
    of epoch 1, which --resume continues from, or nothing, and a rerun starts over."""
    mark = tmp_path / "stuck"
    out = tmp_path / "run"
    args = ["train", "--model", STUCK, "--dataset", ARRAYS, "--precision", "float32",
            "--epochs", "2", "--batch-size", "32", "--offline", "--no-save-model",
            "--progress", "lines", "--output", str(out)]
    # 512 training samples: 16 steps and 4 validation batches an epoch; batch 25 is epoch 2's 5th.
    proc = start_app(*args, env={"STUCK_MARK": str(mark), "STUCK_ROWS": "32",
                                 "STUCK_AT": str(stuck_at)})
    err = _signalled(proc, mark, signum, times=2)
    assert proc.returncode == 128 + signum, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("received signal")]
    assert lines == [
        f"received signal {signum}: saving a checkpoint and stopping after this step "
        "(send it again to stop at once, without that checkpoint)",
        f"received signal {signum} again: stopping now, without saving; "
        + left.format(out=out)], err[-3000:]
    assert "Traceback" not in err
    # metrics.json, once written (epoch 1's), no longer says "running", a live run's status.
    assert (_metrics(out).get("stopped_at_once") if (out / "metrics.json").exists() else None) \
        == ({"resume_from": f"{out}/checkpoints/ckpt-1"} if signum == signal.SIGTERM else None)
    # What the line says is so, and the lock went with the process.
    again = run_app(*args, *(["--resume"] if signum == signal.SIGTERM else []), timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [e["epoch"] for e in _metrics(out)["epochs"]] == [1, 2]
    resumed = [line for line in again.stdout.splitlines() if line.startswith("epoch ")]
    assert resumed[0].startswith("epoch 2/2:" if signum == signal.SIGTERM else "epoch 1/2:")


def _check_args(steps: int) -> list:
    return ["check", "--model", STUCK, "--dataset", ARRAYS, "--precision", "float32",
            "--batch-size", "32", "--steps", str(steps)]


@ONCE_IN_THE_IMAGE
def test_ctrl_c_in_check_is_one_line_not_a_traceback(tmp_path):
    """Any command, not only train: Ctrl-C answered between two steps ends it with 130 and
    one line."""
    mark = tmp_path / "stepping"
    # STUCK_HANG=0: the model marks its 3rd batch and trains on.
    proc = start_app(*_check_args(100000), env={"STUCK_MARK": str(mark), "STUCK_ROWS": "32",
                                                "STUCK_AT": "3", "STUCK_HANG": "0"})
    err = _signalled(proc, mark, signal.SIGINT, times=1)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert err.rstrip().splitlines()[-1] == "interrupted (Ctrl-C): tfmp check stopped"


@ONCE_IN_THE_IMAGE
def test_a_stuck_check_step_is_ended_by_a_second_ctrl_c(tmp_path):
    """`tfmp check --steps` on a model whose step never returns: Python cannot raise the
    first Ctrl-C's KeyboardInterrupt there, so after a moment the process says how to stop
    it, and the second Ctrl-C ends it at once."""
    mark = tmp_path / "stuck"
    proc = start_app(*_check_args(50), env={"STUCK_MARK": str(mark), "STUCK_ROWS": "32",
                                            "STUCK_AT": "5"})
    err = _signalled(proc, mark, signal.SIGINT, times=2)
    assert proc.returncode == 130, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("received signal")]
    assert lines == ["received signal 2: stopping (send it again to stop at once)",
                     "received signal 2 again: stopping now"], err[-3000:]
    assert "Traceback" not in err


SMALL_RUN = dict(model="mlp", precision="float32", epochs=2, batch_size=32,
                 max_train_samples=512, max_val_samples=128, log_every=4, progress="lines",
                 offline=True, save_model=False)


def _interrupt_at_step_4(row):
    """A notebook's Interrupt (SIGINT to the kernel), or Ctrl-C, inside epoch 1."""
    if row["step"] == 4:
        os.kill(os.getpid(), signal.SIGINT)


def _interrupted_line(stderr: str) -> str:
    [line] = [ln for ln in stderr.splitlines() if ln.startswith("interrupted: checkpoint")]
    return line


@pytest.mark.parametrize("output_given", [True, False], ids=["output", "default folder"])
def test_app_train_interrupted_says_resume_true_not_the_flag(tmp_path, capsys, output_given):
    """From Python the advice was "run the same command with --resume" (a QA pass): the
    API's form is resume=True in the same call, with the output when the run chose it."""
    import app

    settings = dict(SMALL_RUN, workspace=str(tmp_path / "ws"))
    if output_given:
        settings["output"] = str(tmp_path / "run")
    metrics = app.train(data="synthetic", on_step=_interrupt_at_step_4, **settings)
    assert metrics["status"] == "interrupted"
    line = _interrupted_line(capsys.readouterr().err)
    folder = "" if output_given else f", output={metrics['config']['output']!r}"
    assert line.split("; ", 1)[1] == ("call app.train again with the same arguments and "
                                      f"resume=True{folder} to finish"), line
    if not output_given:   # the advice works: the same call with it finishes the run
        settings.update(output=metrics["config"]["output"], resume=True)
        assert app.train(data="synthetic", **settings)["status"] == "completed"


@pytest.mark.parametrize("output_given", [True, False], ids=["output", "default folder"])
def test_tfmp_train_interrupted_says_the_flag(tmp_path, capsys, output_given):
    """``tfmp train``'s own call into training (app/commands/train.py), signalled inside
    epoch 1: the advice is the flag, and the folder when the run named it itself."""
    from app.training.config import resolve_config
    from app.training.job import train

    flags = dict(SMALL_RUN, dataset="synthetic", workspace=str(tmp_path / "ws"))
    if output_given:
        flags["output"] = str(tmp_path / "run")
    metrics = train(resolve_config(flags, {}), on_step=_interrupt_at_step_4,
                    repeat_signal_exits=True)
    assert metrics["status"] == "interrupted"
    line = _interrupted_line(capsys.readouterr().err)
    folder = "" if output_given else f" --output {metrics['config']['output']}"
    assert line.split("; ", 1)[1] == f"run the same command with --resume{folder} to finish", line
