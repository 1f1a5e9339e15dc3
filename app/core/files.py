"""Writing outputs safely: every file goes to a temporary name first, then os.replace."""
from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone

from app.core import folders


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename.

    A crash or a signal mid-write leaves the old file (or none), never half a file.  The
    folder is created if missing; the file gets the usual umask-based mode (mkstemp's
    0600 would hide outputs from the other users of a shared workspace).
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        os.chmod(tmp, 0o666 & ~folders.current_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def json_text(data) -> str:
    """``data`` as the indented JSON every file of ours holds (numpy scalars as numbers)."""
    return json.dumps(data, indent=2, sort_keys=False, default=_jsonable) + "\n"


def write_json_atomic(path: str, data) -> None:
    write_atomic(path, json_text(data))


def utc_now_iso() -> str:
    """The time stamps inside metrics.json and benchmark.json."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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


def finite_or_none(v):
    """A number as a float, None when it is missing, not a scalar, or not finite (JSON has
    no NaN/inf)."""
    import numpy as np

    if v is None:
        return None
    try:
        v = float(np.asarray(v))
    except (TypeError, ValueError):  # a metric with a non-scalar result
        return None
    return v if np.isfinite(v) else None


def fmt(v, spec=".4f") -> str:
    """A console number; ``nan/inf`` for what ``finite_or_none`` made None."""
    return "nan/inf" if v is None else format(v, spec)
