"""Which dtype policy to train with, and applying it.

``choose_policy`` is a pure function of a ``HardwareInfo`` so the decision table can be
tested with fake hardware.  ``apply_policy`` is the only place that sets the global policy
(and, under mixed_float16 on a CPU, turns off the one graph fusion that makes it slow).
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from app.core.errors import UsageError
from app.core.catalog import POLICIES, PRECISIONS as CHOICES, fast_policy  # noqa: F401  (re-exported)

if TYPE_CHECKING:  # the precision rules read a description; app.machine makes it
    from app.machine.hardware import HardwareInfo

# Measured on the development CPU with TF 2.9.3 (MLP, batch 128): float32 ~27k samples/s,
# mixed_bfloat16 ~31k, mixed_float16 ~0.4k.  CPUs have no fast float16 kernels.
CPU_FP16_SLOWDOWN = "about 60 times slower than float32"


# cuBLAS and cuDNN run 16-bit matrix math on Tensor Cores in tiles of 8: a width or batch
# size that is not a multiple falls back to slower kernels or is padded.
TENSOR_CORE_MULTIPLE = 8


def off_tensor_core_tiles(n) -> bool:
    """``n`` (a width, a filter count, a batch size) is not a multiple of the tile."""
    return n is not None and int(n) % TENSOR_CORE_MULTIPLE != 0


def round_to_tiles(n: int) -> int:
    """The nearest multiple of the tile (at least one tile)."""
    m = TENSOR_CORE_MULTIPLE
    return max(m, int(round(int(n) / m)) * m)


def pad_to_tiles(n: int) -> int:
    """The next multiple of the tile at or above ``n``: what a size that can only grow (a
    vocabulary padded with unused rows) is padded to."""
    m = TENSOR_CORE_MULTIPLE
    return max(m, -(-int(n) // m) * m)


@dataclass(frozen=True)
class PrecisionDecision:
    policy: str
    reason: str
    requested: str = "auto"
    warning: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def choose_policy(hw: HardwareInfo) -> PrecisionDecision:
    """The auto decision (``app.core.catalog.fast_policy``) and why, in words."""
    policy = fast_policy(hw)
    if hw.gpus:
        gpu = hw.gpus[0]
        cc = ".".join(map(str, gpu.compute_capability)) if gpu.compute_capability else "unknown"
        tc = [g for g in hw.gpus if g.tensor_cores]
        if policy == "mixed_float16":
            return PrecisionDecision(policy,
                                     f"GPU {gpu.name} (compute capability {cc}) has Tensor Cores")
        if tc:
            return PrecisionDecision("float32",
                                     "not every visible GPU has Tensor Cores; float16 would be "
                                     "slow on the ones without")
        why = ("compute capability below 7.0" if (gpu.compute_capability or (0, 0)) < (7, 0)
               else "a Turing GTX 16xx/TU116/TU117 part")
        return PrecisionDecision("float32",
                                 f"GPU {gpu.name} (compute capability {cc}) has no Tensor Cores "
                                 f"({why}); float16 would not be faster")
    if policy == "mixed_bfloat16":
        feature = "AMX" if hw.cpu_amx else "AVX512_BF16"
        return PrecisionDecision("mixed_bfloat16",
                                 f"no GPU; the CPU has {feature}, so bfloat16 math is native")
    return PrecisionDecision("float32", "no GPU and no CPU bfloat16 support (AVX512_BF16/AMX)")


def slow_fp16_warning(hw: HardwareInfo) -> str | None:
    """Why mixed_float16 will be slow here, or None when it should pay off."""
    if not hw.gpus:
        return ("mixed_float16 on a CPU is very slow: CPUs have no fast float16 kernels "
                f"(measured here with TF 2.9.3: {CPU_FP16_SLOWDOWN}). "
                "Use mixed_bfloat16 on a CPU with AVX512_BF16/AMX, or float32.")
    no_tc = [g.name for g in hw.gpus if not g.tensor_cores]
    if no_tc:
        return (f"mixed_float16 on {', '.join(no_tc)} will not be faster: no Tensor Cores "
                "(needs compute capability 7.0+ and not a GTX 16xx/TU116/TU117). Use float32.")
    return None


def validate_name(requested: str) -> str:
    if requested not in CHOICES:
        raise UsageError(f"precision must be one of {', '.join(CHOICES)}. "
                         f"Received: precision={requested!r}",
                         ", ".join(CHOICES))
    return requested


def parse_names(value, name: str, choices=CHOICES):
    """A comma-separated list (or a sequence) of policy names from ``choices``, as
    ``tfmp tune --precision`` and ``tfmp benchmark --policies`` take them; None stays None
    (the command's default)."""
    if value is None:
        return None
    # A trailing comma is a list written item by item; "a,,b" may have lost a name.
    items = value.strip().rstrip(",").split(",") if isinstance(value, str) else value
    names = [str(n).strip() for n in items]
    if not names or any(n not in choices for n in names):
        raise UsageError(f"{name} must be a comma-separated list of {', '.join(choices)}. "
                         f"Received: {name}={value!r}", ", ".join(choices))
    return names


def resolve(requested: str, hw: HardwareInfo) -> PrecisionDecision:
    validate_name(requested)
    if requested == "auto":
        return choose_policy(hw)
    warning = slow_fp16_warning(hw) if requested == "mixed_float16" else None
    return PrecisionDecision(requested, "requested explicitly", requested=requested,
                             warning=warning)


def announce(decision: PrecisionDecision, stream=None) -> None:
    """One line saying what was chosen and why, on ``stream`` (stdout: with the run's other
    lines of what it is, the strategy and the batch); a loud block on stderr for a slow fp16
    request."""
    stream = stream or sys.stdout
    if decision.requested == "auto":
        print(f"precision: auto chose {decision.policy} ({decision.reason})", file=stream,
              flush=True)
    else:
        print(f"precision: {decision.policy} ({decision.reason})", file=stream, flush=True)
    if decision.warning:
        bar = "!" * 72
        print(f"{bar}\nWARNING: {decision.warning}\n{bar}", file=sys.stderr, flush=True)


def apply_policy(policy: str) -> None:
    """Set the global Keras dtype policy, and the one graph option it needs on a CPU (the
    only global side effects of this module)."""
    import tensorflow as tf

    _quiet_keras_device_check()
    tf.keras.mixed_precision.set_global_policy(policy)
    _fit_cpu_float16_fusions(tf, policy)


def _quiet_keras_device_check() -> None:
    """Keras 2 logs a three-line "Mixed precision compatibility check (mixed_float16):
    WARNING" the first time a float16 policy is set where no GPU has Tensor Cores.  The
    run's own precision line and warning (``resolve``, ``tfmp check``'s findings) say the
    same with the fix, and TensorFlow's lines came first, before a bad flag's one-line
    error.  Marked as logged; Keras 3 has no such check."""
    try:
        from keras.mixed_precision import device_compatibility_check as check
    except ImportError:
        return
    if hasattr(check, "_logged_compatibility_check"):
        check._logged_compatibility_check = True


# Set when _fit_cpu_float16_fusions turned Grappler's remapper off, so that a later policy
# gives back TensorFlow's default and never a setting of the user's own.  (One it cannot tell
# from its own: the remapper set off by the user while this holds it off is given back too.)
_remapper_off = False


def _fit_cpu_float16_fusions(tf, policy: str) -> None:
    """Grappler's remapper fuses MatMul + BiasAdd (+ activation) into one op.  On a CPU its
    float16 form is oneDNN's and, in newer TensorFlow, pathologically slow: a Dense of
    784x512 with bias and relu on a batch of 128 took 1.96 s fused against 1.8 ms unfused
    (TF 2.21, 2-core Xeon; the built-in mlp's mixed_float16 step 110 ms at batch 4, 8 ms
    without the fusion).  The fused bfloat16 and float32 forms are fast, and TF 2.9's
    float16 kernels are as slow fused as not.  So under mixed_float16 with no GPU the
    remapper is off; on a GPU, or under any other policy, TensorFlow keeps its default.
    The option applies to graphs built after it, as every run builds its own."""
    global _remapper_off
    unfuse = policy == "mixed_float16" and not tf.config.list_physical_devices("GPU")
    if unfuse != _remapper_off:
        tf.config.optimizer.set_experimental_options({"remapping": not unfuse})
        _remapper_off = unfuse


def global_policy_name() -> str:
    import tensorflow as tf

    return tf.keras.mixed_precision.global_policy().name
