"""What the CLI promises about a run's outcome and its flags, checked on real runs: exit 3
when training diverges, 143/130 after SIGTERM/SIGINT (and ``--resume`` finishes), and ``--jit`` / ``--steps-per-execution`` on the
model Keras really trains (not only in ``--help``)."""
import json
import signal

import pytest

from tests.unit.helpers import ONCE_IN_THE_IMAGE, error_lines, run_app

# The image's self-test leaves this to a real container: tests/image/test_interrupt_image.py
# stops a training container (SIGTERM, SIGINT) on TF 2.9 and resumes it in a new one.
IN_CONTAINERS = "signals to a training container are tested on TF 2.9 by test_interrupt_image.py"
# Each signal's twin there: a session that runs one of them skips only that signal here.
STOPPED_IN_A_CONTAINER = {
    "SIGTERM": "tests/image/test_interrupt_image.py::"
               "test_docker_stop_saves_a_checkpoint_and_a_new_container_resumes",
    "SIGINT": "tests/image/test_interrupt_image.py::test_sigint_to_a_training_container_exits_130",
}

SMALL = ["--dataset", "synthetic", "--max-train-samples", "256", "--max-val-samples", "64",
         "--batch-size", "32", "--precision", "float32", "--progress", "lines", "--offline",
         "--no-save-model"]


@ONCE_IN_THE_IMAGE
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_diverging_run_exits_3_with_its_diagnosis(tmp_path, loop):
    """float32 has no loss scaling to recover with: a learning rate of 1e30 makes the weights
    and the loss non-finite within the first steps."""
    out = tmp_path / "run"
    proc = run_app("train", *SMALL, "--loop", loop, "--epochs", "2", "--learning-rate", "1e30",
                   "--output", str(out))
    assert proc.returncode == 3, proc.stdout[-1000:] + proc.stderr[-2000:]
    errors = error_lines(proc.stderr)
    assert len(errors) == 1 and errors[0].startswith("error: training diverged"), proc.stderr
    assert "non-finite" in errors[0] and "Traceback" not in proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "diverged" and metrics["epochs"] == []
    assert "done:" not in proc.stdout


@pytest.mark.slow
@pytest.mark.host_only(reason=IN_CONTAINERS)
@pytest.mark.parametrize("signum, code", [
    pytest.param(signum, code, id=name, marks=pytest.mark.in_containers(
        reason=IN_CONTAINERS, twins=(STOPPED_IN_A_CONTAINER[name],)))
    for name, signum, code in [("SIGTERM", signal.SIGTERM, 143), ("SIGINT", signal.SIGINT, 130)]])
def test_a_signal_stops_with_its_code_and_a_checkpoint_and_resume_finishes(tmp_path, signum,
                                                                          code):
    """``docker stop`` (SIGTERM) and Ctrl-C (SIGINT) inside epoch 2: exit 128+N, a checkpoint,
    no traceback, and ``--resume`` finishes the run."""
    from tests.unit.training_process import TrainingProcess

    out = tmp_path / "run"
    args = ["train", "--dataset", "synthetic", "--max-train-samples", "20000",
            "--max-val-samples", "128", "--batch-size", "32", "--precision", "float32",
            "--epochs", "2", "--offline", "--no-save-model", "--progress", "lines",
            "--log-every", "50", "--output", str(out)]
    with TrainingProcess(args) as run:
        run.wait_inside_epoch(2)        # the premise: epoch 1 is done, epoch 2 has begun
        run.send(signum)
        exit_code, _, err = run.finish()  # its timeout guards a hang; how fast: a benchmark
    assert exit_code == code, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "--resume" in err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "interrupted" and metrics.get("signal") == signum
    assert [e["epoch"] for e in metrics["epochs"]] == [1]   # stopped inside epoch 2
    assert list((out / "checkpoints").iterdir()), "no checkpoint saved"

    resumed = run_app(*args, "--resume", timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    final = json.loads((out / "metrics.json").read_text())
    assert final["status"] == "completed"
    assert [e["epoch"] for e in final["epochs"]] == [1, 2]


def _compiled_settings(model) -> tuple:
    """(jit_compile, steps_per_execution) of a compiled model, on either Keras.

    Keras 3: ``model.jit_compile`` (its "auto" resolved at compile time) and
    ``model.steps_per_execution`` (an int); Keras 2: ``model._jit_compile`` and
    ``model._steps_per_execution`` (a tf.Variable)."""
    jit = getattr(model, "jit_compile", None)
    if jit is None:
        jit = model._jit_compile
    steps = getattr(model, "steps_per_execution", None)
    if steps is None:
        steps = model._steps_per_execution
    return bool(jit), int(steps.numpy() if hasattr(steps, "numpy") else steps)


@pytest.fixture
def fit_spy(monkeypatch):
    """Records the compile settings of every model that Keras' fit runs, then lets it run."""
    import tensorflow as tf

    seen = []
    real_fit = tf.keras.Model.fit

    def fit(self, *args, **kwargs):
        seen.append(_compiled_settings(self))
        return real_fit(self, *args, **kwargs)

    monkeypatch.setattr(tf.keras.Model, "fit", fit)
    return seen


def _keras_default_settings() -> tuple:
    """What Keras itself picks when compile() is given neither setting (on this machine)."""
    import tensorflow as tf

    inputs = tf.keras.Input((4,))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(inputs))
    model.compile(optimizer="adam", loss="mse")
    return _compiled_settings(model)


@pytest.mark.parametrize("flags, jit, steps", [
    ([], None, None),                                    # None: what Keras picks by itself
    (["--jit", "--steps-per-execution", "3"], True, 3),
], ids=["neither", "both"])
def test_jit_and_steps_per_execution_reach_the_compiled_model(tmp_path, fit_spy, flags, jit,
                                                              steps, capsys):
    import tensorflow as tf

    from app.cli import main

    default_jit, default_steps = _keras_default_settings()
    expected = (default_jit if jit is None else jit, default_steps if steps is None else steps)
    code = main(["train", *SMALL, "--epochs", "1", "--output", str(tmp_path / "run"), *flags])
    assert code == 0
    assert fit_spy == [expected]
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["status"] == "completed"
    # On a CPU, --jit is said once to be often slower; without it, nothing is said.
    cpu_only = not tf.config.list_physical_devices("GPU")
    said = "note: --jit without a GPU" in capsys.readouterr().err
    assert said == (bool(jit) and cpu_only)
