"""Peak memory of this process: TensorFlow's allocator on a GPU, the resident high-water
mark on a CPU.  The recorder (metrics.json) and the tuner's trials read it here.  And what
is free: ``MemAvailable`` and a container's cgroup limits (the tuner's ``--memory-budget
auto``, the image folder's cache)."""
from __future__ import annotations

import os
import re
import resource
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

# VmHWM is the peak resident set; ru_maxrss (KiB on Linux) where /proc is missing.
_PROC_STATUS = "/proc/self/status"


def cpu_peak_bytes() -> int:
    """The process' peak resident memory."""
    try:
        with open(_PROC_STATUS, encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def peak_memory() -> dict:
    """``{"kind": "gpu" | "cpu_rss", "bytes": N}``: the first GPU's peak when TensorFlow has
    one, else the process' peak resident memory."""
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        try:
            return {"kind": "gpu",
                    "bytes": int(tf.config.experimental.get_memory_info("GPU:0")["peak"])}
        except Exception:  # pragma: no cover - GPU only
            pass
    return {"kind": "cpu_rss", "bytes": cpu_peak_bytes()}


def format_size(n: Optional[float]) -> str:
    if n is None:
        return "-"
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:,.0f} MiB"


# ---- what is free (pure parsers; the tuner's --memory-budget and the image cache read them) --

# cgroup v1 reports "no limit" as a huge page-aligned number (2**63 - 4096 on x86-64).
_V1_UNLIMITED = 2**60


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


def parse_counter(text: Optional[str]) -> Optional[int]:
    """A ``memory.current`` / ``memory.usage_in_bytes`` value; None when unreadable."""
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def parse_stat(text: Optional[str], key: str) -> int:
    """One field of a ``memory.stat`` (0 when missing)."""
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


@dataclass(frozen=True)
class CgroupFree:
    free: int          # limit - in use, at the level where that is smallest
    limit: int
    used: int          # usage less the page cache the kernel can reclaim
    path: str          # the limit's file


def _levels(proc_self_cgroup: str, root: str):
    """(version, folder) of every cgroup level on this process' path, deepest first."""
    v2, v1 = cgroup_paths(proc_self_cgroup)
    if v2 is not None:
        for rel in _ancestors(v2):
            yield 2, os.path.join(root, rel.lstrip("/"))
    if v1 is not None:
        for rel in _ancestors(v1):
            yield 1, os.path.join(root, "memory", rel.lstrip("/"))


# (limit, usage, the memory.stat fields of page cache the kernel reclaims before it kills)
_FILES = {2: ("memory.max", "memory.current", ("active_file", "inactive_file")),
          1: ("memory.limit_in_bytes", "memory.usage_in_bytes",
              ("total_active_file", "total_inactive_file"))}


def cgroup_free(proc_self_cgroup: str, read: Callable[[str], Optional[str]],
                root: str = "/sys/fs/cgroup") -> Optional[CgroupFree]:
    """What is left under the memory limits on this process' cgroup path: at each level with a
    limit, the limit less its working set; the smallest.  None when no level has a limit.  A
    level whose usage cannot be read counts as using nothing (its limit is the answer).
    ``read(path)`` returns a file's text or None.

    Inside a container the cgroup file system is usually mounted at the container's own
    cgroup, so the path from /proc/self/cgroup may not exist below ``root``: the mount's top
    is tried as well (``_levels``)."""
    found: List[CgroupFree] = []
    for version, folder in _levels(proc_self_cgroup, root):
        limit_name, usage_name, cache_keys = _FILES[version]
        path = os.path.join(folder, limit_name)
        limit = parse_limit(read(path), version)
        if limit is None:
            continue
        usage = parse_counter(read(os.path.join(folder, usage_name))) or 0
        stat = read(os.path.join(folder, "memory.stat"))
        cache = sum(parse_stat(stat, key) for key in cache_keys)
        used = max(0, usage - min(cache, usage))
        found.append(CgroupFree(max(0, limit - used), limit, used, path))
    return min(found, key=lambda f: f.free) if found else None


def read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def available_bytes(read: Callable[[str], Optional[str]] = read_text) -> Optional[int]:
    """The memory this process can still fill: ``MemAvailable``, less where a container's
    limit leaves less (``cgroup_free``); None when neither can be read."""
    found = [n for n in (parse_meminfo_available(read("/proc/meminfo") or ""),
                         getattr(cgroup_free(read("/proc/self/cgroup") or "", read), "free", None))
             if n is not None]
    return min(found) if found else None
