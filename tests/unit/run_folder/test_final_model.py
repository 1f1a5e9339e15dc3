"""The final model: saved in the running Keras' own format, under a temporary name, and
without Keras 2's misleading notice for a model that was never compiled."""
from __future__ import annotations

import logging
import os

import pytest

tf = pytest.importorskip("tensorflow")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_an_uncompiled_model_saves_without_a_compile_notice_and_loads_back(tmp_path):
    from app.run_folder.checkpoints import save_final_model

    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(3)])
    seen = _Records()
    tf.get_logger().addHandler(seen)
    try:
        path = save_final_model(model, str(tmp_path))
    finally:
        tf.get_logger().removeHandler(seen)
    # Keras 2 said "Compiled the loaded model, but the compiled metrics have yet to be built"
    # for the custom loop's model, which nothing compiled or loaded.
    assert not [m for m in seen.messages if "compiled metrics" in m], seen.messages
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]   # no temporary left
    x = tf.ones((2, 4))
    again = tf.keras.models.load_model(path, compile=False)
    assert again(x).numpy() == pytest.approx(model(x).numpy())
    # The filter is gone with the save: other warnings of TensorFlow's logger still reach it.
    assert not [f for f in tf.get_logger().filters if type(f).__name__ == "_UncompiledNotice"]


class _Sub(tf.keras.Model):
    """A subclassed model whose __init__ takes an argument, without get_config()."""

    def __init__(self, n):
        super().__init__()
        self.hidden = tf.keras.layers.Dense(8, activation="relu")
        self.out = tf.keras.layers.Dense(n)

    def call(self, x):
        return self.out(self.hidden(x))


def test_a_subclassed_model_without_get_config_keeps_its_weights(tmp_path, capsys):
    """Keras 3 trained every epoch, then died in the final save with "Object Sub was created
    by passing non-serializable argument values in __init__()" (a QA pass): no model, exit 1.
    Its weights are saved instead, with one line naming get_config(); Keras 2 saves a
    SavedModel as ever.  The run's own weights from an earlier save are replaced, as
    model.keras is (a folder holding that name before a run is refused: resuming._RUN_NAMES)."""
    from app.precision.keras_version import IS_KERAS3
    from app.run_folder.checkpoints import save_final_model

    model = _Sub(3)
    x = tf.ones((2, 4))
    expected = model(x).numpy()
    (tmp_path / "model.weights.h5").write_text("an earlier save of this run")
    path = save_final_model(model, str(tmp_path))
    if not IS_KERAS3:
        assert os.path.basename(path) == "model" and os.path.isdir(path)
        return
    assert os.path.basename(path) == "model.weights.h5"
    assert sorted(os.listdir(tmp_path)) == ["model.weights.h5"]
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "note: model '_Sub' cannot be saved whole as model.keras: its __init__ takes arguments "
        "and it has no get_config(), so its weights are saved in model.weights.h5 (build the "
        "model, then model.load_weights(...)); give the class a get_config() that returns those "
        "arguments for a full model.keras"]
    again = _Sub(3)
    again(x)
    again.load_weights(path)
    assert again(x).numpy() == pytest.approx(expected)
