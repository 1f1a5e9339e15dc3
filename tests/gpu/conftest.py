"""Shared by the GPU tests: whether every visible GPU has Tensor Cores (the hardware rule of
``app.hardware``, itself checked against a table of real GPUs in test_gpu_precision.py)."""
from __future__ import annotations

import pytest


@pytest.fixture
def tensor_core_gpu() -> bool:
    from app import hardware

    hw = hardware.detect()
    return bool(hw.gpus) and all(g.tensor_cores for g in hw.gpus)
