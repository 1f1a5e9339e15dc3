"""Peak memory of this process: TensorFlow's allocator on a GPU, the resident high-water
mark on a CPU.  The recorder (metrics.json) and the tuner's trials read it here."""
from __future__ import annotations

import resource

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
