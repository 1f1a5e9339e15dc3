"""Why TensorFlow sees no GPU (or no fast one): the problems found, most fundamental first.

``python -m app env`` (text and ``--json``), the image's start-up banner and the self-test's
header all show the list this module makes.  Each problem has a stable id, one line saying
what was found and one line saying how to fix it (docs/image.md, "No GPU?").

Two halves, as in ``app.hardware``: ``find_problems(probe)`` is a pure function of a
``GpuProbe`` (unit-tested with fake probes), and ``probe_machine()`` is the edge that looks at
``/dev``, ``/proc``, the environment and the driver.  The driver is read through
``libcuda.so.1`` with ctypes, so a broken TensorFlow cannot hide why; TensorFlow's own view
(its build, its GPU list) is added only where the caller has imported it already.

Importing this module does not import TensorFlow.  Python 3.8 compatible (the real base).
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Mapping, Sequence

from app.hardware import GpuInfo, HardwareInfo, make_gpu

# The ids, most fundamental first: the order problems are listed in.
PROBLEM_IDS = (
    "no_gpu_devices",
    "no_driver_libraries",
    "driver_too_old",
    "hidden_by_cuda_visible_devices",
    "tensorflow_without_cuda",
    "cuda_libraries_failed",
    "no_tensor_cores",
)

# ---- the CUDA driver rule ----------------------------------------------------------------
# NVIDIA, "CUDA Compatibility" (docs.nvidia.com/deploy/cuda-compatibility/), "Minor Version
# Compatibility": from CUDA 11 on, an application built with any CUDA 11.x toolkit runs, with
# a limited feature set, on a driver of the same major family at least as new as the
# family's minimum: >= 450.80.02 on Linux (452.39 on Windows) for CUDA 11.x.  CUDA 11.0
# shipped with older R450 drivers (450.36.06, 450.51.xx), which are below that minimum.
# The CUDA Toolkit release notes give each toolkit's own driver: CUDA 11.2.0 >= 460.27.03,
# 11.2.1 and 11.2.2 >= 460.32.03; a driver that reports CUDA 11.2 or newer
# (cuDriverGetVersion >= 11020) needs no compatibility at all.
# What minor-version compatibility does NOT cover ("Application Considerations"):
#  * PTX: the driver's JIT compiles only PTX of its own CUDA version or older, so PTX made by
#    a newer toolkit fails (CUDA_ERROR_UNSUPPORTED_PTX_VERSION).  TensorFlow 2.9's release
#    builds carry machine code (cubins) for sm_35, sm_50, sm_60, sm_70 and sm_75 and only
#    PTX (compute_80, from CUDA 11.2) above: on compute capability 8.x and newer every
#    TensorFlow kernel is JIT-compiled from that PTX, so those GPUs need a CUDA 11.2 driver.
#  * APIs that need driver support added in a later minor release return
#    cudaErrorCallRequiresNewerDriver.
#  * It never crosses a major version: a CUDA 10.x driver cannot run CUDA 11 at all.
MINOR_VERSION_COMPAT_MINIMUM = {11: (450, 80, 2), 12: (525, 60, 13)}
TOOLKIT_DRIVER_11_2 = "460.32.03"  # CUDA 11.2.1/11.2.2's driver (11.2.0: 460.27.03)
DEFAULT_CUDA = (11, 2)  # what the image's TensorFlow 2.9 is built with
# Compute capabilities TensorFlow 2.9 ships cubins for (TF_CUDA_COMPUTE_CAPABILITIES of its
# release builds: sm_35,sm_50,sm_60,sm_70,sm_75,compute_80).
TF29_CUBIN_ARCHS = ((3, 5), (5, 0), (6, 0), (7, 0), (7, 5))

# The shared libraries TensorFlow built for CUDA 11 dlopens before it registers a GPU
# (stream_executor's dso_loader); one failing means no GPU at all.
CUDA11_LIBRARIES = (
    "libcudart.so.11.0", "libcublas.so.11", "libcublasLt.so.11", "libcufft.so.10",
    "libcurand.so.10", "libcusolver.so.11", "libcusparse.so.11", "libcudnn.so.8",
)

# CUresult values cuInit can return (cuda.h), named so a line says more than a number.
CU_RESULT_NAMES = {
    0: "CUDA_SUCCESS",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100

# Distribution names that install the `tensorflow` module (normalised: lower case, "-").
TENSORFLOW_DISTRIBUTIONS = (
    "tensorflow", "tensorflow-gpu", "tensorflow-cpu", "intel-tensorflow",
    "intel-tensorflow-avx512", "tensorflow-intel", "tensorflow-aarch64", "tensorflow-cpu-aws",
    "tensorflow-rocm", "tensorflow-macos", "tf-nightly", "tf-nightly-gpu", "tf-nightly-cpu",
)

GPU_RUN_HINT = ("start the container with GPUs: `docker run --gpus all ...`, or the compose "
                "file's GPU reservation (docker-compose.yml, without docker-compose.cpu.yml); "
                "the host needs the NVIDIA driver and the NVIDIA Container Toolkit; on "
                "Kubernetes a `nvidia.com/gpu` resource limit")


@dataclass(frozen=True)
class Problem:
    id: str
    line: str
    fix: str

    def to_dict(self) -> dict:
        return asdict(self)


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


# ---- pure rules ---------------------------------------------------------------------------

def parse_version(text: str | None) -> tuple | None:
    """"450.80.02" -> (450, 80, 2); None for anything else."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.(\d+))?\s*", text or "")
    if not m:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def parse_cuda_version(text: str | None) -> tuple | None:
    """The (major, minor) of a TensorFlow build's cuda_version: "11.2", or "64_112" on Windows."""
    text = str(text or "")
    m = re.match(r"(\d+)\.(\d+)", text)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = re.fullmatch(r"64_(\d+)(\d)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def cuda_version_text(v: int) -> str:
    """cuDriverGetVersion's 11020 -> "11.2"."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def parse_proc_driver_version(text: str) -> str | None:
    """The kernel module's version from /proc/driver/nvidia/version.

    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.82.01  Wed Oct 27 ..." (or "... Open
    Kernel Module for x86_64  535.54.03 ...")."""
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            m = re.search(r"Module\b.*?\s(\d+\.\d+(?:\.\d+)?)(?:\s|$)", line)
            return m.group(1) if m else None
    return None


def cu_result_name(status: int) -> str:
    return CU_RESULT_NAMES.get(status, f"CUresult {status}")


def visible_devices_hide_all(cuda_visible: str | None, nvidia_visible: str | None,
                             device_count: int | None) -> str | None:
    """Which variable hides every GPU (its "NAME=value"), or None.

    CUDA reads CUDA_VISIBLE_DEVICES left to right and stops at the first entry that is not a
    device (a negative or out-of-range index, an unknown word): "-1", "" or "none" hide all.
    UUIDs (GPU-..., MIG-...) cannot be checked here and count as visible.
    The NVIDIA Container Toolkit injects no GPU for NVIDIA_VISIBLE_DEVICES=void, none or "".
    """
    if nvidia_visible is not None and nvidia_visible.strip().lower() in ("", "void", "none"):
        return f"NVIDIA_VISIBLE_DEVICES={nvidia_visible}"
    if cuda_visible is None:
        return None
    first = cuda_visible.split(",")[0].strip()
    if first.upper().startswith(("GPU-", "MIG-")):
        return None
    if re.fullmatch(r"\d+", first) and (device_count is None or int(first) < device_count):
        return None
    return f"CUDA_VISIBLE_DEVICES={cuda_visible}"


def needs_ptx_jit(cc: Sequence[int] | None, cubin_archs=TF29_CUBIN_ARCHS) -> bool:
    """True where TensorFlow has no machine code for this GPU and must JIT its PTX.

    A cubin for sm_XY runs on sm_XZ with Z >= Y (same major), never across majors."""
    if not cc:
        return False
    major, minor = int(cc[0]), int(cc[1])
    return not any(a == major and b <= minor for a, b in cubin_archs)


def _gpu_nodes(probe: GpuProbe) -> list:
    return [n for n in probe.device_nodes if re.fullmatch(r"nvidia\d+|dxg", n)]


def _tf_sees_gpus(p: GpuProbe) -> bool:
    """TensorFlow lists GPUs: whatever /dev or the variables look like, they are not hidden."""
    return p.gpus_seen_by == "tensorflow" and bool(p.gpus)


def _rule_no_gpu_devices(p: GpuProbe) -> Problem | None:
    if _tf_sees_gpus(p):
        return None
    if not _gpu_nodes(p):
        return Problem("no_gpu_devices",
                       "no GPU device nodes (/dev/nvidia0, /dev/nvidia1, ...): this container "
                       "(or machine) was given no GPU",
                       GPU_RUN_HINT + "; check on the host with `nvidia-smi` and "
                       "`docker run --rm --gpus all IMAGE nvidia-smi`")
    if p.libcuda_error is None and p.cuinit_status == CUDA_ERROR_NO_DEVICE \
            and not _hidden_by(p):
        return Problem("no_gpu_devices",
                       f"device nodes are present ({', '.join(_gpu_nodes(p))}) but the driver "
                       "finds no GPU (cuInit: CUDA_ERROR_NO_DEVICE)",
                       "check the GPU on the host with `nvidia-smi`; a GPU that fell off the bus "
                       "or a host driver without the device needs the host fixed first")
    return None


def _capabilities_hint(env: Mapping[str, str]) -> str:
    caps = env.get("NVIDIA_DRIVER_CAPABILITIES")
    if caps is None:
        return ""
    wanted = {c.strip() for c in caps.split(",")}
    if "all" in wanted or {"compute", "utility"} <= wanted:
        return ""
    return (f" NVIDIA_DRIVER_CAPABILITIES={caps} lacks compute,utility: set it to "
            "compute,utility (or all).")


def _rule_no_driver_libraries(p: GpuProbe) -> Problem | None:
    if not _gpu_nodes(p) or _tf_sees_gpus(p):
        return None  # no GPU given at all: no_gpu_devices says it; no library is expected
    if p.libcuda_error is not None:
        return Problem("no_driver_libraries",
                       "GPU device nodes are present but the driver's user-space library "
                       f"libcuda.so.1 cannot be loaded ({p.libcuda_error})",
                       "the NVIDIA Container Toolkit injects the host driver's libraries: "
                       "start with `--gpus all` (or `--runtime=nvidia`) rather than "
                       "`--device /dev/nvidia0`, and check the host's toolkit with "
                       "`nvidia-ctk runtime configure --runtime=docker` then restart Docker."
                       + _capabilities_hint(p.env))
    status = p.cuinit_status
    if status in (None, 0, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INSUFFICIENT_DRIVER):
        return None  # fine, or said by no_gpu_devices / hidden / driver_too_old
    fixes = {
        34: "a CUDA toolkit stub libcuda (lib64/stubs) is on LD_LIBRARY_PATH ahead of the "
            "driver's: remove that folder from LD_LIBRARY_PATH",
        803: "the host's kernel module and the injected libcuda.so.1 are different versions "
             "(typically a host driver upgrade without a reboot): reboot the host, or reload "
             "the nvidia kernel modules",
        804: "a CUDA forward-compatibility libcuda (cuda-compat) is in use, which only data "
             "centre GPUs support: remove /usr/local/cuda/compat from LD_LIBRARY_PATH",
    }
    return Problem("no_driver_libraries",
                   f"libcuda.so.1 loads but cannot start the driver (cuInit: "
                   f"{cu_result_name(status)})",
                   fixes.get(status, "check the host with `nvidia-smi` and the kernel log "
                             "(`dmesg | grep -i nvrm`); then restart the container"))


def _version_text(v: Sequence[int]) -> str:
    """(450, 80, 2) -> "450.80.02" (NVIDIA writes the third part with two digits)."""
    return ".".join([str(n) for n in v[:2]] + [f"{n:02d}" for n in v[2:]])


def _required_cuda(p: GpuProbe) -> tuple:
    return parse_cuda_version(p.tf_cuda_version) or DEFAULT_CUDA


def _rule_driver_too_old(p: GpuProbe) -> Problem | None:
    if p.libcuda_error is not None:
        return None
    req_major, req_minor = _required_cuda(p)
    need = f"CUDA {req_major}.{req_minor}"
    minimum = MINOR_VERSION_COMPAT_MINIMUM.get(req_major)
    minimum_text = _version_text(minimum) if minimum else None
    if (req_major, req_minor) == (11, 2):
        fix = (f"update the host's NVIDIA driver: {TOOLKIT_DRIVER_11_2} or newer is CUDA 11.2's "
               f"own driver; any CUDA 11.x driver from {minimum_text} on runs it by CUDA's "
               "minor-version compatibility, except on GPUs that need PTX compiled (compute "
               "capability 8.0 and newer)")
    else:
        fix = f"update the host's NVIDIA driver to one that supports {need}"
    driver = p.driver_cuda_version
    if driver is not None and driver // 1000 < req_major:
        return Problem("driver_too_old",
                       f"the driver supports CUDA {cuda_version_text(driver)}; this TensorFlow "
                       f"is built with {need}, and minor-version compatibility never crosses a "
                       f"major version", fix)
    if p.cuinit_status == CUDA_ERROR_INSUFFICIENT_DRIVER:
        return Problem("driver_too_old",
                       "cuInit: CUDA_ERROR_INSUFFICIENT_DRIVER: the driver is older than the "
                       "CUDA runtime asks for", fix)
    kernel = parse_version(p.kernel_driver_version)
    if minimum and kernel is not None and kernel < minimum and (
            driver is None or driver // 1000 == req_major):
        return Problem("driver_too_old",
                       f"driver {p.kernel_driver_version} is older than {minimum_text}, the "
                       f"minimum for CUDA {req_major}.x minor-version compatibility; "
                       f"this TensorFlow is built with {need}", fix)
    if driver is not None and driver < req_major * 1000 + req_minor * 10:
        jit = [g for g in (p.gpus or ()) if needs_ptx_jit(g.compute_capability)]
        if jit:
            names = ", ".join(f"{g.name} ({'.'.join(map(str, g.compute_capability))})"
                              for g in jit)
            return Problem("driver_too_old",
                           f"the driver supports CUDA {cuda_version_text(driver)}: {need} runs "
                           "on it by minor-version compatibility, but not PTX: TensorFlow has "
                           f"no machine code for {names} and this driver cannot compile its "
                           f"{need} PTX (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)", fix)
    return None


def _hidden_by(p: GpuProbe) -> str | None:
    nodes = [n for n in _gpu_nodes(p) if n != "dxg"]
    return visible_devices_hide_all(p.env.get("CUDA_VISIBLE_DEVICES"),
                                    p.env.get("NVIDIA_VISIBLE_DEVICES"),
                                    len(nodes) if nodes else None)


def _rule_hidden(p: GpuProbe) -> Problem | None:
    setting = None if _tf_sees_gpus(p) else _hidden_by(p)
    if setting is None:
        return None
    name = setting.split("=", 1)[0]
    if name == "NVIDIA_VISIBLE_DEVICES":
        fix = ("NVIDIA_VISIBLE_DEVICES=all (or a list of GPU indices or UUIDs), or leave it "
               "unset and use `--gpus all`")
    else:
        fix = ("unset CUDA_VISIBLE_DEVICES, or list existing GPUs (indices from 0, or UUIDs "
               "from `nvidia-smi -L`), e.g. CUDA_VISIBLE_DEVICES=0")
    return Problem("hidden_by_cuda_visible_devices", f"{setting} hides every GPU", fix)


def _rule_tensorflow_without_cuda(p: GpuProbe) -> Problem | None:
    if p.built_with_cuda is not False:
        return None
    dists = ", ".join(p.tf_distributions) or "an unknown distribution"
    names = [d.split()[0] for d in p.tf_distributions]
    version = p.tf_version or "2.9.3"
    uninstall = " ".join(n for n in names if n != "tensorflow")
    fix = (f"{'pip uninstall -y ' + uninstall + ' && ' if uninstall else ''}"
           f"pip install --force-reinstall --no-deps tensorflow=={version} (on Linux the "
           "`tensorflow` distribution is the CUDA build; the image's own is pinned in "
           "/etc/tfmp/constraints.txt), or start a fresh container from the image: "
           "a `pip install` inside a container is lost with it")
    return Problem("tensorflow_without_cuda",
                   f"TensorFlow {p.tf_version or ''} is built without CUDA (installed from "
                   f"{dists}): it cannot use a GPU".replace("  ", " "), fix)


def _driver_usable(p: GpuProbe) -> bool:
    return (p.libcuda_error is None and p.cuinit_status == 0 and bool(_gpu_nodes(p))
            and _hidden_by(p) is None and _rule_driver_too_old(p) is None)


def _rule_cuda_libraries_failed(p: GpuProbe) -> Problem | None:
    if not p.built_with_cuda or not _driver_usable(p):
        return None
    failed = list(p.library_errors or ())
    if failed:
        what = "; ".join(f"{lib}: {err}" for lib, err in failed)
        return Problem("cuda_libraries_failed",
                       f"the driver works but TensorFlow's CUDA libraries do not load ({what}), "
                       "so TensorFlow registers no GPU",
                       f"this TensorFlow needs CUDA {'.'.join(map(str, _required_cuda(p)))} "
                       "and cuDNN 8 on the library path: use the image's own base (its "
                       "LD_LIBRARY_PATH and /usr/local/cuda), do not override LD_LIBRARY_PATH; "
                       "`ldconfig -p | grep -E 'cudnn|cublas'` shows what is installed")
    if p.gpus_seen_by == "tensorflow" and p.gpus is not None and not p.gpus:
        return Problem("cuda_libraries_failed",
                       "the driver works and the CUDA libraries load, yet TensorFlow registered "
                       "no GPU",
                       "run `TF_CPP_MIN_LOG_LEVEL=0 python -c \"import tensorflow as tf; "
                       "print(tf.config.list_physical_devices('GPU'))\"`: its loader names the "
                       "library or the device it rejected")
    return None


def _rule_no_tensor_cores(p: GpuProbe) -> Problem | None:
    gpus = list(p.gpus or ())
    if not gpus or any(g.tensor_cores for g in gpus):
        return None
    from app.precision import choose_policy  # TF-free; imported here to keep the module light

    auto = choose_policy(HardwareInfo(gpus=gpus))
    names = ", ".join(f"{g.name} ({'.'.join(map(str, g.compute_capability)) if g.compute_capability else 'unknown'})"
                      for g in gpus)
    return Problem("no_tensor_cores",
                   f"no visible GPU has Tensor Cores ({names}): mixed_float16 will not be "
                   f"faster than float32; `--precision auto` picks {auto.policy}",
                   "use --precision auto or float32 here; mixed_float16 pays off on compute "
                   "capability 7.0+ (V100, T4, RTX 20xx and newer, not GTX 16xx)")


RULES: Sequence[Callable[[GpuProbe], Problem | None]] = (
    _rule_no_gpu_devices,
    _rule_no_driver_libraries,
    _rule_driver_too_old,
    _rule_hidden,
    _rule_tensorflow_without_cuda,
    _rule_cuda_libraries_failed,
    _rule_no_tensor_cores,
)


def find_problems(probe: GpuProbe) -> list:
    """The problems in ``probe``, most fundamental first (the order of PROBLEM_IDS)."""
    found = [p for p in (rule(probe) for rule in RULES) if p is not None]
    return sorted(found, key=lambda p: PROBLEM_IDS.index(p.id))


# ---- edge: asks the machine ----------------------------------------------------------------

ENV_VARS = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")


def list_device_nodes(dev: str = "/dev") -> tuple:
    try:
        names = os.listdir(dev)
    except OSError:
        return ()
    return tuple(sorted(n for n in names if re.fullmatch(r"nvidia(\d+|ctl|-uvm)|dxg", n)))


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
    probe = GpuProbe(
        device_nodes=nodes, libcuda_error=driver.load_error, cuinit_status=driver.cuinit_status,
        driver_cuda_version=driver.cuda_version,
        kernel_driver_version=read_kernel_driver_version(), gpus=gpus, gpus_seen_by=seen_by,
        env=env, built_with_cuda=built_with_cuda, tf_version=tf_version,
        tf_cuda_version=build.get("cuda_version"), tf_distributions=distributions)
    # dlopen the CUDA libraries only where their failure is the question left: where
    # TensorFlow was asked and listed GPUs, they loaded.  Without TensorFlow (the banner)
    # this is the only way to know, in the banner's own short-lived process.
    cuda = parse_cuda_version(probe.tf_cuda_version) or DEFAULT_CUDA
    tf_found_none = seen_by == "tensorflow" and not gpus
    if built_with_cuda and _driver_usable(probe) and cuda[0] == 11 and (tf is None or tf_found_none):
        probe = replace(probe, library_errors=check_libraries())
    return probe


def problems_here(tf=None, tf_gpus: Sequence[GpuInfo] | None = None) -> list:
    """``find_problems(probe_machine(...))`` as dicts, for reports."""
    return [p.to_dict() for p in find_problems(probe_machine(tf=tf, tf_gpus=tf_gpus))]


def format_problems(problems: Sequence[dict], indent: str = "  ") -> list:
    """Text lines: each problem's id and line, then its fix."""
    lines = []
    for p in problems:
        lines.append(f"{indent}[{p['id']}] {p['line']}")
        lines.append(f"{indent}  fix: {p['fix']}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    from app.cli import _OneLineParser  # the package's one-line usage errors (exit 2)

    parser = _OneLineParser(
        prog="python -m app.gpu_problems",
        description="Why TensorFlow sees no GPU here (without importing TensorFlow).")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="print {\"gpu_problems\": [...]}")
    mode.add_argument("--banner", action="store_true",
                      help="one line per problem and one per fix, for the start-up banner")
    args = parser.parse_args(argv)
    problems = problems_here()
    if args.json:
        print(json.dumps({"gpu_problems": problems}, indent=2))
    elif args.banner:
        for p in problems:
            print(f"GPU problem [{p['id']}]: {p['line']}")
            print(f"  fix [{p['id']}]: {p['fix']}")
    else:
        print("\n".join(["GPU problems:"] + (format_problems(problems) or ["  none"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
