"""May this process profile the GPU?  TensorFlow's profiler reads the GPU's kernels through
CUPTI, and NVIDIA's driver (since 418.43) lets only administrators use its performance
counters unless the host allows everyone: then CUPTI fails with
CUPTI_ERROR_INSUFFICIENT_PRIVILEGES, deep in TensorFlow's log, and TensorBoard's Profile tab
shows host events only (tensorflow#35860, openxla/xprof#63).

The rule is pure (``refusal``: the driver's parameters, the process' effective capabilities
and user id); ``check()`` reads them.  No TensorFlow here.  Python 3.8 compatible.
"""
from __future__ import annotations

import os
import re
from typing import Optional

CAP_SYS_ADMIN = 21
PARAMS = "/proc/driver/nvidia/params"

FIXES = ("on the host: `options nvidia NVreg_RestrictProfilingToAdminUsers=0` in a file of "
         "/etc/modprobe.d/, then reload the nvidia module (or reboot); or give the process "
         "CAP_SYS_ADMIN: start the container with --cap-add SYS_ADMIN and -e "
         "TFMP_GPU_PROFILING=1 (the image then keeps it for the user tf; docs/image.md, "
         "\"On a GPU box\")")


def admin_only(params_text: Optional[str]) -> Optional[bool]:
    """``RmProfilingAdminOnly: 1`` in the driver's parameters; None when not readable."""
    if params_text is None:
        return None
    m = re.search(r"^RmProfilingAdminOnly:\s*(\d+)", params_text, re.MULTILINE)
    return None if m is None else m.group(1) != "0"


def has_sys_admin(status_text: Optional[str]) -> bool:
    """CAP_SYS_ADMIN among the effective capabilities of a /proc/<pid>/status text."""
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", status_text or "", re.MULTILINE)
    return bool(m) and bool(int(m.group(1), 16) >> CAP_SYS_ADMIN & 1)


def refusal(params_text: Optional[str], status_text: Optional[str], has_gpu: bool) -> Optional[str]:
    """The one line saying the GPU part of a profile will be empty and how to fix it, or None
    (no GPU, profiling open to all, or this process may)."""
    if not has_gpu or not admin_only(params_text) or has_sys_admin(status_text):
        return None
    return ("warning: the profile will have no GPU kernels: the NVIDIA driver lets only "
            "administrators profile the GPU (RmProfilingAdminOnly: 1 in " + PARAMS + "; CUPTI "
            "answers CUPTI_ERROR_INSUFFICIENT_PRIVILEGES) and this process lacks CAP_SYS_ADMIN; "
            "fix: " + FIXES)


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def check(has_gpu: bool) -> Optional[str]:
    return refusal(_read(PARAMS), _read(f"/proc/{os.getpid()}/status"), has_gpu)
