"""What hardware TensorFlow can use.

Two halves: a pure part (dataclasses and parsers that tests feed with fake descriptions)
and an edge, ``detect()``, that asks TensorFlow and ``/proc/cpuinfo``.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Iterable

# Turing parts without Tensor Cores.  They report compute capability 7.5 like a T4, so
# the capability alone would wrongly promise a mixed_float16 speed-up.
_NO_TENSOR_CORE_PATTERNS = (
    re.compile(r"\bGTX\s*16\d\d", re.IGNORECASE),  # GTX 1650 / 1660 (Ti, SUPER)
    re.compile(r"\bTU11[67]\b", re.IGNORECASE),
    re.compile(r"\bMX\s*\d{3}", re.IGNORECASE),     # laptop MX parts
)

CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: tuple[int, int] | None
    memory_bytes: int | None = None
    tensor_cores: bool = False


@dataclass(frozen=True)
class HardwareInfo:
    gpus: list[GpuInfo] = field(default_factory=list)
    cpu_flags: frozenset[str] = frozenset()

    @property
    def cpu_bf16(self) -> bool:
        """The CPU has native bfloat16 math (AVX512_BF16 or AMX)."""
        return "avx512_bf16" in self.cpu_flags or self.cpu_amx

    @property
    def cpu_amx(self) -> bool:
        return "amx_bf16" in self.cpu_flags or "amx_tile" in self.cpu_flags

    def to_dict(self) -> dict:
        return {
            "gpus": [{**asdict(g), "compute_capability": list(g.compute_capability)
                      if g.compute_capability else None} for g in self.gpus],
            "cpu_avx512_bf16": "avx512_bf16" in self.cpu_flags,
            "cpu_amx": self.cpu_amx,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "HardwareInfo":
        """The inverse of ``to_dict`` (e.g. from ``tfmp env --json``)."""
        gpus = [make_gpu(g.get("name", "GPU"), g.get("compute_capability"), g.get("memory_bytes"))
                for g in d.get("gpus") or []]
        flags = set()
        if d.get("cpu_avx512_bf16"):
            flags.add("avx512_bf16")
        if d.get("cpu_amx"):
            flags.update({"amx_bf16", "amx_tile"})
        return cls(gpus=gpus, cpu_flags=frozenset(flags))


def has_tensor_cores(name: str, compute_capability: tuple[int, int] | None) -> bool:
    """Volta (7.0) and newer have Tensor Cores, except the Turing GTX 16xx / TU116 / TU117 parts."""
    if compute_capability is None or tuple(compute_capability) < (7, 0):
        return False
    return not any(p.search(name or "") for p in _NO_TENSOR_CORE_PATTERNS)


def make_gpu(name: str, compute_capability: Iterable[int] | None,
             memory_bytes: int | None = None) -> GpuInfo:
    cc = tuple(int(v) for v in compute_capability) if compute_capability else None
    return GpuInfo(name=name, compute_capability=cc, memory_bytes=memory_bytes,
                   tensor_cores=has_tensor_cores(name, cc))


def parse_cpuinfo_flags(text: str) -> frozenset[str]:
    """The flags of the first processor in a /proc/cpuinfo text."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


# ---- edge: asks the machine -------------------------------------------------------------

def read_cpu_flags() -> frozenset[str]:
    """This machine's CPU flags (empty where /proc/cpuinfo cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            return parse_cpuinfo_flags(fh.read())
    except OSError:
        return frozenset()


def _gpu_memory_limits() -> list[int]:
    # Total memory is not in get_device_details; the local device list knows the limit
    # TensorFlow would use.  Best effort only: it creates the GPU contexts.
    try:
        from tensorflow.python.client import device_lib  # noqa: internal but stable since 1.x

        return [int(d.memory_limit) for d in device_lib.list_local_devices()
                if d.device_type == "GPU"]
    except Exception:  # pragma: no cover - GPU only
        return []


def detect() -> HardwareInfo:
    import tensorflow as tf

    gpus = []
    physical = tf.config.list_physical_devices("GPU")
    limits = _gpu_memory_limits() if physical else []
    for i, dev in enumerate(physical):
        try:
            details = tf.config.experimental.get_device_details(dev)
        except Exception:  # pragma: no cover - GPU only
            details = {}
        gpus.append(make_gpu(details.get("device_name", dev.name),
                             details.get("compute_capability"),
                             limits[i] if i < len(limits) else None))
    return HardwareInfo(gpus=gpus, cpu_flags=read_cpu_flags())


# ---- TensorFloat-32 ------------------------------------------------------------------------

TF32_MIN_CC = (8, 0)


def tf32_capable(gpus: Iterable[GpuInfo]) -> bool:
    """Some GPU has TF32 Tensor Cores (Ampere, compute capability 8.0, and newer)."""
    return any(g.compute_capability is not None and tuple(g.compute_capability) >= TF32_MIN_CC
               for g in gpus)


def tf32_state(gpus: Iterable[GpuInfo], enabled: bool) -> dict:
    """Whether float32 matmuls and convolutions ran on TF32 Tensor Cores: TensorFlow's switch
    (``tf.config.experimental.tensor_float_32_execution_enabled()``, on by default since TF
    2.4) and a GPU that has them.  metrics.json and benchmark.json record it."""
    capable = tf32_capable(list(gpus))
    if not capable:
        why = "no GPU of compute capability 8.0+ (TF32 Tensor Cores start with Ampere)"
    elif enabled:
        why = ("TensorFlow's default on compute capability 8.0+: float32 matmuls and "
               "convolutions round their inputs to 10 mantissa bits")
    else:
        why = "turned off (--tf32 off): strict float32"
    return {"on": bool(capable and enabled), "enabled": bool(enabled), "gpu_capable": capable,
            "why": why}


def read_tf32_enabled() -> bool:
    import tensorflow as tf

    try:
        return bool(tf.config.experimental.tensor_float_32_execution_enabled())
    except AttributeError:   # before TF 2.4: no TF32
        return False
