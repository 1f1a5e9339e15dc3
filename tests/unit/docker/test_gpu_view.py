"""tfmp-gpu-view, the page behind JupyterLab's "GPU" tile, from a fake NVML reading: each
GPU's utilisation, memory, temperature, power and the processes holding memory; "no GPU"
and why without one; served on 127.0.0.1 (docker/bin/tfmp-gpu-view in the checkout)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

from app.machine import nvml
from tests.paths import ROOT
from tests.unit.machine.test_gpu_box import COMMANDS, KERNEL, FakeNVML

CANDIDATES = [ROOT / "docker/bin/tfmp-gpu-view", Path("/usr/local/bin/tfmp-gpu-view")]
SCRIPT = next((p for p in CANDIDATES if p.is_file()), None)
pytestmark = pytest.mark.skipif(SCRIPT is None, reason="tfmp-gpu-view is not here")


@pytest.fixture(scope="module")
def view():
    return SourceFileLoader("tfmp_gpu_view", str(SCRIPT)).load_module()


def test_the_page_shows_each_gpu_and_who_holds_its_memory(view):
    reading = nvml.read(FakeNVML(procs=[KERNEL, (77, 300 * 2**20)], used=15 * 2**30),
                        command=COMMANDS.get)
    page = view.page(reading)
    for text in ("GPU 0: Tesla T4", "87%", "64 °C", "62 W of 70 W", "driver 470.82.01",
                 "ipykernel_launcher", "14.00 GiB", "(not in this container)", "300 MiB"):
        assert text in page, text
    assert page.index("ipykernel_launcher") < page.index("(not in this container)")
    assert "no GPU" not in page and "fetch('fragment')" in page


def test_without_a_gpu_the_page_says_so_and_why(view):
    page = view.page(nvml.Reading(error=nvml.NO_DRIVER))
    assert "no GPU: no NVIDIA driver library (libnvidia-ml.so.1)" in page
    assert "--gpus all" in page


def test_markup_in_names_is_escaped(view):
    fake = FakeNVML(procs=[(5, 2**30)], used=2**30)
    page = view.fragment(nvml.read(fake, command=lambda pid: "<script>x</script>"))
    assert "<script>x" not in page and "&lt;script&gt;" in page


def test_it_serves_the_page_api_and_fragment_on_loopback(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--port", str(port)],
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}/"
        for _ in range(100):
            try:
                page = urllib.request.urlopen(base, timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail(proc.stderr.read().decode())
        assert "no GPU:" in page                  # the host has no GPU (or no NVML)
        api = json.loads(urllib.request.urlopen(base + "api", timeout=5).read())
        assert api["gpus"] == [] and api["error"]
        assert "no GPU:" in urllib.request.urlopen(base + "fragment", timeout=5).read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    bad = subprocess.run([sys.executable, str(SCRIPT), "--port", "0"], capture_output=True,
                         text=True, env={"PYTHONPATH": str(ROOT)}, timeout=30)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: port 0")
