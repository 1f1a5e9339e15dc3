"""What the NVIDIA driver says about each GPU right now, through NVML: memory (total, used,
free), the processes holding memory, utilisation, temperature and power.

``tfmp tune`` takes ``auto``'s GPU budget from the free memory here, ``tfmp train`` and
``tune`` name the processes holding memory when it is short, and the JupyterLab GPU view
(``docker/bin/tfmp-gpu-view``) draws it.  NVML comes from ``nvidia-ml-py`` (module
``pynvml``), imported only inside ``read()``: without the package, the driver or a GPU,
``read`` returns no GPUs and the reason, and nothing fails.

NVML inside a container reports the host's process ids; a process in another container (or
on the host) has no entry in this container's ``/proc``, so it is named by its id only, and
memory that no listed process accounts for is said to be held outside this container's view
(NVIDIA/nvidia-docker#179: ``nvidia-smi`` in a container lists no processes).

Importing this module does not import TensorFlow or pynvml.  Python 3.8 compatible.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

NO_PACKAGE = "nvidia-ml-py (module pynvml) is not installed"
NO_DRIVER = ("no NVIDIA driver library (libnvidia-ml.so.1) in this container: it was started "
             "without a GPU (docker run --gpus all, or compose's GPU reservation)")


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str              # the command from /proc/<pid>/cmdline, NVML's name, or ""
    used_bytes: Optional[int]
    kind: str = "compute"  # compute | graphics


@dataclass(frozen=True)
class GpuState:
    index: int
    name: str
    memory_total: Optional[int] = None
    memory_used: Optional[int] = None
    memory_free: Optional[int] = None
    utilization_percent: Optional[int] = None
    memory_utilization_percent: Optional[int] = None
    temperature_c: Optional[int] = None
    power_w: Optional[float] = None
    power_limit_w: Optional[float] = None
    processes: Tuple[GpuProcess, ...] = ()
    # None: the list was read; else why it could not be (an old driver, no permission)
    processes_error: Optional[str] = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["processes"] = [asdict(p) for p in self.processes]
        return d


@dataclass(frozen=True)
class Reading:
    gpus: Tuple[GpuState, ...] = ()
    error: Optional[str] = None          # why there are no GPUs (None: NVML answered)
    driver_version: Optional[str] = None

    def to_dict(self) -> dict:
        return {"gpus": [g.to_dict() for g in self.gpus], "error": self.error,
                "driver_version": self.driver_version}


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _command(pid: int, proc: str = "/proc") -> Optional[str]:
    """The command line of ``pid`` in this container's /proc, or None when it is not here."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    words = [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]
    return " ".join(words)[:120] if words else None


def _maybe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:   # NVMLError_NotSupported, _NoPermission, _FunctionNotFound ...
        return None


def _processes(nvml, handle, command: Callable[[int], Optional[str]]):
    out: List[GpuProcess] = []
    error = None
    for kind, getter in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                         ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
        fn = getattr(nvml, getter, None)
        if fn is None:
            continue
        try:
            infos = fn(handle) or []
        except Exception as exc:
            if kind == "compute":
                error = f"{type(exc).__name__}: {exc}"
            continue
        for info in infos:
            pid = int(getattr(info, "pid", 0))
            if any(p.pid == pid for p in out):
                continue
            used = getattr(info, "usedGpuMemory", None)
            # NVML reports "not available" as a huge value (NVML_VALUE_NOT_AVAILABLE).
            used = int(used) if isinstance(used, int) and 0 <= used < 2**62 else None
            name = command(pid) or _maybe(lambda: _text(nvml.nvmlSystemGetProcessName(pid))) or ""
            out.append(GpuProcess(pid=pid, name=name, used_bytes=used, kind=kind))
    return tuple(out), error


def read(nvml=None, command: Callable[[int], Optional[str]] = _command) -> Reading:
    """Every GPU's state now.  ``nvml``: the pynvml module (tests give a fake one)."""
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py; optional
        except ImportError:
            return Reading(error=NO_PACKAGE)
    try:
        nvml.nvmlInit()
    except Exception as exc:
        missing = getattr(nvml, "NVMLError_LibraryNotFound", None)
        if missing is not None and isinstance(exc, missing):
            return Reading(error=NO_DRIVER)
        return Reading(error=f"NVML did not start: {type(exc).__name__}: {exc}")
    try:
        driver = _maybe(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        gpus = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = _maybe(lambda: nvml.nvmlDeviceGetMemoryInfo(h))
            util = _maybe(lambda: nvml.nvmlDeviceGetUtilizationRates(h))
            power = _maybe(lambda: nvml.nvmlDeviceGetPowerUsage(h))
            limit = _maybe(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
            temp = _maybe(lambda: nvml.nvmlDeviceGetTemperature(
                h, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)))
            procs, procs_error = _processes(nvml, h, command)
            gpus.append(GpuState(
                index=i, name=_maybe(lambda: _text(nvml.nvmlDeviceGetName(h))) or f"GPU {i}",
                memory_total=int(mem.total) if mem else None,
                memory_used=int(mem.used) if mem else None,
                memory_free=int(mem.free) if mem else None,
                utilization_percent=int(util.gpu) if util else None,
                memory_utilization_percent=int(util.memory) if util else None,
                temperature_c=int(temp) if temp is not None else None,
                power_w=power / 1000.0 if power is not None else None,
                power_limit_w=limit / 1000.0 if limit is not None else None,
                processes=procs, processes_error=procs_error))
        if not gpus:
            return Reading(error="the NVIDIA driver sees no GPU (NVIDIA_VISIBLE_DEVICES or "
                                 "the container's --gpus selection is empty)",
                           driver_version=driver)
        return Reading(gpus=tuple(gpus), driver_version=driver)
    except Exception as exc:
        return Reading(error=f"NVML failed: {type(exc).__name__}: {exc}")
    finally:
        _maybe(nvml.nvmlShutdown)


# ---- what tune and train say when memory is short (pure) ----------------------------------

def _size(n: Optional[int]) -> str:
    if n is None:
        return "unknown"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def holders(gpu: GpuState, own_pids: Sequence[int] = ()) -> List[str]:
    """Who holds memory on ``gpu``, largest first, this process (and its parents) left out:
    ``pid 4242 python -m ipykernel_launcher ... (10.2 GiB)``, then what no listed process
    accounts for."""
    others = [p for p in gpu.processes if p.pid not in set(own_pids)]
    others.sort(key=lambda p: -(p.used_bytes or 0))
    out = [f"pid {p.pid} {p.name or '(not in this container)'} ({_size(p.used_bytes)})"
           for p in others]
    listed = sum(p.used_bytes or 0 for p in gpu.processes)
    if gpu.memory_used is not None:
        # The driver keeps a few hundred MiB per context of its own; more than 512 MiB
        # unaccounted is another container's or the host's.
        unaccounted = gpu.memory_used - listed
        if unaccounted > 512 * 2**20:
            out.append(f"{_size(unaccounted)} held by processes outside this container's view "
                       "(another container or the host: nvidia-smi there names them)")
    return out


def shortage_line(gpu: GpuState, own_pids: Sequence[int] = (), what: str = "") -> Optional[str]:
    """One line naming who holds GPU memory, or None when nobody else does.  ``what``: the
    start of the line (``train ran out of GPU memory``)."""
    names = holders(gpu, own_pids)
    if not names:
        return None
    head = what or f"GPU {gpu.index} ({gpu.name}) memory is short"
    return (f"{head}: {_size(gpu.memory_free)} of {_size(gpu.memory_total)} free on GPU "
            f"{gpu.index}; held by " + "; ".join(names)
            + ". Free it: shut down idle notebook kernels (Kernel > Shut Down), or keep "
              "TF_FORCE_GPU_ALLOW_GROWTH=true (the image's default) so each process takes only "
              "what it uses")


def is_short(gpu: GpuState, own_pids: Sequence[int] = (), share: float = 0.10) -> bool:
    """Others hold more than ``share`` of the card (the budget is noticeably smaller)."""
    if not gpu.memory_total or gpu.memory_free is None:
        return False
    own = sum(p.used_bytes or 0 for p in gpu.processes if p.pid in set(own_pids))
    return (gpu.memory_total - gpu.memory_free - own) > share * gpu.memory_total


def visible_index(env) -> int:
    """NVML's index of TensorFlow's GPU 0: the first of ``CUDA_VISIBLE_DEVICES`` when it is
    a number (NVML ignores the variable), else 0."""
    first = (env.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def tensorflow_gpu0(reading: Optional[Reading] = None, env=None) -> Optional[GpuState]:
    """TensorFlow's GPU 0 as NVML sees it now, or None (no NVML, no such GPU)."""
    reading = read() if reading is None else reading
    index = visible_index(os.environ if env is None else env)
    return next((g for g in reading.gpus if g.index == index), None)


def shortage_now() -> Optional[str]:
    """The line naming who holds much of TensorFlow's GPU 0 now, or None."""
    gpu = tensorflow_gpu0()
    if gpu is None or not is_short(gpu, own_pids()):
        return None
    return shortage_line(gpu, own_pids())


def own_pids() -> Tuple[int, ...]:
    """This process and its parent (a trial's or a run's launcher holds nothing itself)."""
    return (os.getpid(), os.getppid())


def oom_hint(exc: BaseException, nvml=None) -> Optional[str]:
    """After an out-of-memory error on a GPU: the line naming who else holds its memory, or
    None (not an out-of-memory error, no NVML, nobody else)."""
    text = f"{type(exc).__name__}: {exc}"
    if "ResourceExhausted" not in text and "OOM" not in text and "out of memory" not in text:
        return None
    reading = read(nvml)
    for gpu in reading.gpus:
        line = shortage_line(gpu, own_pids(), what="out of GPU memory")
        if line:
            return line
    return None
