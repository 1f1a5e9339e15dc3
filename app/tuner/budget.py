"""How much memory a trial may use: ``--memory-budget auto | SIZE``.

``parse_size`` reads ``2GiB``, ``1500MiB``, ``2g`` (Docker's binary units), ``2GB``
(decimal) or plain bytes.  ``auto`` is, on a GPU, the memory TensorFlow can use on GPU 0;
on a CPU, the memory limit of the container (cgroup v2 ``memory.max`` or cgroup v1
``memory.limit_in_bytes``, the smallest along the path to the root) or else
``MemAvailable`` when the tune starts.  The parsers are pure (tests give them text); the
two ``read_*`` functions are the edge that reads ``/proc`` and ``/sys``.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from app.core.errors import UsageError

SIZE_FORMS = "auto, or a size such as 2GiB, 1500MiB, 2g (binary units), 2GB (decimal) or bytes"
MIN_BUDGET = 64 * 2**20
# cgroup v1 reports "no limit" as a huge page-aligned number (2**63 - 4096 on x86-64).
_V1_UNLIMITED = 2**60

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


def format_size(n: Optional[float]) -> str:
    if n is None:
        return "-"
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:,.0f} MiB"


# ---- parsers (pure) -----------------------------------------------------------------------

def parse_meminfo_available(text: str) -> Optional[int]:
    m = re.search(r"^MemAvailable:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def cgroup_paths(proc_self_cgroup: str) -> Tuple[Optional[str], Optional[str]]:
    """(cgroup v2 path, cgroup v1 memory controller path) of this process."""
    v2 = v1 = None
    for line in proc_self_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _ancestors(path: str) -> List[str]:
    """``/a/b`` -> ["/a/b", "/a", "/"]: a parent's limit binds its children too."""
    out, p = [], "/" + path.strip("/")
    while True:
        out.append(p)
        if p == "/":
            return out
        p = os.path.dirname(p)


def parse_limit(text: Optional[str], version: int) -> Optional[int]:
    """A ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1) value; None = no limit."""
    if text is None:
        return None
    text = text.strip()
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    if version == 1 and value >= _V1_UNLIMITED:
        return None
    return value


def cgroup_limit(proc_self_cgroup: str, read: Callable[[str], Optional[str]],
                 root: str = "/sys/fs/cgroup") -> Optional[Tuple[int, str]]:
    """The tightest memory limit on this process' cgroup and its ancestors, with the file
    it came from; None when there is none.  ``read(path)`` returns a file's text or None.

    Inside a container the cgroup file system is usually mounted at the container's own
    cgroup, so the path from /proc/self/cgroup may not exist below ``root``: the mount's top
    is tried as well."""
    v2, v1 = cgroup_paths(proc_self_cgroup)
    found: List[Tuple[int, str]] = []
    if v2 is not None:
        for rel in _ancestors(v2):
            path = os.path.join(root, rel.lstrip("/"), "memory.max")
            limit = parse_limit(read(path), 2)
            if limit is not None:
                found.append((limit, path))
    if v1 is not None:
        base = os.path.join(root, "memory")
        for rel in _ancestors(v1):
            path = os.path.join(base, rel.lstrip("/"), "memory.limit_in_bytes")
            limit = parse_limit(read(path), 1)
            if limit is not None:
                found.append((limit, path))
    return min(found) if found else None


# ---- the edge ---------------------------------------------------------------------------

def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def cpu_auto_budget(read: Callable[[str], Optional[str]] = _read_text) -> Budget:
    """The container's memory limit, else the memory available now."""
    limit = cgroup_limit(read("/proc/self/cgroup") or "", read)
    available = parse_meminfo_available(read("/proc/meminfo") or "")
    if limit is not None:
        return Budget(limit[0], f"container memory limit ({limit[1]})")
    if available is not None:
        return Budget(available, "memory available when the tune started (/proc/meminfo)")
    raise UsageError("--memory-budget auto found no container limit and cannot read "
                     "/proc/meminfo", "--memory-budget SIZE, e.g. 4GiB")


def resolve(text: Optional[str], gpu_memory_bytes: Optional[int],
            cpu_auto: Callable[[], Budget] = cpu_auto_budget) -> Budget:
    """``--memory-budget``: an explicit size wins; ``auto`` is the GPU's memory when there is
    a GPU, else the CPU's budget."""
    if text is None or str(text).strip().lower() == "auto":
        if gpu_memory_bytes:
            return Budget(int(gpu_memory_bytes), "memory TensorFlow can use on GPU 0")
        return cpu_auto()
    return Budget(parse_size(text), "--memory-budget")
