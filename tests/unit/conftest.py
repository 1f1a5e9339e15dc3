"""Shared fixtures for the unit tests (host TF/Keras 3 and TF 2.9.3/Keras 2 alike).

Helpers that tests import (``run_app``, ``error_lines``) live in tests/unit/helpers.py and
tests/unit/training_process.py; the repository root in tests/paths.py."""
from __future__ import annotations

import gc
import sys

import pytest


@pytest.fixture(autouse=True)
def restore_policy_and_clear_keras():
    """Tests set the global dtype policy; put it back so no test leaks it into another, and
    clear Keras' session after each.
    TensorFlow is only touched when a test has already imported it."""
    tf = sys.modules.get("tensorflow")
    before = tf.keras.mixed_precision.global_policy().name if tf else None
    yield
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        policy = sys.modules.get("app.precision.policy")
        if policy is not None:
            # Through apply_policy: it also gives back the graph option mixed_float16 sets
            # on a CPU (Grappler's remapper off), which set_global_policy alone would leak.
            policy.apply_policy(before or "float32")
        else:
            tf.keras.mixed_precision.set_global_policy(before or "float32")
        # Keras' global state (its graph, layer-name counters, the models it still
        # references) grows with every model a process builds: the image's self-test, one
        # process for all the unit tests, ran test_sentinel_faults.py in 135 s against 66 s
        # on its own (TF 2.9, idle 2-core Xeon).  Each test starts from a clean Keras.
        _clear_keras(tf)
        _freeze_the_imports_once()


_frozen = []


def _freeze_the_imports_once():
    """After the first test that imported TensorFlow: a full collection, then ``gc.freeze()``,
    so that Python's collector no longer walks TensorFlow's and Keras' modules (some 360,000
    objects that live as long as the process) each time it runs during a test."""
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen.append(True)


def _clear_keras(tf):
    """Keras' global state reset, without Keras 3's garbage collection: its clear_session
    runs ``gc.collect()`` unless told not to (``free_memory``), and in a test process that
    has built hundreds of models one collection took 1.4 s: 424 s of the host's unit tests
    were these teardowns (2-core AMD EPYC, TF 2.21).  Python's own collector still runs;
    Keras 2's clear_session has no such argument and collects nothing."""
    try:
        tf.keras.backend.clear_session(free_memory=False)
    except TypeError:   # Keras 2 (TF 2.9, the image)
        tf.keras.backend.clear_session()


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
