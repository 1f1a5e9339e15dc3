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
