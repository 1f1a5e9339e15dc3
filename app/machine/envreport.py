"""The environment report: ``tfmp env``, metrics.json and the benchmark all use ``collect()``."""
from __future__ import annotations

import platform
import sys


def collect(hardware=None) -> dict:
    import numpy as np
    import tensorflow as tf

    from app.machine import gpu_problems
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
        "executable": sys.executable,
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
    lines.append(f"auto precision: {r['auto_precision']['policy']} ({r['auto_precision']['reason']})")
    if "gpu_problems" in r:
        from app.machine.gpu_problems import format_problems

        lines += ["GPU problems:"] + (format_problems(r["gpu_problems"]) or ["  none"])
    return "\n".join(lines)
