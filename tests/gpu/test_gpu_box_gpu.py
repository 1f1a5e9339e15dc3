"""A GPU box's first day (issue 27): XLA compiles on the GPU, the benchmark's float32 both
ways, a profile with GPU kernels, two processes sharing the GPU, the GPU view.

Runs only where TensorFlow sees a GPU (``gpu`` marker): skipped on the CPU-only development
and CI machines, so these assertions have NOT been run there.  The image's ``self-test`` runs
them on a user's GPU box.  Tiny models and few steps: seconds each on any current GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

from tests.paths import ROOT
from tests.unit.helpers import run_app

TINY = ("--model", "mlp", "--dataset", "synthetic", "--epochs", "1", "--batch-size", "64",
        "--max-train-samples", "2048", "--max-val-samples", "256", "--no-save-model",
        "--progress", "lines")


def _metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.gpu
def test_jit_trains_on_the_gpu(tmp_path):
    env = json.loads(run_app("env", "--json", timeout=300).stdout)
    assert env["xla_gpu"]["can_compile"], env["xla_gpu"]
    out = tmp_path / "jit"
    proc = run_app("train", *TINY, "--precision", "mixed_float16", "--jit", "--output", str(out),
                   timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "libdevice not found" not in proc.stderr
    m = _metrics(out)
    assert m["status"] == "completed" and m["config"]["jit"] is True


@pytest.mark.gpu
@pytest.mark.slow
def test_benchmark_measures_float32_both_ways(tmp_path):
    out = tmp_path / "bench"
    proc = run_app("benchmark", *TINY[:-3], "--epochs", "2", "--repeats", "1",
                   "--policies", "float32,mixed_float16", "--fp32-baseline", "both",
                   "--output", str(out), "--workspace", str(tmp_path / "ws"), timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "benchmark.json").read_text())
    fp = doc["fp32_baseline"]
    assert fp["explanation"] and fp["explanation"] in proc.stdout
    if fp["tf32_applies"]:
        assert fp["strict_float32"]["runs_ok"] == 1, fp
        assert doc["tf32_by_run"]["float32#1"] is True
        assert doc["tf32_by_run"]["float32#1-strict"] is False
        assert "Strict float32 (TF32 off)" in proc.stdout
    else:
        assert fp["strict_float32"] is None and "no TF32 Tensor Cores" in fp["explanation"]
        assert set(doc["tf32_by_run"].values()) == {False}


@pytest.mark.gpu
def test_profile_has_gpu_kernels_or_says_why_not(tmp_path):
    from app.machine import profiler_rights

    out = tmp_path / "prof"
    proc = run_app("train", *TINY, "--precision", "float32", "--profile-steps", "3-5",
                   "--output", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (trace,) = (out / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb")
    refusal = profiler_rights.check(has_gpu=True)
    if refusal:
        assert refusal in proc.stderr
        pytest.skip(f"CUPTI may not profile here: {refusal}")
    data = trace.read_bytes()
    assert b"/device:GPU:0" in data, "no GPU plane in the trace (CUPTI did not record kernels)"


_HOLDER = """
import os, sys, time
import tensorflow as tf
x = tf.random.normal([1024, 1024])
y = tf.matmul(x, x)
_ = y.numpy()
print("READY", flush=True)
time.sleep(float(sys.argv[1]))
"""


@pytest.mark.gpu
def test_two_processes_share_the_gpu_under_the_defaults(tmp_path):
    """A kernel-like process that touched the GPU holds little of it (memory growth), so a
    training run beside it gets the rest; NVML names the first process."""
    from app.machine import nvml

    env = dict(os.environ)
    # The image's default (Dockerfile ENV); a bare host gets the same for this test.
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, "120"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while holder.stdout.readline().strip() != "READY":
            assert holder.poll() is None and time.monotonic() < deadline, holder.stderr.read()
        reading = nvml.read()
        gpu = reading.gpus[nvml.visible_index(os.environ)]
        held = [p for p in gpu.processes if p.pid == holder.pid]
        if held and held[0].used_bytes is not None:       # visible in this pid namespace
            assert held[0].used_bytes < 0.5 * gpu.memory_total, held
        assert gpu.memory_free > 0.4 * gpu.memory_total, gpu
        out = tmp_path / "beside"
        proc = run_app("train", *TINY, "--precision", "float32", "--output", str(out),
                       env={"TF_FORCE_GPU_ALLOW_GROWTH": env["TF_FORCE_GPU_ALLOW_GROWTH"]},
                       timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert holder.poll() is None, "the first process died while the second trained"
    finally:
        holder.kill()
        holder.wait(timeout=30)


@pytest.mark.gpu
def test_the_gpu_view_shows_the_gpu():
    from app.machine import nvml

    script = next(p for p in (ROOT / "docker/bin/tfmp-gpu-view",
                              Path("/usr/local/bin/tfmp-gpu-view")) if p.is_file())
    view = SourceFileLoader("tfmp_gpu_view", str(script)).load_module()
    reading = nvml.read()
    assert reading.gpus, reading.error
    page = view.page(reading)
    assert "no GPU" not in page and f"GPU 0: {reading.gpus[0].name}" in page
    assert "memory" in page and "temperature" in page and "power" in page
