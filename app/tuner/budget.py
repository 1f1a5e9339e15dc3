"""How much memory a trial may use: ``--memory-budget auto | SIZE``.

``parse_size`` reads ``2GiB``, ``1500MiB``, ``2g`` (Docker's binary units), ``2GB``
(decimal) or plain bytes.  ``auto`` is, on a GPU, the memory free on GPU 0 when the tune starts (NVML), at most what
TensorFlow can use there;
on a CPU, what is free for a trial when the tune starts: under a container's memory limit,
the limit less what the container uses already (Jupyter, kernels, this tune's own process),
at each level of the cgroup path that has a limit (cgroup v2 ``memory.max`` less
``memory.current``, v1 ``memory.limit_in_bytes`` less ``memory.usage_in_bytes``; the page
cache, ``active_file`` and ``inactive_file`` in ``memory.stat``, counts as free: the kernel
reclaims it before its out-of-memory killer acts, as ``MemAvailable`` counts it), and never
more than ``MemAvailable``; without a limit, ``MemAvailable``.
A budget of the bare limit would let a trial grow until the kernel's out-of-memory killer
ends the biggest process in the container, which may be the user's notebook kernel, before
the tuner's watchdog stops the trial.  The parsers are pure (tests give them text);
``_read_text`` is the edge that reads ``/proc`` and ``/sys``; the readers of ``/proc/meminfo`` and
the cgroup files are ``app.machine.memory``'s.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from app.core.errors import UsageError
from app.machine.memory import (cgroup_free, format_size, parse_meminfo_available,
                                read_text as _read_text)

SIZE_FORMS = "auto, or a size such as 2GiB, 1500MiB, 2g (binary units), 2GB (decimal) or bytes"
MIN_BUDGET = 64 * 2**20

_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kib": 2**10, "kb": 10**3,
    "m": 2**20, "mib": 2**20, "mb": 10**6,
    "g": 2**30, "gib": 2**30, "gb": 10**9,
    "t": 2**40, "tib": 2**40, "tb": 10**12,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


@dataclass(frozen=True)
class Budget:
    bytes: int
    source: str          # where the number came from, in words (tune.json, the console)

    def to_dict(self) -> dict:
        return {"bytes": self.bytes, "source": self.source}


def parse_size(text: str, what: str = "memory_budget") -> int:
    """``2GiB`` -> 2147483648.  UsageError for anything that is not a positive size."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise UsageError(f"{what} is not a size. Received: {what}={text!r}", SIZE_FORMS)
    value = int(float(m.group(1)) * _UNITS[unit])
    if value < MIN_BUDGET:
        raise UsageError(f"{what} {text!r} is below {MIN_BUDGET // 2**20} MiB, too little to "
                         "run TensorFlow at all", SIZE_FORMS)
    return value


# ---- the edge ---------------------------------------------------------------------------

def cpu_auto_budget(read: Callable[[str], Optional[str]] = _read_text) -> Budget:
    """What is free now: under the container's memory limit (its limit less what it uses),
    capped by the machine's available memory; without a limit, the memory available."""
    free = cgroup_free(read("/proc/self/cgroup") or "", read)
    available = parse_meminfo_available(read("/proc/meminfo") or "")
    if free is not None:
        under = (f"container memory limit {format_size(free.limit)} less "
                 f"{format_size(free.used)} in use ({free.path})")
        if available is not None and available < free.free:
            return Budget(available, f"memory available when the tune started (/proc/meminfo), "
                                     f"less than the {under}")
        if free.free < MIN_BUDGET:
            raise UsageError(f"--memory-budget auto: the container has "
                             f"{format_size(free.free)} free (memory limit "
                             f"{format_size(free.limit)}, {format_size(free.used)} in use), "
                             "too little to run TensorFlow",
                             "free memory in the container (stop idle notebook kernels), or "
                             "--memory-budget SIZE")
        return Budget(free.free, under)
    if available is not None:
        return Budget(available, "memory available when the tune started (/proc/meminfo)")
    raise UsageError("--memory-budget auto found no container limit and cannot read "
                     "/proc/meminfo", "--memory-budget SIZE, e.g. 4GiB")


def gpu_auto_budget(usable: int, gpu=None, holders: Sequence[str] = ()) -> Budget:
    """``auto`` on a GPU: what is free on it now (NVML's ``memory_free`` of
    ``app.machine.nvml.GpuState``), never more than TensorFlow can use there (``usable``).
    A notebook kernel that holds most of the card leaves a small budget, said with who holds
    it (``holders``), instead of a budget of memory that is not there."""
    if gpu is None or gpu.memory_free is None:
        return Budget(int(usable), "memory TensorFlow can use on GPU 0 (NVML not available: "
                                   "memory other processes hold is not subtracted)")
    free = int(gpu.memory_free)
    if free < MIN_BUDGET:
        raise UsageError(f"--memory-budget auto: GPU 0 has {format_size(free)} free of "
                         f"{format_size(gpu.memory_total)}"
                         + (f" (held by {'; '.join(holders)})" if holders else ""),
                         "free GPU memory (shut down idle notebook kernels), or "
                         "--memory-budget SIZE")
    if free < usable:
        return Budget(free, f"memory free on GPU 0 when the tune started (NVML: "
                            f"{format_size(free)} of {format_size(gpu.memory_total)})")
    return Budget(int(usable), "memory TensorFlow can use on GPU 0 (all free when the tune "
                               "started)")


def resolve(text: Optional[str], gpu_memory_bytes: Optional[int],
            cpu_auto: Callable[[], Budget] = cpu_auto_budget,
            gpu_auto: Optional[Callable[[int], Budget]] = None) -> Budget:
    """``--memory-budget``: an explicit size wins; ``auto`` is, on a GPU, the memory free on
    it (``gpu_auto``, default: TensorFlow's usable memory), else the CPU's budget."""
    if text is None or str(text).strip().lower() == "auto":
        if gpu_memory_bytes:
            if gpu_auto is not None:
                return gpu_auto(int(gpu_memory_bytes))
            return Budget(int(gpu_memory_bytes), "memory TensorFlow can use on GPU 0")
        return cpu_auto()
    return Budget(parse_size(text), "--memory-budget")


def resolve_with_gpu(text: Optional[str], gpus: Sequence[dict], notes: List[str]) -> Budget:
    """``resolve`` for a tune: on a GPU, ``auto`` from what NVML says is free on GPU 0 now
    (the first of CUDA_VISIBLE_DEVICES), and a note in ``notes`` naming who holds the
    memory when others hold much of it."""
    if not gpus:
        budget = resolve(text, None)
        if _is_explicit(text):
            try:
                _note_beyond(budget, cpu_auto_budget(), notes)
            except UsageError:   # nothing to compare with: the size given stands
                pass
        return budget
    from app.machine import nvml

    gpu_now, own = nvml.tensorflow_gpu0(), nvml.own_pids()
    budget = resolve(text, gpus[0].get("memory_bytes"), gpu_auto=lambda usable: gpu_auto_budget(
        usable, gpu_now, nvml.holders(gpu_now, own) if gpu_now else ()))
    if gpu_now is not None and nvml.is_short(gpu_now, own):
        notes.append(nvml.shortage_line(gpu_now, own) or "")
    if _is_explicit(text) and gpus[0].get("memory_bytes"):
        _note_beyond(budget, Budget(int(gpus[0]["memory_bytes"]),
                                    "memory TensorFlow can use on GPU 0"), notes)
    return budget


def _is_explicit(text: Optional[str]) -> bool:
    return text is not None and str(text).strip().lower() != "auto"


def _note_beyond(budget: Budget, there: Budget, notes: List[str]) -> None:
    """A size given that is more than the machine has: the tune still honours it, and says
    that the machine, not the budget, will stop the largest trials."""
    if budget.bytes > there.bytes:
        notes.append(f"--memory-budget {format_size(budget.bytes)} is more than "
                     f"{format_size(there.bytes)}, the {there.source}: trials are planned up to "
                     f"the budget, so one that outgrows {format_size(there.bytes)} runs out "
                     "of memory instead of being kept out by it; --memory-budget auto uses "
                     "what is there")
