"""Why TensorFlow sees no GPU (or no fast one): the problems found, most fundamental first.

``python -m app env`` (text and ``--json``), the image's start-up banner and the self-test's
header all show the list this module makes.  Each problem has a stable id, one line saying
what was found and one line saying how to fix it (docs/image.md, "No GPU?").

``find_problems(probe)`` is a pure function of a ``GpuProbe`` (unit-tested with fake
probes); ``app.machine.gpu_probe`` is the edge that fills it in.  The driver is read through
``libcuda.so.1`` with ctypes, so a broken TensorFlow cannot hide why; TensorFlow's own view
(its build, its GPU list) is added only where the caller has imported it already.
Importing this module does not import TensorFlow.  Python 3.8 compatible (the real base).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Callable, Mapping, Sequence

from app.core.args import OneLineParser
from app.machine.gpu_probe import CUDA11_LIBRARIES, GpuProbe, check_libraries, probe_machine
from app.machine.hardware import GpuInfo, HardwareInfo

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
# Forward compatibility ("Forward Compatibility Support Across Major Toolkit Versions"): on
# data centre GPUs an older kernel module (R418, R440, R450, ...) runs a newer CUDA through
# the cuda-compat package's user-space libcuda (/usr/local/cuda/compat), which the NVIDIA
# Container Toolkit puts on the library path when the image's NVIDIA_REQUIRE_CUDA asks for
# more than the host driver has.  Then the kernel module's version says nothing about what
# CUDA runs: the libcuda this process loads, initialised (cuInit CUDA_SUCCESS) and reporting
# the toolkit's CUDA version or newer (cuDriverGetVersion), is the proof.  On a GPU that
# forward compatibility does not support, cuInit fails with
# CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (804), a no_driver_libraries problem.
MINOR_VERSION_COMPAT_MINIMUM = {11: (450, 80, 2), 12: (525, 60, 13)}
TOOLKIT_DRIVER_11_2 = "460.32.03"  # CUDA 11.2.1/11.2.2's driver (11.2.0: 460.27.03)
DEFAULT_CUDA = (11, 2)  # what the image's TensorFlow 2.9 is built with
# Compute capabilities TensorFlow 2.9 ships cubins for (TF_CUDA_COMPUTE_CAPABILITIES of its
# release builds: sm_35,sm_50,sm_60,sm_70,sm_75,compute_80).
TF29_CUBIN_ARCHS = ((3, 5), (5, 0), (6, 0), (7, 0), (7, 5))

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
    if _cuda_context_runs(p):
        return None   # a working libcuda for this CUDA or newer: no version rule applies
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


def _cuda_context_runs(p: GpuProbe) -> bool:
    """The libcuda this process loads starts (cuInit CUDA_SUCCESS) and supports the CUDA
    this TensorFlow is built with, or newer: whatever the kernel module's version (forward
    compatibility, see above), the driver is new enough."""
    req_major, req_minor = _required_cuda(p)
    driver = p.driver_cuda_version
    return (p.libcuda_error is None and p.cuinit_status == 0 and driver is not None
            and driver >= req_major * 1000 + req_minor * 10)


def _hidden_by(p: GpuProbe) -> str | None:
    """The variable that hides every GPU, or None.  GPUs the driver lists in this process
    are not hidden (CUDA_VISIBLE_DEVICES is applied by the driver before it lists them), and
    NVIDIA_VISIBLE_DEVICES is read only by the NVIDIA Container Toolkit when the container is
    created: where the container has GPU device nodes (`--gpus` passed them in) its value,
    "" included, did not hide them."""
    if p.gpus:
        return None
    nodes = [n for n in _gpu_nodes(p) if n != "dxg"]
    return visible_devices_hide_all(p.env.get("CUDA_VISIBLE_DEVICES"),
                                    None if nodes else p.env.get("NVIDIA_VISIBLE_DEVICES"),
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
    from app.precision.policy import choose_policy  # TF-free; imported here to keep the module light

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


def library_check_needed(p: GpuProbe) -> bool:
    """Whether to dlopen TensorFlow's CUDA libraries: only where their failure is the question
    left.  Where TensorFlow was asked and listed GPUs, they loaded; without TensorFlow (the
    banner) dlopening them, in that short-lived process, is the only way to know."""
    return (bool(p.built_with_cuda) and _driver_usable(p) and _required_cuda(p)[0] == 11
            and (p.gpus_seen_by != "tensorflow" or not p.gpus))


def problems_here(tf=None, tf_gpus: Sequence[GpuInfo] | None = None) -> list:
    """The problems on this machine as dicts, for reports.  ``tf``: the imported TensorFlow
    where the caller has it, with ``tf_gpus`` its GPU list (see ``probe_machine``)."""
    probe = probe_machine(tf=tf, tf_gpus=tf_gpus)
    if library_check_needed(probe):
        probe = replace(probe, library_errors=check_libraries(CUDA11_LIBRARIES))
    return [p.to_dict() for p in find_problems(probe)]


def format_problems(problems: Sequence[dict], indent: str = "  ") -> list:
    """Text lines: each problem's id and line, then its fix."""
    lines = []
    for p in problems:
        lines.append(f"{indent}[{p['id']}] {p['line']}")
        lines.append(f"{indent}  fix: {p['fix']}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m app.machine.gpu_problems",
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
