"""The environment report: ``tfmp env``, metrics.json and the benchmark all use ``collect()``."""
from __future__ import annotations

import os
import platform
import sys


def collect(hardware=None, probe: bool = False) -> dict:
    """The report.  ``probe``: also run ``app.machine.kernels``' probe (``tfmp env`` does; a
    training run records what its own checks already probed)."""
    import numpy as np
    import tensorflow as tf

    from app.machine import cpu_threads
    from app.machine import gpu_problems
    from app.machine import kernels
    from app.machine import xla_toolchain
    from app.machine import hardware as hw_mod
    from app.precision.keras_version import KERAS_MAJOR
    from app.precision.policy import choose_policy

    hw = hardware or hw_mod.detect()
    try:
        build = dict(tf.sysconfig.get_build_info())
    except Exception:  # very old or stripped builds
        build = {}
    auto = choose_policy(hw)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "tensorflow": tf.__version__,
        "keras": str(getattr(tf.keras, "__version__", "unknown")),
        "keras_major": KERAS_MAJOR,
        "numpy": np.__version__,
        "built_with_cuda": bool(build.get("is_cuda_build", False)),
        "cuda_version": build.get("cuda_version"),
        "cudnn_version": build.get("cudnn_version"),
        "hardware": hw.to_dict(),
        "auto_precision": {"policy": auto.policy, "reason": auto.reason},
        # TensorFlow's CPU pools as TF_NUM_INTEROP/INTRAOP_THREADS set them (app.machine.cpu_threads).
        "cpu_threads": cpu_threads.state(os.environ, hw.cpu_amx, len(hw.gpus), tf.__version__),
        # Which layer kinds each probed policy runs here (app.machine.kernels), and why not.
        "precision_support": {p: s.to_dict() for p, s in kernels.supports(probe, hw).items()},
        "executable": sys.executable,
        # float32 on TF32 Tensor Cores (compute capability 8.0+, TensorFlow's default).
        "tf32": hw_mod.tf32_state(hw.gpus, hw_mod.read_tf32_enabled()),
        # libdevice and ptxas: what --jit needs on a GPU (app.machine.xla_toolchain).
        "xla_gpu": xla_toolchain.find(tf_cuda_version=build.get("cuda_version")
                                      or "11.2").to_dict(),
        # Why no GPU (or no fast one), most fundamental first; [] on a working GPU box.
        "gpu_problems": gpu_problems.problems_here(tf=tf, tf_gpus=hw.gpus),
    }


def _gib(n) -> str:
    return f"{n / 2**30:.1f} GiB" if n else "unknown"


def format_text(r: dict) -> str:
    lines = [
        f"Python:        {r['python']} ({r['platform']})",
        f"TensorFlow:    {r['tensorflow']}",
        f"Keras:         {r['keras']} (Keras {r['keras_major']})",
        f"NumPy:         {r['numpy']}",
        f"CUDA build:    {'yes' if r['built_with_cuda'] else 'no'}"
        f" (CUDA {r['cuda_version'] or '-'}, cuDNN {r['cudnn_version'] or '-'})",
    ]
    gpus = r["hardware"]["gpus"]
    if not gpus:
        lines.append("GPUs:          none visible to TensorFlow")
    for i, g in enumerate(gpus):
        cc = ".".join(map(str, g["compute_capability"])) if g["compute_capability"] else "unknown"
        lines.append(f"GPU {i}:         {g['name']}, compute capability {cc}, memory "
                     f"{_gib(g['memory_bytes'])}, Tensor Cores {'yes' if g['tensor_cores'] else 'no'}")
    lines.append(f"CPU bfloat16:  AVX512_BF16 {'yes' if r['hardware']['cpu_avx512_bf16'] else 'no'}, "
                 f"AMX {'yes' if r['hardware']['cpu_amx'] else 'no'}")
    auto = r["auto_precision"]
    line = f"auto precision: {auto['policy']} ({auto['reason']})"
    if (r.get("precision_support") or {}).get(auto["policy"], {}).get("causes"):
        # As train decides (app.training.runnable.runnable_by_kinds): the mlp keeps it, a convolution not.
        line += ("; a model with a layer it cannot run here (below) trains in float32, as "
                 "does a model of your own while oneDNN is off")
    lines.append(line)
    if r.get("cpu_threads"):
        from app.machine.cpu_threads import describe

        lines.append(f"CPU threads:   {describe(r['cpu_threads'])}")
    if r.get("tf32"):
        lines.append(f"TF32:          {'on' if r['tf32']['on'] else 'off'} ({r['tf32']['why']})")
    if r.get("xla_gpu"):
        from app.machine import xla_toolchain

        x = dict(r["xla_gpu"])
        x.pop("can_compile", None)
        x["searched"] = tuple(x.get("searched") or ())
        lines.append(xla_toolchain.env_line(xla_toolchain.Toolchain(**x)))
    for policy, sup in (r.get("precision_support") or {}).items():
        lines += support_lines(policy, sup)
    if "gpu_problems" in r:
        from app.machine.gpu_problems import format_problems

        lines += ["GPU problems:"] + (format_problems(r["gpu_problems"]) or ["  none"])
    return "\n".join(lines)


def support_lines(policy: str, sup: dict) -> list:
    """``tfmp env``'s lines for one probed policy: the kinds that run, those that cannot
    and why (one line per cause), and oneDNN's state where it matters (TF 2.9 on a CPU)."""
    how = "probed" if sup.get("probed") else "not probed: it would crash here"
    lines = []
    if sup.get("onednn") is not None:
        lines.append(f"oneDNN:        {'on' if sup['onednn']['on'] else 'off'} "
                     f"({sup['onednn']['why']})")
    runs = ", ".join(sup.get("runs") or []) or "none"
    lines.append(f"{policy}: runs {runs} ({how})")
    for cause in sup.get("causes") or []:
        lines.append(f"  cannot run {', '.join(cause['kinds'])}: {cause['why']}; "
                     f"works: {cause['allowed']}")
    return lines
