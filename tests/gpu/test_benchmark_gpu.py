"""On a GPU with Tensor Cores, mixed_float16 must pay: the issue's acceptance figures.

Runs only where TensorFlow sees a GPU (``gpu`` marker; skipped on the CPU-only development
and CI machines, so these assertions have NOT been run there).  The image's self-test runs it
on a user's GPU box:

    python -m app benchmark --model resnet --dataset synthetic --policies float32,mixed_float16

Thresholds: at least 1.5x the float32 speed, at most 0.7x its peak GPU memory (TensorFlow's
allocator peak, each policy in a fresh process), final validation accuracy within one point.
Synthetic CIFAR-sized data keeps the test offline; the residual CNN is the model whose channel
counts are multiples of 8, so cuDNN can use Tensor Cores.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.paths import ROOT


@pytest.mark.gpu
@pytest.mark.slow
def test_mixed_float16_pays_on_the_residual_cnn(tmp_path, tensor_core_gpu):
    if not tensor_core_gpu:
        pytest.skip("the GPU has no Tensor Cores: mixed_float16 is not expected to be faster "
                    "(the benchmark says so in its diagnoses)")
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "app", "benchmark", "--model", "resnet", "--dataset", "synthetic",
           "--policies", "float32,mixed_float16", "--max-train-samples", "20000",
           "--max-val-samples", "2000", "--batch-size", "256", "--epochs", "4",
           "--repeats", "2", "--output", str(out), "--workspace", str(tmp_path / "ws")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "benchmark.json").read_text())
    fp32, fp16 = doc["results"]["float32"], doc["results"]["mixed_float16"]
    table = proc.stdout

    assert fp16["peak_memory"]["kind"] == "gpu" == fp32["peak_memory"]["kind"]
    speedup = fp16["speedup_vs_float32"]["median"]
    assert speedup >= 1.5, f"mixed_float16 only {speedup:.2f}x float32\n{table}"
    mem = fp16["memory_ratio_vs_float32"]
    assert mem <= 0.7, f"mixed_float16 uses {mem:.2f}x the float32 peak memory\n{table}"
    gap = fp16["accuracy_gap_points"]
    assert abs(gap) <= 1.0, f"accuracy gap {gap:+.2f} points\n{table}"
    assert not fp16["nonfinite_loss"]
