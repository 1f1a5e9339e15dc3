"""Checks that need a real NVIDIA GPU (skipped elsewhere; run them with the image's pytest).

On the development machines there is no GPU: the GPU decisions are covered there only by the
fake-hardware tests in tests/unit/test_precision.py.
"""
import pytest

pytestmark = pytest.mark.gpu


def test_detect_reports_the_gpu_with_compute_capability():
    from app.hardware import detect

    hw = detect()
    assert hw.gpus, "TensorFlow sees no GPU"
    gpu = hw.gpus[0]
    assert gpu.compute_capability is not None and gpu.compute_capability >= (3, 5)
    assert gpu.name


def test_auto_precision_matches_the_tensor_core_rule():
    from app.hardware import detect
    from app.precision import choose_policy

    hw = detect()
    expected = "mixed_float16" if all(g.tensor_cores for g in hw.gpus) else "float32"
    assert choose_policy(hw).policy == expected


def test_mixed_float16_trains_on_the_gpu(tmp_path):
    from app.config import TrainConfig
    from app.training import train

    for loop in ("fit", "custom"):
        m = train(TrainConfig(model="mlp", dataset="synthetic", precision="mixed_float16",
                              loop=loop, epochs=2, batch_size=128, max_train_samples=4096,
                              max_val_samples=512, workspace=str(tmp_path),
                              output=str(tmp_path / loop), verbose="lines", save_model=False))
        assert m["status"] == "completed"
        assert m["epochs"][-1]["val_accuracy"] >= 0.9
        assert m["peak_memory"]["kind"] == "gpu" and m["peak_memory"]["bytes"] > 0
