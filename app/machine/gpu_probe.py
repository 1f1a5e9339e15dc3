"""What a machine offers a CUDA TensorFlow, read without TensorFlow: the edge of
``app.machine.gpu_problems``.

``probe_machine()`` looks at ``/dev`` (the device nodes a container was given), the driver
(``libcuda.so.1`` through ctypes: ``cuInit``, ``cuDriverGetVersion``, the driver's GPU list),
``/proc/driver/nvidia/version``, the variables that hide GPUs, and TensorFlow's build (its
generated ``build_info.py``, or the imported module where the caller has it).  The result is a
``GpuProbe``, which ``app.machine.gpu_problems.find_problems`` judges.

Importing this module does not import TensorFlow.  Python 3.8 compatible (the real base).
"""
from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from app.machine.hardware import GpuInfo, make_gpu

# The shared libraries TensorFlow built for CUDA 11 dlopens before it registers a GPU
# (stream_executor's dso_loader); one failing means no GPU at all.
CUDA11_LIBRARIES = (
    "libcudart.so.11.0", "libcublas.so.11", "libcublasLt.so.11", "libcufft.so.10",
    "libcurand.so.10", "libcusolver.so.11", "libcusparse.so.11", "libcudnn.so.8",
)

# Distribution names that install the `tensorflow` module (normalised: lower case, "-").
TENSORFLOW_DISTRIBUTIONS = (
    "tensorflow", "tensorflow-gpu", "tensorflow-cpu", "intel-tensorflow",
    "intel-tensorflow-avx512", "tensorflow-intel", "tensorflow-aarch64", "tensorflow-cpu-aws",
    "tensorflow-rocm", "tensorflow-macos", "tf-nightly", "tf-nightly-gpu", "tf-nightly-cpu",
)


@dataclass(frozen=True)
class GpuProbe:
    """What the edge found; every field may be unknown (None) where it could not look."""

    # Device nodes under /dev that give a container a GPU: nvidia0, nvidia1, ... (Linux),
    # dxg (WSL2, where the GPU is shared through /dev/dxg and there are no /dev/nvidia*).
    device_nodes: tuple = ()
    libcuda_error: str | None = None          # why libcuda.so.1 did not load; None: it loaded
    cuinit_status: int | None = None           # CUresult of cuInit(0)
    driver_cuda_version: int | None = None     # cuDriverGetVersion: 11020 means CUDA 11.2
    kernel_driver_version: str | None = None   # /proc/driver/nvidia/version, e.g. "470.82.01"
    # GPUs and where the list came from: TensorFlow's view where it was asked, else the
    # driver's (libcuda).  None: nobody could be asked.
    gpus: tuple | None = None
    gpus_seen_by: str = "driver"
    env: Mapping[str, str] = field(default_factory=dict)
    # TensorFlow: None where it is not installed
    built_with_cuda: bool | None = None
    tf_version: str | None = None
    tf_cuda_version: str | None = None         # its build's CUDA, e.g. "11.2"
    tf_distributions: tuple = ()               # ("tensorflow-cpu 2.9.3", ...)
    # (soname, error) for each CUDA library that failed to load; None: not checked
    library_errors: tuple | None = None


ENV_VARS = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")


def list_device_nodes(dev: str = "/dev") -> tuple:
    try:
        names = os.listdir(dev)
    except OSError:
        return ()
    return tuple(sorted(n for n in names if re.fullmatch(r"nvidia(\d+|ctl|-uvm)|dxg", n)))


def parse_proc_driver_version(text: str) -> str | None:
    """The kernel module's version from /proc/driver/nvidia/version.

    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.82.01  Wed Oct 27 ..." (or "... Open
    Kernel Module for x86_64  535.54.03 ...")."""
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            m = re.search(r"Module\b.*?\s(\d+\.\d+(?:\.\d+)?)(?:\s|$)", line)
            return m.group(1) if m else None
    return None


def read_kernel_driver_version(path: str = "/proc/driver/nvidia/version") -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return parse_proc_driver_version(fh.read())
    except OSError:
        return None


@dataclass(frozen=True)
class DriverReading:
    load_error: str | None = None
    cuinit_status: int | None = None
    cuda_version: int | None = None
    gpus: tuple | None = None


# CUdevice_attribute values (cuda.h)
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


def read_driver(soname: str = "libcuda.so.1") -> DriverReading:
    """cuInit, cuDriverGetVersion and the driver's GPU list, straight from libcuda."""
    try:
        lib = ctypes.CDLL(soname)
    except OSError as exc:
        return DriverReading(load_error=str(exc).strip() or "cannot be loaded")
    try:
        status = int(lib.cuInit(0))
    except AttributeError:
        return DriverReading(load_error=f"{soname} has no cuInit: not NVIDIA's driver library")
    version = ctypes.c_int(0)
    cuda_version = None
    fn = getattr(lib, "cuDriverGetVersion", None)
    if fn is not None and fn(ctypes.byref(version)) == 0 and version.value > 0:
        cuda_version = version.value
    gpus = _driver_gpus(lib) if status == 0 else None
    return DriverReading(cuinit_status=status, cuda_version=cuda_version, gpus=gpus)


def _driver_gpus(lib) -> tuple | None:
    try:
        count = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return None
        gpus = []
        for i in range(count.value):
            dev = ctypes.c_int(0)
            if lib.cuDeviceGet(ctypes.byref(dev), i) != 0:
                return None
            name = ctypes.create_string_buffer(256)
            lib.cuDeviceGetName(name, 256, dev)
            major, minor = ctypes.c_int(0), ctypes.c_int(0)
            lib.cuDeviceGetAttribute(ctypes.byref(major),
                                     _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
            lib.cuDeviceGetAttribute(ctypes.byref(minor),
                                     _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
            gpus.append(make_gpu(name.value.decode(errors="replace") or f"GPU {i}",
                                 (major.value, minor.value) if major.value else None))
        return tuple(gpus)
    except AttributeError:  # a library without the device API (a stub)
        return None


def check_libraries(sonames: Sequence[str] = CUDA11_LIBRARIES,
                    load: Callable[[str], object] = ctypes.CDLL) -> tuple:
    """(soname, error) for each library that cannot be dlopened, as TensorFlow would."""
    failed = []
    for soname in sonames:
        try:
            load(soname)
        except OSError as exc:
            failed.append((soname, str(exc).strip().split("\n")[0]))
    return tuple(failed)


def installed_tensorflow_distributions() -> tuple:
    """("tensorflow-cpu 2.9.3", ...): the installed distributions that ship the module.

    Looked up by name (a few file-system lookups); scanning every installed distribution's
    metadata costs ~0.3 s in the image, too much for each start's banner."""
    from importlib import metadata

    found = []
    for name in TENSORFLOW_DISTRIBUTIONS:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return tuple(found)


def read_tensorflow_build_without_import() -> dict | None:
    """TensorFlow's build_info (is_cuda_build, cuda_version) without importing TensorFlow.

    tensorflow/python/platform/build_info.py is a generated plain-Python file; executing it
    alone costs milliseconds where ``import tensorflow`` costs seconds (the banner)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("tensorflow")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = os.path.join(root, "python", "platform", "build_info.py")
        if os.path.isfile(path):
            scope: dict = {}
            try:
                with open(path, encoding="utf-8") as fh:
                    exec(compile(fh.read(), path, "exec"), scope)  # noqa: S102 - TF's own file
            except Exception:
                return None
            return dict(scope.get("build_info") or {})
    return None


def probe_machine(tf=None, tf_gpus: Sequence[GpuInfo] | None = None,
                  environ: Mapping[str, str] | None = None) -> GpuProbe:
    """Look at this machine.  ``tf``: the imported TensorFlow module where the caller has it
    (its own answers then), with ``tf_gpus`` its GPU list; without, TensorFlow is not
    imported and the driver's GPU list stands in."""
    environ = os.environ if environ is None else environ
    env = {k: environ[k] for k in ENV_VARS if k in environ}
    nodes = list_device_nodes()
    driver = read_driver()
    distributions = installed_tensorflow_distributions()
    if tf is not None:
        try:
            build = dict(tf.sysconfig.get_build_info())
        except Exception:
            build = {}
        built_with_cuda = bool(tf.test.is_built_with_cuda())
        tf_version = tf.__version__
    else:
        build = read_tensorflow_build_without_import() or {}
        built_with_cuda = bool(build.get("is_cuda_build")) if build else None
        tf_version = distributions[0].split()[1] if distributions else None
    gpus: tuple | None
    if tf is not None and tf_gpus is not None:
        gpus, seen_by = tuple(tf_gpus), "tensorflow"
    else:
        gpus, seen_by = driver.gpus, "driver"
    return GpuProbe(
        device_nodes=nodes, libcuda_error=driver.load_error, cuinit_status=driver.cuinit_status,
        driver_cuda_version=driver.cuda_version,
        kernel_driver_version=read_kernel_driver_version(), gpus=gpus, gpus_seen_by=seen_by,
        env=env, built_with_cuda=built_with_cuda, tf_version=tf_version,
        tf_cuda_version=build.get("cuda_version"), tf_distributions=distributions)
