"""Ctrl-C while TensorFlow's C++ runs Python code of the model's (``tf.py_function``): held
until the step returns, then raised where stopping is safe (app/core/signals.py).  Raised
inside that code, TF 2.9 aborted the process (py_func.cc: Check failed: ctx != nullptr)
and a newer TensorFlow reported it as an error of the user's code."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.paths import ROOT

# Each step's py_function sends this process SIGINT from inside itself.
_CTRL_C_IN_A_STEP = textwrap.dedent("""
    import os, signal
    import tensorflow as tf
    from app.core.signals import interrupt_point, interrupts_outside_tensorflow

    def ctrl_c(x):
        os.kill(os.getpid(), signal.SIGINT)
        return x + 1.0          # the callback's own work goes on: the signal is held

    done = []
    try:
        with interrupts_outside_tensorflow():
            for step in range(3):
                {poll}
                done.append(float(tf.py_function(ctrl_c, [tf.constant(1.0)], tf.float32)))
    except KeyboardInterrupt:
        print("KeyboardInterrupt after", done)
    print("handler restored", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
""")


def _run(poll: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _CTRL_C_IN_A_STEP.format(poll=poll)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2"))


def test_ctrl_c_inside_a_py_function_is_raised_between_steps():
    proc = _run("interrupt_point()")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The first step finished (its value came back), and the next step's start raised.
    assert proc.stdout.splitlines() == ["KeyboardInterrupt after [2.0]",
                                        "handler restored True"], proc.stderr[-3000:]


def test_a_held_ctrl_c_is_raised_at_the_blocks_end_not_lost():
    proc = _run("pass")
    # No interrupt_point in the loop: every step ran, and the block's end raised.
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["KeyboardInterrupt after [2.0, 2.0, 2.0]",
                                        "handler restored True"], proc.stderr[-3000:]


def test_outside_tensorflow_ctrl_c_is_raised_at_once():
    code = textwrap.dedent("""
        import os, signal, time
        from app.core.signals import interrupts_outside_tensorflow
        try:
            with interrupts_outside_tensorflow():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
                print("not raised")
        except KeyboardInterrupt:
            print("raised at once")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.strip() == "raised at once", proc.stderr[-2000:]
