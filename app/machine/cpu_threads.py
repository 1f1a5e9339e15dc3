"""TensorFlow's CPU thread pools as this environment sets them, and the one combination
known to hang: TF 2.9's bfloat16 convolutions on a CPU with AMX with more than one
inter-op thread (docs/image.md, "CPUs with AMX").  The image's entrypoint sets one
inter-op thread there; this names the setting in ``tfmp env`` and warns a run that was
started another way (a host install, a replaced entrypoint)."""
from __future__ import annotations

import os
from typing import Mapping, Optional

INTER_OP = "TF_NUM_INTEROP_THREADS"
INTRA_OP = "TF_NUM_INTRAOP_THREADS"
# Measured hanging on TF 2.9.3 (3 runs in 10); TF 2.21 never hung (8 in 8).  Versions in
# between are not measured: the warning keeps to the versions before 2.10.
_LAST_AFFECTED = (2, 9)


def _threads(environ: Mapping[str, str], name: str) -> Optional[int]:
    """The pool size the variable gives, None for TensorFlow's own choice (unset, empty,
    0 or not a number, which TensorFlow also reads as its default)."""
    try:
        value = int(environ.get(name, "").strip())
    except ValueError:
        return None
    return value if value > 0 else None


def _affected(tf_version: str) -> bool:
    try:
        major, minor = (int(p) for p in tf_version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) <= _LAST_AFFECTED


def state(environ: Mapping[str, str], cpu_amx: bool, gpus: int, tf_version: str) -> dict:
    """``inter_op``/``intra_op``: the sizes set (None: TensorFlow's default, one thread per
    core for the intra-op pool); ``cores``: the cores this process may use; ``amx_hang``:
    whether bfloat16 convolutions can deadlock here as the environment stands."""
    inter = _threads(environ, INTER_OP)
    return {
        "inter_op": inter,
        "intra_op": _threads(environ, INTRA_OP),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "amx_hang": bool(cpu_amx and not gpus and _affected(tf_version) and inter != 1),
    }


def describe(s: dict) -> str:
    def pool(n):
        return str(n) if n else "TensorFlow's default"

    line = (f"inter-op {pool(s['inter_op'])}, intra-op {pool(s['intra_op'])} "
            f"({s['cores']} core(s))")
    if s["amx_hang"]:
        line += "; " + hang_warning()
    return line


def hang_warning(which: str = "") -> str:
    """``which``: the model's convolutions, named in the line (``this model's 'conv2d'``)."""
    which = f" ({which})" if which else ""
    return (f"with more than one inter-op thread TF 2.9's bfloat16 convolutions{which} can "
            f"deadlock on this CPU with AMX: set {INTER_OP}=1 before Python starts (the image's "
            "entrypoint does; docs/image.md, \"CPUs with AMX\")")
