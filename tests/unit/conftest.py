"""Shared fixtures for the unit tests (host TF/Keras 3 and TF 2.9.3/Keras 2 alike)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def restore_global_policy():
    """Tests set the global dtype policy; put it back so no test leaks it into another.
    TensorFlow is only touched when a test has already imported it."""
    tf = sys.modules.get("tensorflow")
    before = tf.keras.mixed_precision.global_policy().name if tf else None
    yield
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        tf.keras.mixed_precision.set_global_policy(before or "float32")


def run_app(*args, env=None, timeout=180, cwd=None):
    """Run ``python -m app ...`` in a subprocess, as a user would."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for k in list(full_env):
        if k.startswith("TFMP_"):
            del full_env[k]
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd or ROOT)


def error_lines(stderr: str):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.fixture
def tiny_config(tmp_path):
    """A TrainConfig for quick real runs on learnable synthetic data."""
    from app.training.config import TrainConfig

    def make(**kw):
        base = dict(model="mlp", dataset="synthetic", precision="float32", loop="fit", epochs=2,
                    batch_size=32, max_train_samples=512, max_val_samples=128, log_every=4,
                    workspace=str(tmp_path / "ws"), output=str(tmp_path / "run"),
                    progress="lines", offline=True, save_model=False, seed=0)
        base.update(kw)
        return TrainConfig(**base)
    return make
