"""Why no GPU, each cause made real in a container of the image (no GPU on these machines).

Two containers: one started like a CPU job (no device nodes, CUDA_VISIBLE_DEVICES=-1), one
given GPU device nodes made with mknod on the host (`--device`, major 195 like the NVIDIA
driver's) and stub libcuda.so.1 builds (tests/unit/machine/stub_libcuda.c) that report an old
driver, an Ampere GPU on a CUDA 11.0 driver, a Pascal GPU, a healthy T4.  The stand-in base's
TensorFlow is tensorflow-cpu, so tensorflow_without_cuda is in every list.  A real visible GPU
(empty list) is checked by tests/gpu/test_gpu_problems_gpu.py on a GPU box.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from image_helpers import REPO, docker_run

pytestmark = pytest.mark.docker

STUB_SOURCE = REPO / "tests/unit/machine/stub_libcuda.c"

# name -> the stub's -D values
STUBS = {
    "cuda10": {"CUDA_VERSION": 10010},
    "ampere_on_11_0": {"CUDA_VERSION": 11000, "DEVICES": 1, "CC_MAJOR": 8, "CC_MINOR": 6,
                       "NAME": '"NVIDIA GeForce RTX 3090"'},
    "pascal": {"CUDA_VERSION": 11020, "DEVICES": 1, "CC_MAJOR": 6, "CC_MINOR": 0,
               "NAME": '"Tesla P100-PCIE-16GB"'},
    "t4": {"CUDA_VERSION": 11020, "DEVICES": 1, "CC_MAJOR": 7, "CC_MINOR": 5,
           "NAME": '"Tesla T4"'},
}

# Runs inside the container as the image's user: one `python -m app.machine.gpu_problems --json`
# per scenario (no TensorFlow import: quick), LD_LIBRARY_PATH choosing the stub.
SCENARIOS = r"""
import json, os, subprocess, sys
results = {}
for name in ["none"] + sorted(os.listdir("/opt/stubs")):
    env = dict(os.environ)
    if name != "none":
        env["LD_LIBRARY_PATH"] = "/opt/stubs/" + name
    out = subprocess.run([sys.executable, "-m", "app.machine.gpu_problems", "--json"], env=env,
                         capture_output=True, text=True, check=True).stdout
    results[name] = json.loads(out)["gpu_problems"]
print(json.dumps(results))
"""


def _ids(problems) -> list:
    return [p["id"] for p in problems]


def _lines(problems) -> dict:
    return {p["id"]: p["line"] for p in problems}


def test_a_container_without_gpus_and_with_cuda_visible_devices_minus_one(image):
    proc = docker_run(image, "-e", "CUDA_VISIBLE_DEVICES=-1", "-e", "TF_CPP_MIN_LOG_LEVEL=3",
                      command=["python", "-m", "app", "env", "--json"], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["tensorflow"] == "2.9.3"  # beside today's report
    problems = report["gpu_problems"]
    assert _ids(problems) == ["no_gpu_devices", "hidden_by_cuda_visible_devices",
                              "tensorflow_without_cuda"]
    lines = _lines(problems)
    assert lines["hidden_by_cuda_visible_devices"] == "CUDA_VISIBLE_DEVICES=-1 hides every GPU"
    assert "tensorflow-cpu 2.9.3" in lines["tensorflow_without_cuda"]
    assert all(p["fix"] for p in problems)
    # The start-up banner says the same, one WARN line per problem and per fix.
    for pid in _ids(problems):
        assert f"WARN  GPU problem [{pid}]: " in proc.stderr, proc.stderr[-3000:]
        assert f"WARN    fix [{pid}]: " in proc.stderr
    assert "No GPU is visible" not in proc.stderr
    # Nothing mounted on /workspace: a batch job's runs would go with the container.
    assert ("WARN  /workspace is not a mounted folder or volume: what is saved there (runs, "
            "models, notebooks) goes with this container; mount one: docker run -v "
            '"$PWD":/workspace ...') in proc.stderr, proc.stderr[-3000:]


def _build_stubs(root) -> None:
    if shutil.which("gcc") is None:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail("gcc is missing: .ci/run installs it for the stub libcuda.so.1")
        pytest.skip("gcc is not installed (needed to build the stub libcuda.so.1)")
    for name, defines in STUBS.items():
        folder = root / name
        folder.mkdir(parents=True)
        flags = [f"-DSTUB_{k}={v}" for k, v in defines.items()]
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(folder / "libcuda.so.1"),
                        str(STUB_SOURCE), *flags], check=True, capture_output=True, timeout=60)
        folder.chmod(0o755)
    root.chmod(0o755)


def test_device_nodes_and_stub_drivers(image, tmp_path):
    tmp_path.chmod(0o755)
    stubs = tmp_path / "stubs"
    _build_stubs(stubs)
    nodes = tmp_path / "dev"
    nodes.mkdir()
    # What `--gpus` would give: /dev/nvidia0 and /dev/nvidiactl (the NVIDIA driver's major
    # 195); without a driver on this host, opening them fails, which is not asked here.
    os.mknod(nodes / "nvidia0", 0o600 | 0o020000, os.makedev(195, 0))
    os.mknod(nodes / "nvidiactl", 0o600 | 0o020000, os.makedev(195, 255))
    script = tmp_path / "scenarios.py"
    script.write_text(SCENARIOS)
    script.chmod(0o644)
    proc = docker_run(image, "--device", f"{nodes / 'nvidia0'}:/dev/nvidia0",
                      "--device", f"{nodes / 'nvidiactl'}:/dev/nvidiactl",
                      "-v", f"{stubs}:/opt/stubs:ro", "-v", f"{script}:/opt/scenarios.py:ro",
                      command=["python", "/opt/scenarios.py"], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)

    # Device nodes but no driver library: the NVIDIA runtime did not inject the driver.
    assert _ids(results["none"]) == ["no_driver_libraries", "tensorflow_without_cuda"]
    assert "libcuda.so.1" in _lines(results["none"])["no_driver_libraries"]
    assert "WARN  GPU problem [no_driver_libraries]: " in proc.stderr, proc.stderr[-3000:]

    # A CUDA 10.1 driver: minor-version compatibility never crosses a major version.
    assert _ids(results["cuda10"]) == ["driver_too_old", "tensorflow_without_cuda"]
    assert "supports CUDA 10.1" in _lines(results["cuda10"])["driver_too_old"]

    # Ampere on a CUDA 11.0 driver: TensorFlow 2.9's kernels there are CUDA 11.2 PTX.
    assert _ids(results["ampere_on_11_0"]) == ["driver_too_old", "tensorflow_without_cuda"]
    line = _lines(results["ampere_on_11_0"])["driver_too_old"]
    assert "PTX" in line and "RTX 3090 (8.6)" in line

    # A Pascal GPU on a good driver: no Tensor Cores, and what auto picks instead.
    assert _ids(results["pascal"]) == ["tensorflow_without_cuda", "no_tensor_cores"]
    assert "picks float32" in _lines(results["pascal"])["no_tensor_cores"]

    # A T4 on a CUDA 11.2 driver: the driver side is fine; only the CPU TensorFlow remains.
    assert _ids(results["t4"]) == ["tensorflow_without_cuda"]
