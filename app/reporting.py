"""Writing outputs safely: every file goes to a temporary name first, then os.replace."""
from __future__ import annotations

import json
import os
import resource
import tempfile


def write_json_atomic(path: str, data) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=False, default=_jsonable)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _jsonable(obj):
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def peak_memory() -> dict:
    """Peak device memory on a GPU (TensorFlow's allocator), else the process' peak RSS."""
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        try:
            return {"kind": "gpu", "bytes": int(tf.config.experimental.get_memory_info("GPU:0")["peak"])}
        except Exception:  # pragma: no cover - GPU only
            pass
    # ru_maxrss is in KiB on Linux
    return {"kind": "cpu_rss", "bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
