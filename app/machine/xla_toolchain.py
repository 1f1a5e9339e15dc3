"""Can XLA compile for the GPU here (and, without a GPU, the note that ``--jit`` is often
slower on a CPU: ``cpu_note``)?  ``--jit`` on a GPU needs two files of CUDA's compiler
package, which CUDA *runtime* images (TensorFlow's own GPU images among them) leave out:
``libdevice.10.bc`` (the math library XLA links into every kernel) and ``ptxas`` (PTX to the
GPU's machine code).  Without them TensorFlow fails inside the first compiled step with
"libdevice not found at ./libdevice.10.bc" (tensorflow#56927, #58681, #60790).

Where TensorFlow 2.9 looks, mirrored here: for libdevice, ``<root>/nvvm/libdevice/`` under
the directory of ``XLA_FLAGS=--xla_gpu_cuda_data_dir=DIR`` when set, else its CUDA roots (the
build's CUDA path, ``/usr/local/cuda-11.2`` for the 2.9 wheels, then ``/usr/local/cuda``);
for ptxas, ``PATH`` first, then ``<root>/bin``.  The image installs NVIDIA's
``nvidia-cuda-nvcc-cu11`` wheel and links both into ``/usr/local/cuda`` (Dockerfile).

``find()`` is the edge (files, ``ptxas --version``); ``judge()`` and the lines are pure.
No TensorFlow here.  Python 3.8 compatible.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Callable, List, Mapping, Optional, Sequence

LIBDEVICE = "libdevice.10.bc"
FIX = ("the image links them from the nvidia-cuda-nvcc-cu11 wheel into /usr/local/cuda (see "
       "docs/image.md, \"On a GPU box\"); elsewhere: pip install nvidia-cuda-nvcc-cu11, then "
       "XLA_FLAGS=--xla_gpu_cuda_data_dir=<its nvidia/cuda_nvcc folder> and its bin/ on PATH; "
       "or train without --jit")


@dataclass(frozen=True)
class Toolchain:
    libdevice: Optional[str]        # the file found, or None
    ptxas: Optional[str]            # the executable found, or None
    ptxas_version: Optional[str]    # "11.8" from `ptxas --version`; None: it did not answer
    ptxas_error: Optional[str]      # why it did not answer
    searched: tuple                 # the CUDA roots looked in, in order

    @property
    def can_compile(self) -> bool:
        return bool(self.libdevice and self.ptxas and self.ptxas_version)

    def to_dict(self) -> dict:
        return dict(asdict(self), searched=list(self.searched), can_compile=self.can_compile)


def data_dir_flag(xla_flags: str) -> Optional[str]:
    """``--xla_gpu_cuda_data_dir=DIR`` out of an XLA_FLAGS text."""
    m = re.search(r"--xla_gpu_cuda_data_dir=(\S+)", xla_flags or "")
    return m.group(1) if m else None


def cuda_roots(env: Mapping[str, str], tf_cuda_version: Optional[str]) -> List[str]:
    """The folders TensorFlow 2.9 takes as CUDA's root, in its order."""
    flagged = data_dir_flag(env.get("XLA_FLAGS", ""))
    if flagged:
        return [flagged]
    roots = []
    if tf_cuda_version:
        roots.append(f"/usr/local/cuda-{tf_cuda_version}")
    roots.append("/usr/local/cuda")
    return roots


def parse_ptxas_version(text: str) -> Optional[str]:
    """"Cuda compilation tools, release 11.8, V11.8.89" -> "11.8"."""
    m = re.search(r"release (\d+\.\d+)", text or "")
    return m.group(1) if m else None


def _run_version(path: str) -> tuple:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    version = parse_ptxas_version(done.stdout)
    if done.returncode != 0 or version is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        return None, f"`{path} --version` exited {done.returncode}: {tail[0][:200]}"
    return version, None


def find(env: Optional[Mapping[str, str]] = None, tf_cuda_version: Optional[str] = "11.2",
         exists: Callable[[str], bool] = os.path.isfile,
         which: Callable[..., Optional[str]] = shutil.which,
         version: Callable[[str], tuple] = _run_version) -> Toolchain:
    env = os.environ if env is None else env
    roots = cuda_roots(env, tf_cuda_version)
    libdevice = next((p for p in (os.path.join(r, "nvvm", "libdevice", LIBDEVICE) for r in roots)
                      if exists(p)), None)
    ptxas = which("ptxas", path=env.get("PATH", os.defpath))
    if ptxas is None:
        ptxas = next((p for p in (os.path.join(r, "bin", "ptxas") for r in roots)
                      if exists(p) and os.access(p, os.X_OK)), None)
    ver, err = version(ptxas) if ptxas else (None, "not found")
    return Toolchain(libdevice, ptxas, ver, err, tuple(roots))


def problem(tc: Toolchain) -> Optional[str]:
    """What is missing, in words; None when XLA can compile for the GPU."""
    missing = []
    if not tc.libdevice:
        missing.append(f"{LIBDEVICE} not found (looked in "
                       + ", ".join(os.path.join(r, "nvvm", "libdevice") for r in tc.searched) + ")")
    if not tc.ptxas:
        missing.append("ptxas not found (PATH, " + ", ".join(os.path.join(r, "bin")
                                                             for r in tc.searched) + ")")
    elif not tc.ptxas_version:
        missing.append(f"ptxas at {tc.ptxas} does not answer --version ({tc.ptxas_error})")
    return "; ".join(missing) or None


def env_line(tc: Toolchain) -> str:
    """``tfmp env``'s line."""
    if tc.can_compile:
        return (f"XLA on GPU:    can compile (libdevice {tc.libdevice}; ptxas {tc.ptxas_version} "
                f"at {tc.ptxas})")
    return f"XLA on GPU:    cannot compile: {problem(tc)}; fix: {FIX}"


def jit_refusal(tc: Toolchain, gpus: Sequence) -> Optional[str]:
    """--jit with a GPU and no toolchain: the reason (for a UsageError), else None.  On a CPU,
    XLA needs neither file."""
    if not gpus or tc.can_compile:
        return None
    return f"--jit cannot compile for the GPU here: {problem(tc)}"


ALLOWED = "--jit once libdevice and ptxas are there: " + FIX


def from_report(xla: Mapping) -> Toolchain:
    """The toolchain as ``tfmp env --json`` reports it (``xla_gpu``)."""
    return Toolchain(xla.get("libdevice"), xla.get("ptxas"), xla.get("ptxas_version"),
                     xla.get("ptxas_error"), tuple(xla.get("searched") or ()))


def cpu_note(jit: bool, gpus: Sequence) -> Optional[str]:
    """``--jit`` with no GPU: XLA compiles for the CPU, often slower than TensorFlow's own
    kernels (oneDNN's fused matmuls among them), so the run says so once instead of running
    slower without a word.  Measured in the image on a 2-core AMD EPYC with AVX-512: the mlp's
    step 4.6 ms with --jit against 3.5 ms without, the cnn's 19-21 against 9-11
    (docs/numerics-cost-record.md)."""
    if not jit or gpus:
        return None
    return ("--jit without a GPU: XLA's CPU code is often slower than TensorFlow's own "
            "kernels (the built-in models stepped 1.3 to 2 times slower with it on the "
            "test machines' CPUs); compare an epoch's samples/s without --jit")


def check_jit(jit: bool, gpus: Sequence) -> None:
    """``train --jit`` on a GPU needs libdevice and ptxas: one line with the fix before
    training (UsageError), not a C++ error in the first compiled step."""
    if not (jit and gpus):
        return
    import tensorflow as tf

    from app.core.errors import UsageError

    try:
        cuda = dict(tf.sysconfig.get_build_info()).get("cuda_version")
    except Exception:
        cuda = None
    refusal = jit_refusal(find(tf_cuda_version=cuda or "11.2"), gpus)
    if refusal:
        raise UsageError(refusal, ALLOWED)
