"""What the diagnoses need to know about the built-in models without building them.

Hidden layer widths (Dense units, Conv filters) of ``app.models``; the class-count output
layer is left out on purpose (its width is the task's, and Keras pads it).  Keep in step
with ``app/models.py``; ``tests/unit/test_benchmark_diagnose.py`` checks it against the real
models when TensorFlow is importable.
"""
from __future__ import annotations

from typing import List, Optional

HIDDEN_WIDTHS = {
    "mlp": [512, 256],
    "cnn": [32],
    "resnet": [32, 32, 32, 64, 64, 64, 128, 128, 128],
}


def layer_widths(model: str) -> Optional[List[int]]:
    return HIDDEN_WIDTHS.get(model)
