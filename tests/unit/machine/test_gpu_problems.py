"""Why no GPU: every rule of app/machine/gpu_problems.py with fake probes, and the ctypes edge
against a stub libcuda.so.1 built here from tests/unit/machine/stub_libcuda.c (needs gcc).

The causes made real inside containers are in tests/image/test_gpu_problems_image.py;
a visible, usable GPU (empty list) and a pre-Volta GPU in tests/gpu.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from app.machine import gpu_probe as probe_mod
from app.machine import gpu_problems as gp
from app.machine.hardware import make_gpu

from tests.paths import ROOT
from tests.unit.helpers import ONCE_IN_THE_IMAGE

STUB_SOURCE = Path(__file__).with_name("stub_libcuda.c")

T4 = make_gpu("Tesla T4", (7, 5))
A100 = make_gpu("NVIDIA A100-SXM4-40GB", (8, 0))
P100 = make_gpu("Tesla P100-PCIE-16GB", (6, 0))
GTX1660 = make_gpu("NVIDIA GeForce GTX 1660 Ti", (7, 5))

# A GPU box where everything works: TensorFlow 2.9.3 (CUDA 11.2) sees a T4.
HEALTHY = probe_mod.GpuProbe(
    device_nodes=("nvidia0", "nvidiactl", "nvidia-uvm"), libcuda_error=None, cuinit_status=0,
    driver_cuda_version=11040, kernel_driver_version="470.82.01", gpus=(T4,),
    gpus_seen_by="tensorflow", env={"NVIDIA_VISIBLE_DEVICES": "all",
                                    "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
    built_with_cuda=True, tf_version="2.9.3", tf_cuda_version="11.2",
    tf_distributions=("tensorflow 2.9.3",), library_errors=None)


def ids(probe) -> list:
    return [p.id for p in gp.find_problems(probe)]


def test_a_healthy_gpu_box_has_no_problems():
    assert gp.find_problems(HEALTHY) == []


def test_no_device_nodes():
    probe = replace(HEALTHY, device_nodes=(), libcuda_error="libcuda.so.1: cannot open shared "
                    "object file: No such file or directory", cuinit_status=None,
                    driver_cuda_version=None, kernel_driver_version=None, gpus=())
    problems = gp.find_problems(probe)
    assert [p.id for p in problems] == ["no_gpu_devices"]
    assert "--gpus all" in problems[0].fix and "nvidia.com/gpu" in problems[0].fix


def test_nvidiactl_alone_is_not_a_gpu_but_wsl2s_dxg_is():
    no_tf_gpus = replace(HEALTHY, gpus=())
    assert "no_gpu_devices" in ids(replace(no_tf_gpus, device_nodes=("nvidiactl", "nvidia-uvm")))
    assert "no_gpu_devices" not in ids(replace(no_tf_gpus, device_nodes=("dxg",)))


def test_device_nodes_without_libcuda():
    probe = replace(HEALTHY, libcuda_error="libcuda.so.1: cannot open shared object file",
                    cuinit_status=None, driver_cuda_version=None, gpus=())
    problems = gp.find_problems(probe)
    assert [p.id for p in problems] == ["no_driver_libraries"]
    assert "cannot open shared object file" in problems[0].line
    assert "NVIDIA_DRIVER_CAPABILITIES" not in problems[0].fix


def test_driver_capabilities_without_compute_are_named_in_the_fix():
    probe = replace(HEALTHY, libcuda_error="not found", cuinit_status=None, gpus=(),
                    env={"NVIDIA_DRIVER_CAPABILITIES": "graphics,display"})
    (problem,) = gp.find_problems(probe)
    assert "NVIDIA_DRIVER_CAPABILITIES=graphics,display lacks compute,utility" in problem.fix


@pytest.mark.parametrize("status, words", [
    (803, "reboot the host"),
    (34, "stub"),
    (804, "cuda-compat"),
    (999, "dmesg"),
])
def test_cuinit_failures_are_named(status, words):
    problems = gp.find_problems(replace(HEALTHY, cuinit_status=status, gpus=()))
    assert problems[0].id == "no_driver_libraries"
    assert gp.cu_result_name(status) in problems[0].line
    assert words in problems[0].fix


def test_cuinit_no_device_with_nodes_present():
    problems = gp.find_problems(replace(HEALTHY, cuinit_status=100, gpus=()))
    assert problems[0].id == "no_gpu_devices" and "CUDA_ERROR_NO_DEVICE" in problems[0].line


@pytest.mark.parametrize("driver_cuda", [10010, 10020])
def test_a_cuda_10_driver_is_too_old_for_cuda_11(driver_cuda):
    (problem,) = gp.find_problems(replace(HEALTHY, driver_cuda_version=driver_cuda,
                                          kernel_driver_version=None, gpus=()))
    assert problem.id == "driver_too_old"
    assert f"CUDA {gp.cuda_version_text(driver_cuda)}" in problem.line
    assert "450.80.02" in problem.fix and "460.32.03" in problem.fix


def test_an_r450_driver_below_the_minor_version_minimum_is_too_old():
    # 450.51.06 shipped with CUDA 11.0 and reports 11000, but predates 450.80.02.
    (problem,) = gp.find_problems(replace(HEALTHY, driver_cuda_version=11000,
                                          kernel_driver_version="450.51.06"))
    assert problem.id == "driver_too_old" and "450.80.02" in problem.line


def test_minor_version_compatibility_runs_cuda_11_2_on_a_450_80_02_driver():
    # Volta/Turing: TensorFlow 2.9 ships sm_70/sm_75 machine code, nothing to JIT.
    probe = replace(HEALTHY, driver_cuda_version=11000, kernel_driver_version="450.80.02")
    assert gp.find_problems(probe) == []


def test_minor_version_compatibility_does_not_cover_ptx_for_ampere():
    probe = replace(HEALTHY, driver_cuda_version=11000, kernel_driver_version="450.80.02",
                    gpus=(A100,))
    (problem,) = gp.find_problems(probe)
    assert problem.id == "driver_too_old"
    assert "PTX" in problem.line and "A100" in problem.line
    # The same GPU on CUDA 11.2's own driver is fine.
    assert gp.find_problems(replace(probe, driver_cuda_version=11020,
                                    kernel_driver_version="460.32.03")) == []


def test_cuinit_insufficient_driver():
    (problem,) = gp.find_problems(replace(HEALTHY, cuinit_status=35, gpus=(),
                                          driver_cuda_version=None))
    assert problem.id == "driver_too_old"


def test_needs_ptx_jit():
    assert not gp.needs_ptx_jit((7, 5)) and not gp.needs_ptx_jit((6, 1))
    assert not gp.needs_ptx_jit((3, 7))
    assert gp.needs_ptx_jit((8, 0)) and gp.needs_ptx_jit((8, 6)) and gp.needs_ptx_jit((9, 0))
    assert gp.needs_ptx_jit((3, 0))  # below sm_35: no cubin (and TensorFlow rejects it)
    assert not gp.needs_ptx_jit(None)


@pytest.mark.parametrize("value, hides", [
    ("-1", True), ("", True), ("none", True), ("2", True), ("2,0", True),
    ("0", False), ("0,1", False), ("1,0", False), ("GPU-8f6e0a8b-0000", False), ("MIG-1234", False),
])
def test_cuda_visible_devices(value, hides):
    # Two GPUs given to the container: indices 0 and 1 exist.
    probe = replace(HEALTHY, device_nodes=("nvidia0", "nvidia1", "nvidiactl"),
                    env={"CUDA_VISIBLE_DEVICES": value}, gpus=() if hides else (T4,))
    assert ("hidden_by_cuda_visible_devices" in ids(probe)) is hides
    if hides:
        (problem,) = gp.find_problems(probe)
        assert problem.line == f"CUDA_VISIBLE_DEVICES={value} hides every GPU"


@pytest.mark.parametrize("value", ["void", "none", ""])
def test_nvidia_visible_devices_void_or_none(value):
    probe = replace(HEALTHY, device_nodes=(), libcuda_error="not found", cuinit_status=None,
                    gpus=(), env={"NVIDIA_VISIBLE_DEVICES": value})
    assert ids(probe) == ["no_gpu_devices", "hidden_by_cuda_visible_devices"]
    assert f"NVIDIA_VISIBLE_DEVICES={value}" in gp.find_problems(probe)[1].line


def test_visible_devices_without_a_device_count_still_catch_minus_one():
    assert gp.visible_devices_hide_all("-1", None, None) == "CUDA_VISIBLE_DEVICES=-1"
    assert gp.visible_devices_hide_all("3", None, None) is None
    assert gp.visible_devices_hide_all(None, "all", None) is None


def test_tensorflow_cpu_names_the_distribution_and_the_restore():
    probe = replace(HEALTHY, built_with_cuda=False, gpus=(),
                    tf_distributions=("tensorflow 2.9.3", "tensorflow-cpu 2.9.3"))
    (problem,) = gp.find_problems(probe)
    assert problem.id == "tensorflow_without_cuda"
    assert "tensorflow-cpu 2.9.3" in problem.line
    assert problem.fix.startswith("pip uninstall -y tensorflow-cpu && pip install "
                                  "--force-reinstall --no-deps tensorflow==2.9.3")


def test_unknown_tensorflow_is_not_a_problem():
    assert gp.find_problems(replace(HEALTHY, built_with_cuda=None)) == []


def test_cuda_libraries_that_fail_to_load_are_listed():
    probe = replace(HEALTHY, gpus=(), library_errors=(
        ("libcudnn.so.8", "libcudnn.so.8: cannot open shared object file"),))
    (problem,) = gp.find_problems(probe)
    assert problem.id == "cuda_libraries_failed"
    assert "libcudnn.so.8: libcudnn.so.8: cannot open shared object file" in problem.line


def test_tensorflow_without_gpus_although_the_libraries_load():
    (problem,) = gp.find_problems(replace(HEALTHY, gpus=(), library_errors=()))
    assert problem.id == "cuda_libraries_failed" and "TF_CPP_MIN_LOG_LEVEL=0" in problem.fix


def test_library_failures_need_a_working_driver_to_be_the_cause():
    probe = replace(HEALTHY, libcuda_error="not found", cuinit_status=None, gpus=(),
                    library_errors=(("libcudnn.so.8", "missing"),))
    assert ids(probe) == ["no_driver_libraries"]


@pytest.mark.parametrize("gpus", [(P100,), (GTX1660,), (P100, GTX1660)])
def test_no_tensor_cores_says_what_auto_picks(gpus):
    (problem,) = gp.find_problems(replace(HEALTHY, gpus=gpus))
    assert problem.id == "no_tensor_cores"
    assert "`--precision auto` picks float32" in problem.line
    assert gpus[0].name in problem.line


def test_one_tensor_core_gpu_is_not_no_tensor_cores():
    assert gp.find_problems(replace(HEALTHY, gpus=(T4, P100))) == []


def test_problems_come_most_fundamental_first():
    probe = replace(HEALTHY, device_nodes=(), libcuda_error="missing", cuinit_status=None,
                    driver_cuda_version=None, gpus=(), built_with_cuda=False,
                    env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert ids(probe) == ["no_gpu_devices", "hidden_by_cuda_visible_devices",
                          "tensorflow_without_cuda"]
    assert list(gp.PROBLEM_IDS) == ["no_gpu_devices", "no_driver_libraries", "driver_too_old",
                                    "hidden_by_cuda_visible_devices", "tensorflow_without_cuda",
                                    "cuda_libraries_failed", "no_tensor_cores"]


def test_parsers():
    assert gp.parse_version("450.80.02") == (450, 80, 2) and gp.parse_version("x") is None
    assert gp.parse_cuda_version("11.2") == (11, 2) and gp.parse_cuda_version("64_112") == (11, 2)
    assert gp.cuda_version_text(11020) == "11.2" and gp.cuda_version_text(10010) == "10.1"
    closed = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.82.01  Wed Oct 27 21:21:55 "
              "UTC 2021\nGCC version:  gcc version 9.3.0\n")
    opened = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.54.03  Release Build\n"
    assert probe_mod.parse_proc_driver_version(closed) == "470.82.01"
    assert probe_mod.parse_proc_driver_version(opened) == "535.54.03"
    assert probe_mod.parse_proc_driver_version("") is None


def test_check_libraries_reports_each_failure():
    def load(name):
        if name.startswith("libcudnn"):
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return object()

    assert probe_mod.check_libraries(load=load) == (
        ("libcudnn.so.8", "libcudnn.so.8: cannot open shared object file: No such file or "
                          "directory"),)
    assert "libcublasLt.so.11" in probe_mod.CUDA11_LIBRARIES


def test_device_node_listing(tmp_path):
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-modeset", "null", "dxg"):
        (tmp_path / name).touch()
    assert probe_mod.list_device_nodes(str(tmp_path)) == ("dxg", "nvidia-uvm", "nvidia0", "nvidiactl")
    assert probe_mod.list_device_nodes(str(tmp_path / "missing")) == ()


def test_the_module_does_not_import_tensorflow():
    code = ("import sys, app.machine.gpu_problems as g; g.main(['--json']); "
            "assert 'tensorflow' not in sys.modules, 'imported tensorflow'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert {p["id"] for p in report["gpu_problems"]} <= set(gp.PROBLEM_IDS)


# ---- the ctypes edge against a stub driver ----------------------------------------------

# The image ships no compiler; its own image test (tests/image/test_gpu_problems_image.py)
# builds the same stubs on the host and mounts them into containers.
needs_gcc = pytest.mark.host_only(reason="builds a stub libcuda.so.1 with gcc, which the image "
                                         "does not ship")


def build_stub(tmp_path: Path, **defines) -> Path:
    if shutil.which("gcc") is None:
        if os.environ.get("CI"):   # .ci/run installs gcc: a skip there would hide these tests
            pytest.fail("gcc is not installed (.ci/run installs it for the stub libcuda.so.1)")
        pytest.skip("gcc is not installed (needed to build the stub libcuda.so.1)")
    out = tmp_path / "libcuda.so.1"
    flags = []
    for key, value in defines.items():
        flags.append(f"-DSTUB_{key}={value}")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(STUB_SOURCE), *flags],
                   check=True, capture_output=True, timeout=60)
    return out


@needs_gcc
def test_read_driver_from_a_stub_with_an_old_driver(tmp_path):
    reading = probe_mod.read_driver(str(build_stub(tmp_path, CUDA_VERSION=10010)))
    assert reading == probe_mod.DriverReading(load_error=None, cuinit_status=0, cuda_version=10010,
                                       gpus=())


@needs_gcc
def test_read_driver_lists_the_drivers_gpus(tmp_path):
    lib = build_stub(tmp_path, CUDA_VERSION=11000, DEVICES=2, CC_MAJOR=8, CC_MINOR=6,
                     NAME='"NVIDIA GeForce RTX 3090"')
    reading = probe_mod.read_driver(str(lib))
    assert reading.cuda_version == 11000
    assert [(g.name, g.compute_capability, g.tensor_cores) for g in reading.gpus] == \
        [("NVIDIA GeForce RTX 3090", (8, 6), True)] * 2
    probe = replace(HEALTHY, driver_cuda_version=reading.cuda_version,
                    kernel_driver_version="450.80.02", gpus=reading.gpus, gpus_seen_by="driver")
    assert ids(probe) == ["driver_too_old"]


@needs_gcc
def test_read_driver_reports_cuinit_failures_and_missing_libraries(tmp_path):
    reading = probe_mod.read_driver(str(build_stub(tmp_path, INIT_STATUS=803)))
    assert reading.cuinit_status == 803 and reading.gpus is None
    missing = probe_mod.read_driver(str(tmp_path / "nowhere" / "libcuda.so.1"))
    assert missing.load_error and missing.cuinit_status is None


# ---- the reports that show the list ------------------------------------------------------

def test_env_report_text_lists_problems_with_their_fixes():
    from app.machine.envreport import format_text

    report = {
        "python": "3.8.10", "platform": "Linux", "tensorflow": "2.9.3", "keras": "2.9.0",
        "keras_major": 2, "numpy": "1.23.5", "built_with_cuda": True, "cuda_version": "11.2",
        "cudnn_version": "8", "auto_precision": {"policy": "float32", "reason": "no GPU"},
        "hardware": {"gpus": [], "cpu_avx512_bf16": False, "cpu_amx": False},
        "gpu_problems": [gp.Problem("hidden_by_cuda_visible_devices",
                                    "CUDA_VISIBLE_DEVICES=-1 hides every GPU",
                                    "unset CUDA_VISIBLE_DEVICES").to_dict()]}
    text = format_text(report)
    assert ("GPU problems:\n  [hidden_by_cuda_visible_devices] CUDA_VISIBLE_DEVICES=-1 hides "
            "every GPU\n    fix: unset CUDA_VISIBLE_DEVICES") in text
    assert format_text(dict(report, gpu_problems=[])).endswith("GPU problems:\n  none")


@ONCE_IN_THE_IMAGE
@pytest.mark.slow
def test_env_json_carries_the_list_beside_the_report():
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3",
           "CUDA_VISIBLE_DEVICES": "-1"}
    proc = subprocess.run([sys.executable, "-m", "app", "env", "--json"], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert {"tensorflow", "hardware", "auto_precision"} <= set(report)
    found = [p["id"] for p in report["gpu_problems"]]
    assert "hidden_by_cuda_visible_devices" in found
    assert found == sorted(found, key=gp.PROBLEM_IDS.index)
    for p in report["gpu_problems"]:
        assert set(p) == {"id", "line", "fix"} and p["line"] and p["fix"]


def test_gpus_tensorflow_lists_are_never_reported_missing_or_hidden():
    # E.g. a runtime that names its nodes differently, or a variable this parser misreads.
    probe = replace(HEALTHY, device_nodes=(), env={"CUDA_VISIBLE_DEVICES": "7"})
    assert gp.find_problems(probe) == []


def test_check_libraries_with_the_real_loader():
    failed = dict(probe_mod.check_libraries(("libc.so.6", "libtfmp-missing.so.1")))
    assert list(failed) == ["libtfmp-missing.so.1"]
    assert "libtfmp-missing.so.1" in failed["libtfmp-missing.so.1"]


def test_bad_flags_are_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "app.machine.gpu_problems", "--banner", "--json"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")


def test_the_libraries_are_dlopened_only_where_they_are_the_question():
    assert not gp.library_check_needed(HEALTHY)                      # TensorFlow lists a GPU
    assert gp.library_check_needed(replace(HEALTHY, gpus=()))        # ... it lists none
    assert gp.library_check_needed(replace(HEALTHY, gpus_seen_by="driver"))  # the banner
    assert not gp.library_check_needed(replace(HEALTHY, gpus=(), built_with_cuda=False))
    assert not gp.library_check_needed(replace(HEALTHY, gpus=(), cuinit_status=803))
    assert not gp.library_check_needed(replace(HEALTHY, gpus=(), driver_cuda_version=10020))


def test_a_newer_major_driver_runs_cuda_11_2_by_backward_compatibility():
    probe = replace(HEALTHY, driver_cuda_version=12020, kernel_driver_version="535.54.03",
                    gpus=(A100,))
    assert gp.find_problems(probe) == []


# ---- forward compatibility and NVIDIA_VISIBLE_DEVICES (issue 24, item 10) -------------------

@pytest.mark.parametrize("kernel, driver_cuda, gpu", [
    ("450.51.06", 11020, T4),     # R450 below the minor-version minimum, cuda-compat 11.2
    ("418.226.00", 11040, A100),  # R418 with a CUDA 11.4 compat libcuda: PTX compiles too
    ("470.82.01", 12020, A100),
])
def test_forward_compatibility_a_working_cuda_context_is_trusted_over_the_kernel_version(
        kernel, driver_cuda, gpu):
    probe = replace(HEALTHY, kernel_driver_version=kernel, driver_cuda_version=driver_cuda,
                    gpus=(gpu,))
    assert gp.find_problems(probe) == []
    # the same kernel module with its own libcuda (below 11.2) is still judged by the rules
    if kernel.startswith("450.51"):
        assert ids(replace(probe, driver_cuda_version=11000)) == ["driver_too_old"]
    # a compat libcuda that cannot start proves nothing
    assert "driver_too_old" in ids(replace(probe, cuinit_status=35, gpus=()))


@needs_gcc
def test_forward_compatibility_through_the_ctypes_probe(tmp_path):
    # What the container sees on an A100 with an R450 kernel module and cuda-compat 11.2:
    # the compat libcuda initialises and reports 11.2.
    lib = build_stub(tmp_path, CUDA_VERSION=11020, DEVICES=1, CC_MAJOR=8, CC_MINOR=0,
                     NAME='"NVIDIA A100-SXM4-40GB"')
    reading = probe_mod.read_driver(str(lib))
    assert (reading.cuinit_status, reading.cuda_version) == (0, 11020)
    probe = replace(HEALTHY, driver_cuda_version=reading.cuda_version,
                    kernel_driver_version="450.51.06", gpus=reading.gpus, gpus_seen_by="driver")
    assert ids(probe) == []


@pytest.mark.parametrize("value", ["", "void", "none"])
def test_nvidia_visible_devices_does_not_hide_gpus_the_container_was_given(value):
    # `--gpus all` passed the devices in: the toolkit's variable, whatever it says now, did
    # not hide them, and the driver lists them.
    given = replace(HEALTHY, gpus_seen_by="driver", env={"NVIDIA_VISIBLE_DEVICES": value})
    assert gp.find_problems(given) == []
    # device nodes but the driver finds none: the cause is the driver or the host, not this
    none_found = replace(given, cuinit_status=100, gpus=())
    problems = gp.find_problems(none_found)
    assert [p.id for p in problems] == ["no_gpu_devices"]
    assert "CUDA_ERROR_NO_DEVICE" in problems[0].line
