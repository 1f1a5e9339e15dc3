"""A user's own ``app.py`` or ``app/`` in the current folder (a very common name) must not
replace this package: not for the ``tfmp`` console script, and not for the child processes
the benchmark starts.  Their ``MODULE:FUNCTION`` specs still import from that folder."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.paths import ROOT
from tests.unit.helpers import ONCE_IN_THE_IMAGE

HOSTILE = "import sys\nprint('HIJACKED')\nsys.exit(42)\n"
USER_MODEL = """\
import tensorflow as tf


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Dense(32, activation="relu")(inputs)
    outputs = tf.keras.layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs)
"""


def _hostile_folder(tmp_path, kind: str):
    folder = tmp_path / "project"
    folder.mkdir()
    if kind == "app.py":
        (folder / "app.py").write_text(HOSTILE)
    else:
        (folder / "app").mkdir()
        (folder / "app" / "__init__.py").write_text(HOSTILE)
        (folder / "app" / "__main__.py").write_text(HOSTILE)
    (folder / "mymodel.py").write_text(USER_MODEL)
    return folder


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFMP_")}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def test_the_hostile_folder_does_hijack_python_dash_m(tmp_path):
    """The premise: ``python -m app`` there runs the user's file (why ``tfmp`` exists)."""
    folder = _hostile_folder(tmp_path, "app.py")
    proc = subprocess.run([sys.executable, "-m", "app", "--help"], cwd=folder, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 42 and "HIJACKED" in proc.stdout


@ONCE_IN_THE_IMAGE
@pytest.mark.parametrize("kind", ["app.py", "app/"])
def test_tfmp_script_trains_with_our_package_and_the_users_spec(tmp_path, kind):
    tfmp = shutil.which("tfmp")
    if tfmp is None:
        pytest.skip("no tfmp console script on PATH (pip install -e . installs it)")
    folder = _hostile_folder(tmp_path, kind)
    proc = subprocess.run(
        [tfmp, "train", "--model", "mymodel:build", "--dataset", "synthetic",
         "--input-shape", "784", "--epochs", "1", "--batch-size", "32",
         "--max-train-samples", "64", "--max-val-samples", "32", "--precision", "float32",
         "--offline", "--no-save-model", "--progress", "lines", "--output", "run"],
        cwd=folder, env=_env(), capture_output=True, text=True, timeout=300)
    assert "HIJACKED" not in proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1].startswith("done: 1 epoch(s), val_accuracy=")
    metrics = json.loads((folder / "run" / "metrics.json").read_text())
    assert metrics["task"]["model"] == "mymodel:build"


@ONCE_IN_THE_IMAGE
def test_benchmark_children_run_our_package_from_a_hostile_folder(tmp_path, monkeypatch):
    from app.benchmark import runner

    folder = _hostile_folder(tmp_path, "app.py")
    monkeypatch.chdir(folder)
    for key in [k for k in os.environ if k.startswith("TFMP_")]:
        monkeypatch.delenv(key)
    assert "error" not in runner.collect_environment(timeout=120)
    settings = {"model": "mymodel:build", "dataset": "synthetic", "input_shape": "784",
                "epochs": 2, "batch_size": 32, "max_train_samples": 64, "max_val_samples": 32,
                "offline": True}
    records = runner.run_schedule([{"policy": "float32", "repeat": 1, "order": 0}], settings,
                                  str(folder / "runs"), warmup_epochs=1, timeout=300,
                                  progress=lambda line: None)
    log = open(records[0]["log"]).read()
    assert "HIJACKED" not in log
    assert records[0]["ok"], records[0]["error"] + "\n" + log[-3000:]
    rate = runner.measure_input_rate(settings, 1, str(folder), timeout=300,
                                     progress=lambda line: None)
    assert rate.get("error") is None and rate["samples_per_second"] > 0, rate
